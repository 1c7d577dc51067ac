"""One ptxas run per distinct PTX on the node, in the compile workers.

Triton caches a binary per config, so configs that differ only in an option their kernel ignores each run ptxas on
the same PTX. num_stages is the common case: a kernel with no loop to pipeline gives one PTX for every stage count
(FLA's chunk_bwd_kernel_dqkwg at K = V = BV = 128: six configs, two PTX). ptxas is most of a large kernel's compile
(4.2 of the 5 s of that kernel's 2-warp configs on an H200 host), and the workers of a node's ranks ran it on the
one PTX three times side by side, so the key waited for the slowest of the three.

Here the first worker of the node to reach a PTX runs ptxas while it holds a lock named by the PTX, the target and
the options (compat.route_ptxas); the others wait for that lock and take the cubin it left beside it, which is the
cubin their own ptxas would make of the same input. Nothing depends on the wait: when the holder fails, is killed
or dies, its lock drops and the next process runs ptxas itself (a failing PTX fails in each config's own run), and
where the cache dir takes no lock each runs its own.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from ..runtime.compat import route_ptxas, triton_cache_dir
from . import node_lock

DIR = "ctx_tune_ptxas"
KEEP_S = 3600.0  # what is left here serves the compiles running now; older files go (checked once per process)

# Since the last since_last(): cubins this process took from another's ptxas, and the seconds it waited for them.
_state: dict[str, float] = {"taken": 0, "waited_s": 0.0}
_pruned: set[str] = set()


def install() -> Callable[[], None]:
    """Route this process's ptxas runs through build(), in the Triton cache dir of each compile; returns the undo.
    Compile workers only (the zygote installs it before it forks them): a rank's own process is left as it was."""
    return route_ptxas(lambda key, run: build(key, os.path.join(triton_cache_dir(), DIR), run))


def build(key: str, folder: str, run: Callable[[], bytes]) -> bytes:
    """The cubin for `key`: one another process made, else run()'s, left in `folder` for the others."""
    done = os.path.join(folder, key + ".out")  # not .cubin: a count of the cache's cubins leaves it out
    if (data := _read(done)) is not None:
        return _taken(data)
    fd = node_lock.open_lock(folder, key)
    began = time.perf_counter()
    if fd is None or not node_lock.take(fd, wait=True):  # no lock here (take closed fd): as Triton does
        return run()
    _state["waited_s"] += time.perf_counter() - began
    try:
        if (data := _read(done)) is not None:  # its holder finished while this process waited
            return _taken(data)
        data = run()
        _write(done, data)
        return data
    finally:
        node_lock.release(fd)
        _prune(folder)


def since_last() -> tuple[int, float]:
    """Cubins this process took from another's ptxas since the last call, and the seconds it waited for another's
    run (a worker's per job: waiting is no compile work, so its compile time leaves it out)."""
    n, waited = int(_state["taken"]), _state["waited_s"]
    _state["taken"], _state["waited_s"] = 0, 0.0
    return n, waited


def _taken(data: bytes) -> bytes:
    _state["taken"] += 1
    return data


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data or None


def _write(path: str, data: bytes) -> None:
    partial = f"{path}.{os.getpid()}.partial"  # renamed whole: a reader sees the full cubin or none
    try:
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(partial)


def _prune(folder: str) -> None:
    if folder in _pruned:
        return
    _pruned.add(folder)
    cutoff = time.time() - KEEP_S
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.endswith((".out", ".lock")) and entry.stat().st_mtime < cutoff:
                with contextlib.suppress(OSError):
                    os.remove(entry.path)
