"""One rank of the shipped-config test (test_shipped.py), started by torchrun.

Rank 0 searches --config-path, rank 1 --rank1-config-path (when given), so a test can show that rank 1
never reads its own. The outcome goes to OUT/rank{r}.json with the tuning-cache warnings the rank saw.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cache_worker import cached_add_one, ramp  # noqa: E402
from tests.dist_worker import init_group  # noqa: E402
from tests.kernels import chosen, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402
from triton_ctx_tune.errors import CacheWarning  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--config-path", default=None)
    parser.add_argument("--rank1-config-path", default=None)
    args = parser.parse_args()
    init_group()
    rank = dist.get_rank()
    config_path = args.rank1_config_path if rank != 0 and args.rank1_config_path else args.config_path

    @contextual_autotune(is_dist=True, cache_dir=args.cache_dir, config_path=config_path, n_warmup=1, n_repeat=2,
                         early_stop=False)
    def op(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        cached_add_one[grid(x.numel())](x, x.numel())
        return x

    x = ramp(64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = op(x)
    result = {"ok": bool(torch.equal(y, x + 1)), "executions": op.last_call.executions,
              "cache_hits": op.last_call.cache_hits,
              "blocks": {str(k[0]): v for k, v in chosen(cached_add_one).items()},
              "warnings": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]}
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
