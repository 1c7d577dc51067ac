"""One rank of a persistent-cache test, started by torchrun (see test_cache.py).

Rank 0 uses --cache-dir; rank 1 uses --rank1-cache-dir when given, so a test can give it a
cache of its own (empty, or on "another node"). Each scenario's outcome goes to
OUT/SCENARIO.rank{r}.json, with the tuning-cache warnings the rank saw.
"""
from __future__ import annotations

import argparse
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

from tests.dist_worker import init_group  # noqa: E402
from tests.kernels import DEVICE, chosen, costly, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402
from triton_ctx_tune.errors import CacheWarning  # noqa: E402

FAST = dict(n_warmup=1, n_repeat=2, early_stop=False)  # 3 slots per config: 9 tuning executions, then the final one


def _cached_add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _configs() -> list[triton.Config]:
    # BLOCK 32 wins by declared costs that decide on every machine; the same list on every import.
    delays = {16: 30.0, 32: 0.0, 64: 60.0}
    return [triton.Config({"BLOCK": b}, num_warps=4, pre_hook=costly(lambda a, d=d: d)) for b, d in delays.items()]


cached_add_one = triton.autotune(configs=_configs(), key=["n"])(triton.jit(_cached_add_one))


def make_op(cache_dir: str | None, is_dist: bool = True, **opts: Any) -> Callable[..., Any]:
    """Two keys of one kernel, so one entry can be damaged while the other one hits."""
    calls = {"n": 0}

    @contextual_autotune(is_dist=is_dist, cache_dir=cache_dir, **FAST, **opts)
    def op(x: torch.Tensor, y: torch.Tensor):
        calls["n"] += 1
        x, y = x.clone(), y.clone()
        cached_add_one[grid(x.numel())](x, x.numel())
        cached_add_one[grid(y.numel())](y, y.numel())
        return x, y

    op.calls = calls  # type: ignore[attr-defined]
    return op


def ramp(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device=DEVICE)


def _cache_dir(args: argparse.Namespace) -> str:
    return args.rank1_cache_dir if dist.get_rank() != 0 and args.rank1_cache_dir else args.cache_dir


def scenario_tune(args: argparse.Namespace) -> dict[str, Any]:
    op = make_op(_cache_dir(args))
    x, y = ramp(64), ramp(40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gx, gy = op(x, y)
    return {"ok": bool(torch.equal(gx, x + 1) and torch.equal(gy, y + 1)),
            "blocks": {repr(k): v for k, v in chosen(cached_add_one).items()},
            "executions": op.last_call.executions, "body_runs": op.calls["n"], "cache_hits": op.last_call.cache_hits,
            "tuned": len(op.last_call.tuned),
            "warnings": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]}


def scenario_mismatch(args: argparse.Namespace) -> dict[str, Any]:
    op = make_op(_cache_dir(args))
    op(ramp(24 + 8 * dist.get_rank()), ramp(40))  # rank-dependent shape: ranks look up different entries
    return {"ok": False}


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--rank1-cache-dir", default=None)
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    init_group()
    out = Path(args.out)
    for name in args.scenarios:
        start = time.monotonic()
        try:
            result = SCENARIOS[name](args)
        except Exception as e:  # noqa: BLE001 (the outcome under test)
            result = {"error_type": type(e).__name__, "error": str(e), "traceback": traceback.format_exc()}
        result.update(rank=dist.get_rank(), world=dist.get_world_size(), wall_s=time.monotonic() - start,
                      pid=os.getpid())
        (out / f"{name}.rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
