"""A kernel with a 1200-config space for the budgeted search's tests (test_budget.py, budget_worker.py).

The configs differ in tile sizes, group size, warps and stages; only BLOCK_M changes what the kernel
does. Each config's pre_hook declares a cost (tests/kernels.py: spend) that is a smooth bowl over the
log2 tile sizes with its floor at one known config (BEST), so the best config is known and the cost
of any other is known relative to it.
"""
from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from tests.kernels import costly

SPACE = {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128],
         "GROUP_M": [1, 4, 8], "num_warps": [4, 8], "num_stages": [2, 3]}
BEST = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
BASE_MS = 1.0

# Every config launched in this process, in order (warm-ups included): what the search explored.
launched: list[str] = []
_lock = threading.Lock()


def cost_ms(point: dict[str, Any]) -> float:
    """The declared cost of a config: BASE_MS at BEST, growing with each log2 step away from it."""
    tiles = sum((math.log2(point[k]) - math.log2(BEST[k])) ** 2 for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    return BASE_MS * (1 + 0.3 * tiles + 0.1 * abs(point["GROUP_M"] - BEST["GROUP_M"]) / 4
                      + 0.2 * (point["num_warps"] != BEST["num_warps"])
                      + 0.15 * (point["num_stages"] != BEST["num_stages"]))


def _hook(point: dict[str, Any], extra: Callable[[dict[str, Any]], float] | None = None) -> Any:
    spend = costly(lambda nargs: cost_ms(point) + (extra(point) if extra is not None else 0.0))
    name = ",".join(f"{k}={v}" for k, v in point.items())

    def hook(nargs: dict[str, Any]) -> None:
        with _lock:
            launched.append(name)
        spend(nargs)
    return hook


def configs(extra: Callable[[dict[str, Any]], float] | None = None) -> list[triton.Config]:
    """The space; `extra(point)`: ms more for a config (a rank-dependent cost, say)."""
    out = []
    for values in itertools.product(*SPACE.values()):
        point = dict(zip(SPACE, values))
        meta = {k: point[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
        out.append(triton.Config(meta, num_warps=point["num_warps"], num_stages=point["num_stages"],
                                 pre_hook=_hook(point, extra)))
    return out


def point_of(config: triton.Config) -> dict[str, Any]:
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


@triton.jit
def _tiled_add_one(x_ptr, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def make_kernel(extra: Callable[[dict[str, Any]], float] | None = None) -> Any:
    """A fresh autotuned kernel over the whole space (its own Autotuner.cache)."""
    return triton.autotune(configs=configs(extra), key=["n"])(_tiled_add_one)
