"""One rank of the budgeted search's multi-process tests (test_budget.py runs it through test_dist.run_ranks).

Each scenario tunes the 1200-config kernel of budget_kernels.py with a budget; every rank's costs differ a
little (rank r adds a ripple of its own), so ranks that decided alone would explore different configs.
Each returns what its rank saw: every rung's configs (from its own log), the winner, the executions.
"""
from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import budget_kernels as bk  # noqa: E402
from tests.dist_worker import main  # noqa: E402
from tests.kernels import DEVICE, autotuner  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402


def _ripple(point: dict[str, Any]) -> float:
    """Up to 0.4 ms more on this rank, different per config and per rank."""
    # (crc32, not hash(): str hashes change with every process's PYTHONHASHSEED, and so would the rungs)
    h = zlib.crc32(repr((dist.get_rank(),) + tuple(sorted(point.items()))).encode()) % 1000
    return 0.4 * h / 1000


def _tune(name: str, budget: Any, calls: int = 1) -> dict[str, Any]:
    logs = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"] + "-" + name)
    cache = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]).parent / f"cache-{name}"
    kernel = bk.make_kernel(_ripple)

    @contextual_autotune(is_dist=True, n_warmup=1, n_repeat=3, budget=budget, log_dir=str(logs),
                         cache_dir=str(cache))
    def fn(x: torch.Tensor) -> torch.Tensor:
        kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK_M"]),)](x, x.numel())
        dist.all_reduce(x)  # the function's own collective: ranks must stay in step
        return x

    bk.launched.clear()
    out = fn(torch.zeros(256, device=DEVICE))
    events = [json.loads(line) for line in (logs / f"rank-{dist.get_rank()}.jsonl").read_text().splitlines()]
    (chosen,) = autotuner(kernel).cache.values()
    return {"rungs": [e["configs"] for e in events if e["event"] == "rung"],
            "winner": bk.point_of(chosen), "cost": bk.cost_ms(bk.point_of(chosen)),
            "executions": fn.last_call.executions, "explored_here": len(set(bk.launched)),
            "cache_hits": fn.last_call.cache_hits, "out": out[:2].tolist(),
            "entry": ([json.loads(p.read_text())["tuned"].get("budget") for p in cache.glob("*.json")]
                      if dist.get_rank() == 0 else None)}


def scenario_budget_executions() -> dict[str, Any]:
    return _tune("executions", "150 executions")


def scenario_budget_seconds() -> dict[str, Any]:
    # Each rank's clock differs; rank 0's decides every rung's size, and the broadcast makes it everyone's.
    return _tune("seconds", 4.0)


def scenario_budget_continue() -> dict[str, Any]:
    first = _tune("continue", "20 compiles")
    second = _tune("continue", "45 compiles")
    return {"first": first, "second": second}


def scenario_budget_shared_waves() -> dict[str, Any]:
    """Two keys whose rungs compile in one step, each budget paying for one wave (bk.OneWave): rank 0 cuts the
    rungs to it, and the broadcast makes the cut rungs every rank's."""
    from triton_ctx_tune.engine import executor

    plain, executor.BudgetSearch = executor.BudgetSearch, bk.OneWave  # type: ignore[misc]
    try:
        return _two_keys_one_wave()
    finally:
        executor.BudgetSearch = plain  # type: ignore[misc]  (the scenarios after it search as usual)


def _two_keys_one_wave() -> dict[str, Any]:
    logs = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"] + "-shared")
    size = {"n": 0}
    kernel = bk.make_kernel(lambda p: _ripple(p) + (bk.elsewhere(p) if size["n"] == 512 else 0.0))

    @contextual_autotune(is_dist=True, n_warmup=1, n_repeat=3, budget=600.0, log_dir=str(logs), cache=False)
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for t in (x, y):
            size["n"] = t.numel()
            kernel[lambda meta, t=t: (triton.cdiv(t.numel(), meta["BLOCK_M"]),)](t, t.numel())
        dist.all_reduce(x)
        return x, y

    fn(torch.zeros(256, device=DEVICE), torch.zeros(512, device=DEVICE))
    events = [json.loads(line) for line in (logs / f"rank-{dist.get_rank()}.jsonl").read_text().splitlines()]
    rungs = [e for e in events if e["event"] == "rung"]
    return {"rungs": [(e["key"][0], e["configs"]) for e in rungs], "executions": fn.last_call.executions,
            "winners": sorted(str(bk.point_of(c)) for c in autotuner(kernel).cache.values()),
            "shared": bk.shared_waves(rungs) if dist.get_rank() == 0 else None,
            "left_out": sum(e["wave"]["left_out"] for e in rungs if e["wave"])}


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}

if __name__ == "__main__":
    main(SCENARIOS)
