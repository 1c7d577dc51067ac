"""Per-launch confirmations replayed from recorded rank logs (benchmarks/replay_confirm.py): the MLP op on 2 H200s
before a confirmation kept its candidates' samples (RESULTS.md section 45, call 1, quality run 2)."""
from __future__ import annotations

import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from replay_confirm import calls, replay  # noqa: E402

RECORDED = ROOT / "benchmarks" / "results" / "2026-11-28g-2xH200" / "call1-mlp2-ctx_logs.tgz"


def test_the_rounds_alone_chose_gelus_1024_and_all_samples_choose_2048(tmp_path: Path) -> None:
    with tarfile.open(RECORDED) as archive:
        archive.extractall(tmp_path, filter="data")
    (call,) = calls(tmp_path / "ctx_logs" / "2ranks-h200")
    assert sorted(call) == [0, 1]
    rows = {(r["kernel"], tuple(r["key"])): r for r in replay(call)}
    gelu = rows[("gelu_inplace_kernel", (29360128, "torch.bfloat16"))]
    # The tuner then decided on the rounds alone and took BLOCK 1024 (#2); the in-op oracle put BLOCK 2048 (#4)
    # 2.6% ahead. All of the candidates' samples put #4 first.
    assert gelu["candidates"] == [2, 4, 5]
    assert (gelu["tuner"], gelu["rounds"], gelu["all"]) == (2, 2, 4)
    # Both GEMM keys confirmed #13 against #14 and keep it either way.
    gemms = [r for (kernel, _), r in rows.items() if kernel == "matmul_kernel"]
    assert len(gemms) == 2 and all((r["tuner"], r["rounds"], r["all"]) == (13, 13, 13) for r in gemms)
