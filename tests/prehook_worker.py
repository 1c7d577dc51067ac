"""One rank of test_prehook.py's multi-rank test (started by torchrun through test_dist.run_ranks)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.dist_worker import main, rank  # noqa: E402
from tests.kernels import DEVICE  # noqa: E402
from tests.prehook_kernels import desc_double_rejected, doubling_op  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402


def scenario_precompile_rejects() -> dict[str, Any]:
    """Config 1 (BLOCK 32) is compiled by local rank 1 alone (split precompile) and rejected there; every
    rank must still time it, and choose it."""
    op, executions = doubling_op(desc_double_rejected, is_dist=True)
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    y = op(x)
    log = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]) / f"rank-{rank()}.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (pre,) = [e for e in events if e["event"] == "precompile"]
    (decision,) = [e for e in events if e["event"] == "decision"]
    return {"ok": bool(torch.equal(y, 2 * x)), "chosen": {repr(k): c.kwargs["BLOCK"]
                                                          for k, c in desc_double_rejected.cache.items()},
            "mine": pre["mine"], "rejected": sorted(pre["rejected"]), "failures": pre["failures"],
            "disagreed": [e["config_index"] for e in events if e["event"] == "precompile-disagreed"],
            "local_failures": decision["local_failures"], "executions": executions[0]}


def scenario_tma_matmul() -> dict[str, Any]:
    """The persistent TMA-descriptor matmul (benchmarks/zoo) at 2 NCCL ranks, default options."""
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root / "benchmarks"), str(root / "benchmarks" / "zoo" / "kernels")]
    import tma_matmul as tma

    torch.manual_seed(rank())
    a = torch.randn(2048, 1024, device=DEVICE, dtype=torch.float16)
    b = torch.randn(1536, 1024, device=DEVICE, dtype=torch.float16)
    c0 = torch.randn(2048, 1536, device=DEVICE, dtype=torch.float16)

    @contextual_autotune(is_dist=True, cache=False)
    def op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tma.tma_matmul(a, b), tma.tma_matmul_acc_(c, a, b)

    out, acc = op(a, b, c0.clone())
    reference = a.float() @ b.float().T
    ok = bool(torch.allclose(out.float(), reference, atol=5e-2, rtol=1e-2)
              and torch.allclose(acc.float(), c0.float() + reference, atol=5e-2, rtol=1e-2))
    log = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]) / f"rank-{rank()}.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    pre = [e for e in events if e["event"] == "precompile"]
    chosen = {f"{name}{key!r}": repr(sorted(c.all_kwargs().items()))
              for name, k in (("matmul", tma.tma_matmul_kernel), ("acc", tma.tma_matmul_acc_kernel))
              for key, c in k.cache.items()}
    return {"ok": ok, "chosen": chosen,
            "rejected": sorted(r for e in pre for r in e["rejected"]),
            "failures": sum(len(e["failures"]) for e in pre)}


if __name__ == "__main__":
    main({"precompile_rejects": scenario_precompile_rejects, "tma_matmul": scenario_tma_matmul})
