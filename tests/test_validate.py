"""Output validation: a config whose result differs from the reference never wins, on any rank."""
from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels import DEVICE, chosen, costly, grid
from tests.test_dist import run_ranks
from triton_ctx_tune import InvalidOptionError, contextual_autotune

FAST = dict(n_warmup=1, n_repeat=2, cache=False, early_stop=False)


@triton.jit
def _scaled_copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # An off-by-one of the kind a miscompiled or racy config produces: BLOCK=64 adds 1.
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask) * 2 + (BLOCK == 64), mask=mask)


def _cfg(block: int, cost: float) -> triton.Config:
    return triton.Config({"BLOCK": block}, num_warps=4, pre_hook=costly(lambda a: cost) if cost else None)


# BLOCK 64 is the fastest by far, and wrong.
scaled_copy = triton.autotune(configs=[_cfg(16, 30.0), _cfg(32, 20.0), _cfg(64, 0.0)], key=["n"])(_scaled_copy)


def _double(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    scaled_copy[grid(x.numel())](x, out, x.numel())
    return out


def _events(tmp_path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]


def test_without_validation_the_wrong_config_wins():
    scaled_copy.cache.clear()
    out = contextual_autotune(**FAST)(_double)(torch.ones(64, device=DEVICE))
    assert chosen(scaled_copy) == {(64, "torch.float32", "torch.float32"): 64} and float(out[0]) == 3.0


def test_a_config_whose_result_differs_is_excluded_though_it_is_fastest(tmp_path):
    scaled_copy.cache.clear()
    tuned = contextual_autotune(validate=True, **FAST)(_double)
    out = tuned(torch.ones(64, device=DEVICE))
    assert chosen(scaled_copy) == {(64, "torch.float32", "torch.float32"): 32}
    assert torch.equal(out, torch.full((64,), 2.0, device=DEVICE))
    checks = [(e["config_index"], e["ok"]) for e in _events(tmp_path) if e["event"] == "validation"]
    assert checks == [(1, True), (2, False)]  # config 0 is the reference
    bad = next(e for e in _events(tmp_path) if e["event"] == "validation" and not e["ok"])
    assert bad["mismatch_ratio"] == 1.0 and bad["max_abs"] == 1.0 and bad["reason"].startswith("validation: 100.00%")
    decision = next(e for e in _events(tmp_path) if e["event"] == "decision")
    assert decision["local_failures"]["2"].startswith("validation:")
    # Discovery (it took the first of the 9 slots), reference, 2 checks, the 8 other slots (the
    # invalid config's run a valid one: the schedule keeps its shape on every rank), the final run.
    assert tuned.last_call.executions == 1 + 1 + 2 + 8 + 1


def test_a_user_reference_and_tolerances_decide_what_differs():
    scaled_copy.cache.clear()
    # Against the user's x * 2 + 1, only BLOCK=64 is right: the first config is checked too.
    contextual_autotune(validate=True, reference=lambda x: x * 2 + 1, **FAST)(_double)(torch.ones(64, device=DEVICE))
    assert chosen(scaled_copy) == {(64, "torch.float32", "torch.float32"): 64}
    scaled_copy.cache.clear()
    # A tolerance of 1 accepts the off-by-one.
    contextual_autotune(validate=True, atol=1.0, rtol=0.0, **FAST)(_double)(torch.ones(64, device=DEVICE))
    assert chosen(scaled_copy) == {(64, "torch.float32", "torch.float32"): 64}
    scaled_copy.cache.clear()
    # So does a mismatch ratio of 100%, and a custom comparison may be stricter or looser.
    contextual_autotune(validate=True, max_mismatch_ratio=1.0, **FAST)(_double)(torch.ones(64, device=DEVICE))
    assert chosen(scaled_copy) == {(64, "torch.float32", "torch.float32"): 64}
    scaled_copy.cache.clear()
    contextual_autotune(validate=True, compare=lambda out, ref: bool((out - ref).abs().max() < 0.5),
                        **FAST)(_double)(torch.ones(64, device=DEVICE))
    assert chosen(scaled_copy) == {(64, "torch.float32", "torch.float32"): 32}


def test_validation_options_are_checked():
    with pytest.raises(InvalidOptionError, match="max_mismatch_ratio"):
        contextual_autotune(validate=True, max_mismatch_ratio=2.0)
    with pytest.raises(InvalidOptionError, match="validate"):
        contextual_autotune(reference=lambda x: x)
    with pytest.raises(InvalidOptionError, match="atol"):
        contextual_autotune(validate=True, atol=-1)


def test_two_ranks_a_config_wrong_on_rank_1_only_is_invalid_on_both(tmp_path):
    rows = run_ranks(2, ["validate_rank1"], tmp_path, worker="function_worker.py")["validate_rank1"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
    assert [row["chosen"] for row in rows] == [32, 32]  # 16 is fastest and right on rank 0, wrong on rank 1
    assert [row["out"] for row in rows] == [[2.0] * 4] * 2
    assert [row["mine"] for row in rows] == [True, False]  # each rank's own check of config 16
