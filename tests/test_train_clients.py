"""benchmarks/clients/train_loop.py on 2 gloo ranks (CPU, interpreter): the toy client through the four arms
and the merge.

The toy's kernels compute the same values whatever their config, so every arm's losses and final parameters equal
the fixed arm's bit for bit; no timing is asserted (interpreter host timings say nothing about the GPU runs).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "benchmarks/clients/train_loop.py"
ARMS = ("fixed", "plain", "reexec", "online")
STEPS = 4
DEADLINE_S = 120  # per job; the four arms and the merge take about 30 s on 2 CPU cores

pytestmark = [pytest.mark.dist, pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke test")]


def _env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("NPROC", "TRITON_CTX_TUNE_DEVICE", "PYTHON",
                                                              "TRITON_CACHE_DIR")}
    return {**base, "PYTHON": sys.executable, "NPROC": "2", "TRITON_CTX_TUNE_DEVICE": "cpu"}


def _run(args: list[str], launch: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(ROOT / "launch"), SCRIPT, *args] if launch else [sys.executable, SCRIPT, *args]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S, env=_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} still running after {DEADLINE_S} s (a hang):\n{(e.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def _arm(out: Path, arm: str, steps: int) -> dict[str, Any]:
    path = out / f"train-{arm}.json"
    _run(["--arm", arm, "--clients", "toy", "--small", "--steps", str(steps), "--out", str(path)])
    data = json.loads(path.read_text())
    assert data["arm"] == arm and data["meta"]["world"] == 2 and data["meta"]["steps"] == steps
    (rec,) = data["results"]
    assert rec["client"] == "toy" and "error" not in rec, rec
    return rec


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("train_clients")
    recs = {arm: _arm(out, arm, STEPS) for arm in ARMS}
    files = [str(out / f"train-{arm}.json") for arm in ARMS]
    merged = _run(["--merge", *files, "--out", str(out / "train.json")], launch=False)
    return {"recs": recs, "stdout": merged.stdout, "merged": json.loads((out / "train.json").read_text())}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def test_every_arm_records_every_step(runs):
    for arm, rec in runs["recs"].items():
        assert len(rec["step_s"]) == len(rec["losses"]) == STEPS, arm
        assert all(t > 0 for t in rec["step_s"]) and rec["total"] == {"steps": STEPS,
                                                                      "s": pytest.approx(sum(rec["step_s"]))}
        assert rec["steady_ms"] > 0
        assert [len(r) for r in rec["params"]["per_rank"]] == [2, 2]  # x and s on each of the 2 ranks


def test_losses_and_params_equal_the_fixed_arm(runs):
    recs = runs["recs"]
    fixed = recs["fixed"]
    assert len(set(fixed["losses"])) == STEPS  # AdamW moves the parameters: every step's loss differs
    for arm in ARMS:
        assert recs[arm]["losses"] == fixed["losses"], arm
        assert recs[arm]["params"] == fixed["params"], arm  # hashes, norms and samples, every rank


def test_fixed_arm_pins_the_first_config_and_the_tuned_arms_tune(runs):
    recs = runs["recs"]
    pinned = recs["fixed"]["pinned"]
    assert sorted(k.split()[0] for k in pinned) == ["toy_mul_bwd_kernel", "toy_mul_fwd_kernel"]
    assert set(pinned.values()) == {"BLOCK=256, num_warps=2, num_stages=3"}  # the toy's configs[0]
    assert recs["fixed"]["first_tuned"]["call"] == recs["plain"]["first_tuned"]["call"] == 1
    reexec = recs["reexec"]["tuning"]
    assert reexec["executions"] > 1 and reexec["keys_tuned"] == 2, reexec
    assert recs["reexec"]["first_tuned"]["call"] == 1


def test_online_counts_its_calls(runs):
    rec = runs["recs"]["online"]
    tuning = rec["tuning"]
    # 4 configs x (3 warm-ups + 5 repeats), less what screening drops: not decided within 4 calls
    assert tuning["session_calls"] == STEPS and tuning["session_active_after_call"] == [True] * STEPS, tuning
    assert tuning["calls_until_decided"] is None
    assert rec["first_tuned"] == {"call": None, "at_s": None, "tuned_step_ms": None, "extra_s": None}


def test_merge_prints_one_table_against_fixed(runs):
    out = runs["stdout"]
    assert "=== toy:" in out and "max |loss - fixed|" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["fixed"], ["plain"],
                                                                                         ["reexec"], ["online"])}
    assert sorted(rows) == sorted(ARMS)
    for arm in ARMS:
        assert "yes / yes" in rows[arm] and "0.00e+00" in rows[arm], rows[arm]
    assert "executions (1st call)" in rows["reexec"] and f"not decided in {STEPS} calls" in rows["online"]
    # Step 1 runs tuned in the other arms: its time above the tuned step's (the median of the steps after it).
    for arm in ("fixed", "plain", "reexec"):
        times = runs["recs"][arm]["step_s"]
        extra = times[0] - _median(times[1:])
        assert runs["recs"][arm]["first_tuned"]["extra_s"] == pytest.approx(extra)
        assert rows[arm].split()[1:5] == [f"{times[0]:.2f}", "(call", "1)", f"{extra:.2f}"], rows[arm]
    assert rows["online"].split()[1:5] == ["not", "tuned", "yet", "-"], rows["online"]
    merged = {r["arm"]: r["vs_fixed"] for r in runs["merged"]["results"]}
    assert all(m["max_loss_diff"] == 0 and m["params"]["bitwise"] for m in merged.values()), merged


def test_online_decides_within_a_longer_loop(tmp_path):
    """The GPU run's path: the session ends, the time to the first tuned step and the calls are recorded."""
    steps = 40  # each call launches each key once: 4 configs x (3 + 5) = 32 calls at most, fewer with screening
    rec = _arm(tmp_path, "online", steps)
    decided = rec["tuning"]["calls_until_decided"]
    assert decided is not None and 1 <= decided < steps, rec["tuning"]
    assert rec["tuning"]["session_calls"] == decided and rec["tuning"]["keys_tuned"] == 2
    # The session ended with call `decided`: the next call is the first that runs every key tuned. The extra time
    # is each call's time above the tuned step's (the median of the last 10 calls after it), up to and with it.
    times = rec["step_s"]
    tuned = _median(times[decided + 1:][-10:])
    assert rec["first_tuned"] == {"call": decided + 1, "at_s": pytest.approx(sum(times[:decided + 1])),
                                  "tuned_step_ms": pytest.approx(1e3 * tuned),
                                  "extra_s": pytest.approx(sum(t - tuned for t in times[:decided + 1]))}
    assert rec["tuning"]["session_active_after_call"] == [True] * (decided - 1) + [False] * (steps - decided + 1)
