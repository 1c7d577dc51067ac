"""A data-parallel training loop over real autotuned Triton GEMMs (forward and backward), three arms.

Fixed configs, re-execution tuning on the first step, online tuning: every step's loss, the final
parameters and AdamW's state agree (exactly once), and the re-execution arm is bit for bit the same
as a plain loop with its winners fixed. On the CPU, 2 gloo ranks and 6 steps under the interpreter;
on 2 GPUs, NCCL, bf16 and 40 steps.
"""
from __future__ import annotations

import pytest

from tests.test_dist import run_ranks


def _check(rows: list[dict], steps: int) -> None:
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["steps"] == steps and row["keys"] >= 2
        assert row["first_tuned"]["reexec"]["first_tuned_call"] == 1  # the first call tunes, then runs tuned
        # Online, a key is decided after up to c x (n_warmup + n_repeat) launches, one per call: no number of calls
        # is promised. What is measured: the first call that runs every key tuned (the first after the session
        # ended), the time to its end, and the extra time until then (on the CPU, often call 5 of 6).
        online = row["first_tuned"]["online"]
        if online["first_tuned_call"] is None:
            assert online["extra_s"] is None and row["online_keys"] <= row["keys"]
        else:  # the session ended: every key has its winner
            assert row["online_keys"] == row["keys"] and 2 <= online["first_tuned_call"] <= steps, row
        assert row["reexec_vs_fixed"] == row["online_vs_fixed"] == {"losses": True, "params": True, "state": True}, row
        assert row["reexec_same_as_its_winners_fixed"], row
        assert row["winners_agree"] == rows[0]["winners_agree"]  # every rank decided the same configs


@pytest.mark.dist
def test_training_loop_on_cpu_ranks(tmp_path):
    rows = run_ranks(2, ["train_loop"], tmp_path, worker="train_worker.py",
                     env_extra={"TRAIN_STEPS": "6"})["train_loop"]
    _check(rows, 6)


@pytest.mark.gpu
def test_training_loop_on_two_gpus(tmp_path):
    rows = run_ranks(2, ["train_loop"], tmp_path, worker="train_worker.py", deadline_s=600,
                     env_extra={"TRAIN_STEPS": "40"})["train_loop"]
    _check(rows, 40)
    print({k: rows[0][k] for k in ("first_step_s", "first_tuned", "total_s", "steady_ms", "max_loss_diff")})
