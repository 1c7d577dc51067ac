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
from triton_ctx_tune.engine.budget import BudgetSearch

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


def elsewhere(point: dict[str, Any]) -> float:
    """ms more for a second key whose best lies elsewhere (BLOCK_M of 128 or more, 2 stages): its local search
    walks other neighbourhoods than a key of the plain bowl's."""
    return 0.8 * (point["BLOCK_M"] <= 64) + 0.3 * (point["num_stages"] == 3)


WAVE = 8  # OneWave's compile workers
EXPLORE = 24  # ... and the configs each key explores


class OneWave(BudgetSearch):
    """A seconds budget's search as it runs beside WAVE compile workers (the interpreter has none, so the executor
    makes its searches with parallel=1), whose budget pays for one wave of new binaries at a time until EXPLORE
    configs are explored, whatever the clock says (a loaded machine's clock explored fewer rungs): two keys' rungs
    of WAVE configs each then bring more binaries than that, and decisions._share_waves cuts them. Give it a
    budget far above what the call takes, so that the clock never ends it."""

    def __post_init__(self) -> None:
        self.parallel = WAVE
        super().__post_init__()

    def explorable_now(self, elapsed_s: float) -> int:
        if self.measure != "seconds":
            return super().explorable_now(elapsed_s)
        return WAVE if len(self.launched) < EXPLORE else 0


def shared_waves(rung_events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """From rank 0's rung events, each step whose keys' rungs shared their compiles (decisions._share_waves logs
    `wave` on each, and logs them one after another): the new binaries they bring together, recomputed from their
    configs and what was launched before; the cap rank 0 logged; each rung's size; each key's slots so far."""
    launched: set[int] = set()
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(rung_events):
        wave = rung_events[i].get("wave")
        group = rung_events[i:i + (wave["rungs"] if wave else 1)]
        if wave:
            assert all(e["wave"]["binaries"] == wave["binaries"] for e in group), group
            new = set().union(*(set(e["configs"]) for e in group)) - launched
            assert len(new) == wave["binaries"], (new, wave)
            out.append({"binaries": len(new), "cap": wave["cap"], "sizes": [len(e["configs"]) for e in group],
                        "slots": [e["slots"] for e in group], "left_out": [e["wave"]["left_out"] for e in group],
                        "taken": [e["wave"]["taken"] for e in group]})
        for e in group:
            launched |= set(e["configs"])
        i += len(group)
    return out
