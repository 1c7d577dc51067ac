"""One rank of test_defer.py's multi-rank runs, and the kernels its in-process tests share.

Two kernels in one function: `late_add_one_`, one of whose configs compiles slowly (on every rank, or on rank 1
alone), and `quick_add_two_`. Under the interpreter nothing is compiled, but the compile-only launch of
precompilation still calls the heuristics: a heuristic that sleeps there is, to the tuner, a compiler that
takes that long for that config.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests.dist_worker import main, rank  # noqa: E402
from tests.kernels import DEVICE, SLOW_MS, autotuner, block_configs, chosen, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402

SLOW_COMPILE_S = 2.0
# Which config compiles slowly, and where: BLOCK 64 (config 2) on every rank; or BLOCK 128 (config 3) on rank 1
# alone: of 2 ranks' precompile shares, rank 1's is configs 1 and 3, so its first execution goes on with config 1
# and rank 0 has nothing slow to wait for; or BLOCK 16 (config 0, the plan's first) on every rank.
SLOW = {"every": (64, lambda: True), "rank1": (128, lambda: rank() == 1), "first": (16, lambda: True)}
slow_on = "every"


def _slow_compile(args: dict[str, Any]) -> int:
    block, here = SLOW[slow_on]
    if args.get("warmup") and args["BLOCK"] == block and here():
        time.sleep(SLOW_COMPILE_S)  # the compile-only launch of that config, not its runs
    return 0


# BLOCK 64 wins once compiled (the others spend more per launch).
@triton.autotune(configs=block_configs([16, 32, 64, 128], slow={16: 2 * SLOW_MS, 32: SLOW_MS, 128: SLOW_MS}),
                 key=["n"])
@triton.heuristics({"STALL": _slow_compile})
@triton.jit
def late_add_one_(x_ptr, n, BLOCK: tl.constexpr, STALL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


# BLOCK 32 wins (16 and 64 spend more per launch).
@triton.autotune(configs=block_configs([16, 32, 64], slow={16: 2 * SLOW_MS, 64: SLOW_MS}), key=["n"])
@triton.jit
def quick_add_two_(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 2, mask=mask)


def op(log_dir: str | None = None, **options: Any) -> Any:
    @contextual_autotune(**{"n_warmup": 1, "n_repeat": 2, "early_stop": False, "cache": False, "log_dir": log_dir,
                            **options})
    def add_three(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        quick_add_two_[grid(h.numel())](h, h.numel())
        late_add_one_[grid(h.numel())](h, h.numel())
        return h

    return add_three


def tune(log_dir: str | None = None, **options: Any) -> dict[str, Any]:
    """One tuning call: its output, executions, choices, and the order in which rank 0's log saw things."""
    for k in (late_add_one_, quick_add_two_):
        autotuner(k).cache.clear()
    x = torch.arange(96, dtype=torch.float32, device=DEVICE)
    tuned = op(log_dir, **options)
    out = tuned(x)
    stats = tuned.last_call
    assert stats is not None
    return {"ok": bool(torch.equal(out, x + 3)), "executions": stats.executions,
            "late": list(chosen(late_add_one_).values()), "quick": list(chosen(quick_add_two_).values())}


def events(log_dir: Path, rank_: int = 0) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / f"rank-{rank_}.jsonl").read_text().splitlines()]


def scenario_defer_every() -> dict[str, Any]:
    global slow_on
    slow_on = "every"
    return tune(os.environ["TRITON_CTX_TUNE_LOG_DIR"] + "/every", is_dist=True)


def scenario_defer_rank1() -> dict[str, Any]:
    """Only rank 1's share is slow: rank 0 is done at the first step's end, and must not gather alone."""
    global slow_on
    slow_on = "rank1"
    return tune(os.environ["TRITON_CTX_TUNE_LOG_DIR"] + "/rank1", is_dist=True)


def scenario_defer_split() -> dict[str, Any]:
    """BLOCK 64 slow on every rank, with split screening (rank 0 screens BLOCK 16 and 64, rank 1 BLOCK 32 and 128)."""
    global slow_on
    slow_on = "every"
    return tune(os.environ["TRITON_CTX_TUNE_LOG_DIR"] + "/split", is_dist=True, early_stop=4.0)


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}

if __name__ == "__main__":
    main(SCENARIOS)
