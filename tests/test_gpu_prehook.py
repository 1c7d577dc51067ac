"""On a GPU: the persistent matmul on host TensorDescriptors whose config pre_hooks set the block shape
(benchmarks/zoo/kernels/tma_matmul.py) tunes with default options, on one GPU and on 2 NCCL ranks, and its
outputs equal plain triton.autotune's (issue 34). CPU tests of the same code path: test_prehook.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.kernels import autotuner
from tests.test_dist import run_ranks
from triton_ctx_tune import contextual_autotune

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def _tma():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("host TensorDescriptors (TMA) need sm_90 or newer")
    for where in (ROOT / "benchmarks", ROOT / "benchmarks" / "zoo" / "kernels"):
        if str(where) not in sys.path:
            sys.path.insert(0, str(where))
    import tma_matmul
    return tma_matmul


def _events(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "rank-0.jsonl").read_text().splitlines()]


def test_descriptor_matmul_tunes_with_default_options_and_matches_plain_autotune(tmp_path):
    tma = _tma()
    torch.manual_seed(0)
    a = torch.randn(2048, 1024, device="cuda", dtype=torch.float16)
    b = torch.randn(1536, 1024, device="cuda", dtype=torch.float16)
    c0 = torch.randn(2048, 1536, device="cuda", dtype=torch.float16)
    plain = tma.tma_matmul(a, b)  # plain triton.autotune: it benchmarks on its own
    plain_acc = tma.tma_matmul_acc_(c0.clone(), a, b)
    for kernel in (tma.tma_matmul_kernel, tma.tma_matmul_acc_kernel):
        autotuner(kernel).cache.clear()

    @contextual_autotune(log_dir=tmp_path, cache=False)
    def op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tma.tma_matmul(a, b), tma.tma_matmul_acc_(c, a, b)

    c = c0.clone()
    ours, ours_acc = op(a, b, c)
    reference = (a.float() @ b.float().T)
    torch.testing.assert_close(ours, plain, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(ours.float(), reference, atol=5e-2, rtol=1e-2)
    # In place: applied once, whatever the number of executions (restore_value=["C"]).
    torch.testing.assert_close(ours_acc, plain_acc, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(ours_acc.float(), c0.float() + reference, atol=5e-2, rtol=1e-2)
    events = _events(tmp_path)
    pre = [e for e in events if e["event"] == "precompile"]
    assert len(pre) == 2 and all((e["failures"], e["rejected"], e["skipped"]) == ({}, {}, {}) for e in pre)
    decisions = [e for e in events if e["event"] == "decision"]
    assert len(decisions) == 2 and all(e["local_failures"] == {} for e in decisions)
    assert not [e for e in events if e["event"] == "precompile-disagreed"]


def test_descriptor_matmul_two_nccl_ranks_agree(tmp_path):
    _tma()
    rows = run_ranks(2, ["tma_matmul"], tmp_path, worker="prehook_worker.py")["tma_matmul"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["backend"] == "nccl" and row["ok"], row
        assert row["rejected"] == [] and row["failures"] == 0
    assert rows[0]["chosen"] == rows[1]["chosen"] and len(rows[0]["chosen"]) == 2
