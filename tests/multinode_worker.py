"""One rank of the simulated multi-node job of test_multinode.py, started by torchrun on one "node".

Each node is its own torchrun (--nnodes 2 --node_rank i, static rendezvous on 127.0.0.1) with its own
TRITON_CACHE_DIR, TRITON_CTX_TUNE_CACHE_DIR and log dir, as separate machines would have. The rank tunes
one function with two autotuned kernels (four and three configs) on gloo, then writes what the test
compares to OUT/rank{global rank}.json: the winners, the executions and cache hits of the call, the
precompile shares of its own log, and every warning the call raised.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests.kernels import DEVICE, autotuner, costly, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402

# The last rank of the job: a slow config there must change the job's winner, so node 1's timings
# are seen to reach the reduction.
SLOW_RANK = int(os.environ.get("WORLD_SIZE", "4")) - 1


def _cfg(block: int, cost_ms: Callable[[int], float]) -> triton.Config:
    """BLOCK `block`, declaring cost_ms(global rank) in its timed span (tests/kernels.py: costly)."""
    return triton.Config({"BLOCK": block}, num_warps=4,
                         pre_hook=costly(lambda nargs: cost_ms(dist.get_rank())))


def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


# BLOCK 32 costs nothing except on the job's last rank (a node-1 rank), where it costs 50 ms: on node 0
# alone it would win; MAX over all ranks makes 64 (20 ms everywhere) the winner.
add_one = triton.autotune(configs=[_cfg(16, lambda r: 30.0), _cfg(32, lambda r: 50.0 if r == SLOW_RANK else 0.0),
                                   _cfg(64, lambda r: 20.0), _cfg(128, lambda r: 60.0)],
                          key=["n"])(triton.jit(_add_one))
# 32 wins on every rank.
double = triton.autotune(configs=[_cfg(16, lambda r: 40.0), _cfg(32, lambda r: 0.0), _cfg(64, lambda r: 20.0)],
                         key=["n"])(triton.jit(_double))
KERNELS = {"_add_one": add_one, "_double": double}


@contextual_autotune(is_dist=True, n_warmup=1, n_repeat=3, early_stop=False)
def step(x: torch.Tensor) -> torch.Tensor:
    h = x.clone()
    add_one[grid(h.numel())](h, h.numel())
    double[grid(h.numel())](h, h.numel())
    dist.all_reduce(h)  # the function's own collective, across both nodes
    return h


def tune() -> dict[str, Any]:
    x = torch.arange(96, dtype=torch.float32, device=DEVICE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = step(x)
    world = dist.get_world_size()
    winners = {name: {repr(k): c.kwargs["BLOCK"] for k, c in autotuner(kernel).cache.items()}
               for name, kernel in KERNELS.items()}
    log = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]) / f"rank-{dist.get_rank()}.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    precompiled = {e["kernel"]: e["mine"] for e in events if e["event"] == "precompile"}
    decisions = {e["kernel"]: {"winner": e["winner"], "per_rank": len(e["per_rank"])}
                 for e in events if e["event"] == "decision"}
    return {"ok": bool(torch.equal(y, (x + 1) * 2 * world)), "winners": winners,
            "executions": step.last_call.executions, "cache_hits": step.last_call.cache_hits,
            "precompiled": precompiled, "decisions": decisions,
            "cache_events": sorted({e["event"] for e in events if e["event"].startswith("cache")}),
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}


def main() -> None:
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    start = time.monotonic()
    try:
        result = tune()
    except Exception as e:  # noqa: BLE001 (an error is an outcome the test reports)
        result = {"error_type": type(e).__name__, "error": str(e), "traceback": traceback.format_exc()}
    result.update(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=int(os.environ["LOCAL_RANK"]),
                  local_world=int(os.environ["LOCAL_WORLD_SIZE"]), node=int(os.environ["GROUP_RANK"]),
                  wall_s=time.monotonic() - start)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    # Every outcome is on disk; skip the interpreter's teardown (dist_worker.py says why).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
