"""One rank of the serving tests (test_serving.py), started by torchrun; dist_worker.main runs the scenarios."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402

from tests.dist_worker import main  # noqa: E402
from tests.kernels import DEVICE, SIZED_CONFIGS, autotuner, grid  # noqa: E402
from tests.test_serving import plus_one_source  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402

SIZES = [3, 40, 100, 300]  # buckets 4, 64, 128, 512: the first two run BLOCK 16, the others BLOCK 64


def _op(**options: Any) -> tuple[Any, Any]:
    kernel = triton.autotune(configs=SIZED_CONFIGS, key=["n"])(triton.jit(plus_one_source))

    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, buckets={"n": "pow2"}, **options)
    def op(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        kernel[grid(x.numel())](x, y, x.numel())
        if options.get("is_dist"):
            dist.all_reduce(y)  # the function's own collective: every rank must be in every execution
        return y

    return op, autotuner(kernel)


def _winners(at: Any) -> dict[str, int]:
    return {str(k[0]): c.kwargs["BLOCK"] for k, c in sorted(at.cache.items()) if k[0] in (4, 64, 128, 512)}


def scenario_lockstep() -> dict[str, Any]:
    """A function with its own all_reduce, tuned ahead over a list of sizes on every rank together."""
    op, at = _op(is_dist=True)
    rows = op.tune_ahead(SIZES, lambda n: (torch.ones(n, device=DEVICE),), dim="n", timed_runs=1)
    y = op(torch.ones(70, device=DEVICE))  # bucket 128: tuned ahead, a warm call
    return {"rows": [(r.size, r.rank, r.tuned, r.executions) for r in rows], "winners": _winners(at),
            "warm_executions": op.last_call.executions, "y": y.tolist()[:3]}


def scenario_spread() -> dict[str, Any]:
    """No collectives of its own: each rank tunes its share of the sizes, into a cache of its own (separate
    disks), and every rank ends with every winner."""
    cache = Path(os.environ["TRITON_CTX_TUNE_CACHE_DIR"]) / f"rank{dist.get_rank()}"
    op, at = _op(cache_dir=str(cache))
    rows = op.tune_ahead(SIZES, lambda n: (torch.ones(n, device=DEVICE),), spread=True, timed_runs=1)
    calls = []
    for n in (3, 40, 100, 300, 37, 511):  # every bucket, on every rank: no tuning
        op(torch.ones(n, device=DEVICE))
        calls.append(op.last_call.executions)
    return {"rows": [(r.size, r.rank, r.tuned, r.executions) for r in rows], "winners": _winners(at),
            "warm_executions": calls, "entries": len(list(cache.glob("*.json")))}


if __name__ == "__main__":
    main({name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")})
