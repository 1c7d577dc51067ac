"""One rank of the clean-exit check (test_exit.py), started by torchrun: two tuned calls, then a normal exit.

A function with one autotuned kernel (2 configs) and the user's own all_reduce is decorated after
init_process_group (as a script that builds its tuned function in main() does) and called twice.
The rank writes what was chosen to OUT/exit.rank{r}.json, destroys the group and leaves through
sys.exit(0), so the interpreter's whole teardown runs (dist_worker.py skips it with os._exit).

Anything that outlives the tuner there can abort the rank ("terminate called without an active
exception", exit -6), but only in some runs. So the rank also writes OUT/exit_threads.rank{r}.json
from its last atexit hook: the gloo threads still running after destroy_process_group() and the
tuner's threads and child processes (the compile workers' zygote, on a GPU) still running when the
interpreter is about to finalize, all of which must be none.
"""
from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

_seen: dict[str, Any] = {}


def _native_threads() -> list[str] | None:
    """The names of this process's threads (Linux), None where /proc does not list them."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    names = []
    for tid in tasks:
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:
            pass  # ended meanwhile
    return names


def _children() -> list[int] | None:
    """The pids of this process's live child processes (Linux), None where /proc does not list them."""
    try:
        tasks = os.listdir("/proc/self/task")
        return [int(pid) for tid in tasks for pid in Path(f"/proc/self/task/{tid}/children").read_text().split()]
    except OSError:
        return None


def _at_exit() -> None:
    # Registered before the package is imported, so it runs after the package's own atexit hooks.
    if "out" not in _seen:
        return
    tuner_threads = [t.name for t in threading.enumerate() if t.name.startswith("ctx-tune")]
    native = _native_threads()
    _seen.update(tuner_threads_at_exit=tuner_threads, children_at_exit=_children(),
                 gloo_threads_at_exit=None if native is None else [n for n in native if "gloo" in n])
    Path(_seen["out"], f"exit_threads.rank{_seen['rank']}.json").write_text(json.dumps(_seen))


atexit.register(_at_exit)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests.kernels import DEVICE, block_configs, chosen, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402


def _add_one_exit(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


# BLOCK 32 wins: 16 declares a cost (tests/kernels.py) that no timing noise can hide.
add_one = triton.autotune(configs=block_configs([16, 32], slow={16: 15.0}), key=["n"])(triton.jit(_add_one_exit))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    backend = os.environ.get("TRITON_CTX_TUNE_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    dist.barrier()

    @contextual_autotune(is_dist=True, cache=False, n_warmup=1, n_repeat=3, early_stop=False)
    def op(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        add_one[grid(h.numel())](h, h.numel())
        dist.all_reduce(h)
        return h

    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    y = op(x)
    first = op.last_call  # the tuning call (the second is warm)
    again = op(x)
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = (x + 1) * world
    result = {"rank": rank, "world": world, "backend": backend,
              "ok": bool(torch.equal(y, expected) and torch.equal(again, expected)),
              "blocks": {repr(k): v for k, v in chosen(add_one).items()},
              "tuned": [f"{t.kernel} {t.key!r}" for t in first.tuned],
              "executions": [first.executions, op.last_call.executions]}
    (Path(args.out) / f"exit.rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    native = _native_threads()
    _seen.update(out=args.out, rank=rank,
                 gloo_threads_after_destroy=None if native is None else [n for n in native if "gloo" in n])
    sys.exit(0)


if __name__ == "__main__":
    main()
