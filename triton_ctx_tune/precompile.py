"""Compile every config of a new (kernel, key) before its first slot, in parallel.

Triton compiles one config per launch, inside the re-executed function: on a cold cache that
is over 90% of tuning time, and compile stalls between timed slots let the GPU clocks drop.
Here a thread pool compiles all configs at once through Triton's own compile-only path
(`run(warmup=True)`), so binaries land in Triton's cache and the slots' launches hit it. Ranks
on one node split the configs (config i goes to local rank i % local_world) and meet in one
bounded all-gather, after which each loads the others' binaries from the shared Triton cache.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from .collectives import Collectives
from .compat import compile_only, config_failure_reason, load_binary
from .state import KeyState


@dataclass
class Compiled:
    mine: list[int]  # config indices this rank compiled
    seconds: float
    failures: dict[int, str] = field(default_factory=dict)  # config index -> reason (any rank's)


def local_share(n_configs: int, comm: Collectives) -> list[int]:
    """The configs this rank compiles: all of them alone, its round-robin share among local ranks."""
    if not comm.active:
        return list(range(n_configs))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return [i for i in range(n_configs) if i % local_world == local_rank]


def default_threads() -> int:
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(32, (os.cpu_count() or 1) // max(local_world, 1)))


def _compile(state: KeyState, indices: list[int], args: tuple, kwargs: dict[str, Any],
             threads: int) -> tuple[dict[int, Any], dict[int, str]]:
    device = torch.cuda.current_device() if torch.cuda.is_available() else None

    def one(i: int) -> tuple[int, Any, str | None]:
        if device is not None:
            torch.cuda.set_device(device)  # Triton picks the target from this thread's current device
        try:
            return i, compile_only(state.autotuner, [state.configs[i]], args, kwargs)[0], None
        except Exception as e:
            reason = config_failure_reason(e)
            if reason is None:
                raise
            return i, None, reason

    if threads > 1 and len(indices) > 1:
        with ThreadPoolExecutor(min(threads, len(indices)), thread_name_prefix="ctx-tune-compile") as pool:
            results = list(pool.map(one, indices))
    else:
        results = [one(i) for i in indices]
    kernels = {i: k for i, k, r in results if r is None}
    failures = {i: r for i, _, r in results if r is not None}
    for i, kernel in kernels.items():  # loading touches the CUDA context: stay on this thread
        try:
            load_binary(kernel)
        except Exception as e:
            reason = config_failure_reason(e)
            if reason is None:
                raise
            failures[i] = reason
    return kernels, failures


def precompile(state: KeyState, args: tuple, kwargs: dict[str, Any], comm: Collectives, threads: int) -> Compiled:
    start = time.perf_counter()
    n = len(state.configs)
    mine = local_share(n, comm)
    _, failures = _compile(state, mine, args, kwargs, threads)
    if comm.active:
        flags = torch.zeros(n, dtype=torch.int64)
        for i in failures:
            flags[i] = 1
        failed_anywhere = comm.all_gather(flags, "share precompile results").amax(0)
        if bool(failed_anywhere.any()):
            reasons = comm.all_gather_bytes("\n".join(f"{i}\t{r}" for i, r in failures.items()).encode(),
                                            "share compile failures")
            for rank, blob in enumerate(reasons):
                for line in filter(None, blob.decode().split("\n")):
                    i, reason = line.split("\t", 1)
                    failures.setdefault(int(i), f"rank {rank}: {reason}")
        # The others' binaries are in the shared Triton cache now: loading them here is cheap and
        # keeps the load out of the first slot (compiled here instead when caches are not shared).
        rest = [i for i in range(n) if i not in mine and i not in failures]
        _, more = _compile(state, rest, args, kwargs, threads)
        failures.update(more)
    return Compiled(mine, time.perf_counter() - start, failures)
