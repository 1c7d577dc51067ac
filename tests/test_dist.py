"""Multi-process behaviour: real torchrun ranks over gloo (CPU) or NCCL (GPUs), each run with a deadline."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]
NORMAL = ["agree", "one_rank_fails", "skew_max", "skew_mean", "near_tie", "incremental", "early_stop",
          "split_table", "fast_on_one_rank", "one_rank_fails_split", "all_fail_on_rank1", "mismatch", "backward",
          "backward_checkpoint"]
DEADLINE_S = 600


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_ranks(world: int, scenarios: list[str], out: Path, deadline_s: float = DEADLINE_S,
              worker: str = "dist_worker.py", env_extra: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """Start `world` ranks on the worker; a hang fails the test at the deadline instead of stalling CI."""
    if 0 < _gpus() < world:
        pytest.skip(f"needs {world} GPUs")
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CTX_TUNE_QUIET="1", OMP_NUM_THREADS="1",
               TRITON_CTX_TUNE_LOG_DIR=str(out / "logs"), **(env_extra or {}))
    if _gpus() == 0:
        env.update(TRITON_INTERPRET="1", TRITON_CTX_TUNE_BACKEND="gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           str(ROOT / "tests" / worker), "--out", str(out), *scenarios]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ranks still running after {deadline_s} s (a hang):\n{(e.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-6000:]  # no rank aborted at exit
    results = {}
    for name in scenarios:
        results[name] = [json.loads((out / f"{name}.rank{r}.json").read_text()) for r in range(world)]
    return results


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def normal_runs(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"dist{request.param}")
    return request.param, run_ranks(request.param, NORMAL, out), out


def _no_errors(rows: list[dict]) -> None:
    for row in rows:
        assert "error" not in row, row.get("traceback")


def test_every_rank_chooses_the_same_configs_and_keeps_user_collectives_in_step(normal_runs):
    world, results, _ = normal_runs
    rows = results["agree"]
    _no_errors(rows)
    assert all(r["ok"] for r in rows)
    assert all(r["blocks"] == {"(100, 'torch.float32')": 32, "(40, 'torch.float32')": 32} for r in rows)
    assert {r["executions"] for r in rows} == {1}  # the second call ran once on every rank
    assert all(r["backend"] == ("nccl" if _gpus() else "gloo") and r["world"] == world for r in rows)


def test_config_failing_on_one_rank_is_excluded_everywhere(normal_runs):
    _, results, _ = normal_runs
    rows = results["one_rank_fails"]
    _no_errors(rows)
    assert all(r["ok"] for r in rows)
    assert all(r["blocks"] == {"(64, 'torch.float32')": 32} for r in rows)
    assert all(r["inf"] == [64] for r in rows)
    assert len({r["executions"] for r in rows}) == 1 and rows[0]["executions"] == 3 * 4 + 1


def test_rank_dependent_timings_use_the_max_consensus(normal_runs):
    _, results, _ = normal_runs
    for name, block in (("skew_max", 16), ("skew_mean", 32)):
        rows = results[name]
        _no_errors(rows)
        assert all(r["ok"] for r in rows)
        assert all(r["blocks"] == {"(64, 'torch.float32')": block} for r in rows), (name, rows)


def test_a_near_tie_is_broken_by_rank_0_and_every_rank_logs_the_same_choice(normal_runs):
    _, results, _ = normal_runs
    rows = results["near_tie"]
    _no_errors(rows)
    assert all(r["ok"] and r["blocks"] == {"(64, 'torch.float32')": 16} for r in rows), rows
    decisions = [r["decision"] for r in rows]
    assert all(d == decisions[0] for d in decisions), decisions
    d = decisions[0]
    # 32 and 16 are one tie (0.5% apart), and 16, the fastest, wins it: no incumbent on the first world size;
    # on the second, the first's cache entry (another world size: no longer applies) names 16 as the incumbent.
    assert (d["winner"], d["fastest"], d["ties"], d["tie_break"]) == (1, 1, [0, 1], None)


def test_an_added_config_is_tuned_incrementally_alike_on_every_rank(normal_runs):
    _, results, _ = normal_runs
    rows = results["incremental"]
    _no_errors(rows)
    assert all(r["ok"] and r["blocks"] == {"(64, 'torch.float32')": 8} for r in rows), rows
    # Rank 0 alone read the cache; every rank timed what it planned: the new 8 (#4), the incumbent 32 (#1)
    # and the runner-up 16 (#0), 3 timed slots each, and carried 64 and 128 over on the same scale.
    assert all(r["timed"] == {"4": 3, "1": 3, "0": 3} for r in rows), [r["timed"] for r in rows]
    assert all(r["incremental"] == rows[0]["incremental"] for r in rows)
    inc = rows[0]["incremental"]
    assert (inc["new"], inc["anchors"], inc["carried"], inc["carried_failed"], inc["removed"]) == ([4], [0, 1], [2, 3],
                                                                                                  [], 0)
    assert all(r["decision"] == rows[0]["decision"] for r in rows) and rows[0]["decision"]["winner"] == 4
    assert {r["first_executions"] for r in rows} == {4 * 4 + 1} and {r["executions"] for r in rows} == {3 * 4 + 1}


def test_early_stopping_keeps_the_consensus_survivors_on_every_rank(normal_runs):
    world, results, out = normal_runs
    rows = results["early_stop"]
    _no_errors(rows)
    assert all(r["ok"] and r["blocks"] == {"(64, 'torch.float32')": 16} for r in rows)
    # The ranks share the screening: ceil(3 / world) configs x 2 slots each; then the 2 survivors' first lockstep
    # round (a rank's first launch of a config it did not screen is its warm-up). BLOCK 64 (60 ms) is 20% behind
    # BLOCK 16 (50 ms) on its screening rank, more than RACE_BAND: it leaves, and 16 alone takes the second round
    # (n_repeat - 1 rounds in all); the final run.
    assert {r["executions"] for r in rows} == {2 * -(-3 // world) + 2 + 1 + 1}
    for r in range(world):
        events = [json.loads(line) for line in (out / "logs" / f"rank-{r}.jsonl").read_text().splitlines()]
        screen, = [e for e in events if e["event"] == "screen" and e["key"] == [64, "torch.float32"]]
        assert screen["kept"] == [0, 2]
        after = events[next(i for i, e in enumerate(events) if e is screen):]  # (other scenarios tune this key too)
        mine = [e for e in after if e.get("key") == screen["key"] and e.get("kernel") == screen["kernel"]]
        raced = [e for e in mine if e["event"] == "lockstep-round"]
        assert [(e["stay"], e["out"], e["rounds_left"]) for e in raced] == [([0], [2], 0)]
        assert 1.1 < raced[0]["luckiest"][1] / raced[0]["luckiest"][0] < 1.5
        decision = next(e for e in mine if e["event"] == "decision")
        assert decision["raced_out"] == [2] and decision["winner"] == 0
        # 64's time in the decision is its screening rank's, as the race saw it (the other ranks' one launch of it
        # was a warm-up), not a failure
        assert decision["reduced"][2] == pytest.approx(raced[0]["luckiest"][1], rel=0.05)


def test_split_screening_gives_the_lockstep_winner_in_fewer_executions(normal_runs):
    world, results, _ = normal_runs
    rows = results["split_table"]
    _no_errors(rows)
    for r in rows:
        split, lockstep = r["split"], r["lockstep"]
        assert split["ok"] and lockstep["ok"]
        assert split["blocks"] == {"(72, 'torch.float32')": 64} and lockstep["blocks"] == {"(80, 'torch.float32')": 64}
        assert split["screens"] == lockstep["screens"] == [[1, 2, 4]]  # 140, 100 and 120 ms: within 1.5x
        assert split["decision"]["split"] is True and lockstep["decision"]["split"] is False
        assert split["decision"]["readmitted"] == [] and split["decision"]["winner"] == 2
        # Screening: 8 configs x 2 slots in lockstep, ceil(8 / world) x 2 split. Then either way the survivors'
        # first round, after which 140 and 120 ms, over RACE_BAND behind 100 (on every rank, or on their screening
        # ranks), leave, and 100 alone takes the second. Then the final run.
        assert lockstep["executions"] == 8 * 2 + 3 + 1 + 1
        assert split["executions"] == -(-8 // world) * 2 + 3 + 1 + 1
        assert split["decision"]["raced_out"] == lockstep["decision"]["raced_out"] == [1, 4]
    # Screening executions at this world size against one rank's: 0.5x at 2 ranks, 0.25x at 4.
    assert -(-8 // world) * 2 / (8 * 2) <= 0.5


def test_a_config_fast_on_its_screening_rank_only_is_rejected_by_the_lockstep_timing(normal_runs):
    world, results, _ = normal_runs
    rows = results["fast_on_one_rank"]
    _no_errors(rows)
    assert all(r["ok"] and r["blocks"] == {"(88, 'torch.float32')": 32} for r in rows), rows
    for r in rows:
        assert r["screens"] == [[0]]  # rank 0 screened it at the interpreter's own time: it alone survived
        # Its lockstep time, 300 ms on the other ranks, brings back the configs within 1.5x: 100 and 110 ms.
        assert r["decision"]["readmitted"] == [1, 2] and r["decision"]["winner"] == 1
        assert r["decision"]["screened_out"] == [3]
        # Screening ceil(4 / world) x 2; #0 in lockstep, 2 slots; #1 and #2 readmitted, 2 x 2; the final run.
        assert r["executions"] == -(-4 // world) * 2 + 2 + 2 * 2 + 1


def test_a_config_failing_on_one_rank_is_excluded_after_a_split_screening(normal_runs):
    world, results, _ = normal_runs
    rows = results["one_rank_fails_split"]
    _no_errors(rows)
    assert all(r["ok"] and r["blocks"] == {"(96, 'torch.float32')": 32} for r in rows), rows
    # Rank 0 screens 16 and 64 at 2 ranks (64 works there: it survives, then fails on rank 1 in lockstep);
    # at 4 ranks rank 2 screens 64 and survives it too. Either way its time is inf on every rank.
    assert all(r["inf"] == [64] and r["decision"]["split"] is True and r["decision"]["winner"] == 1 for r in rows)
    assert len({r["executions"] for r in rows}) == 1


def test_ranks_split_the_precompilation(normal_runs):
    world, _, out = normal_runs
    for r in range(world):
        events = [json.loads(line) for line in (out / "logs" / f"rank-{r}.jsonl").read_text().splitlines()]
        # (Not the incremental scenario's kernel: 4 and 5 configs, and the carried ones are not compiled; nor
        # the split screening's, with 8 and 4 configs.)
        pre = [e for e in events if e["event"] == "precompile" and e["kernel"] != "_add_one_incr"
               and e["key"][0] not in (72, 80, 88, 96)]
        # The ranks split every config; the execution that met the key ran one of this rank's meanwhile.
        assert pre and all(e["mine"] == [i for i in range(3) if i % world == r] for e in pre)
        # (At 4 ranks rank 3 has no config of its own to compile: it ran the first config meanwhile.)
        assert all(e["ran_meanwhile"] == [] if not e["mine"] else len(e["ran_meanwhile"]) == 1
                   and e["ran_meanwhile"][0] in e["mine"] for e in pre)


def test_all_configs_failing_on_one_rank_raise_on_every_rank(normal_runs):
    _, results, _ = normal_runs
    rows = results["all_fail_on_rank1"]
    assert {r.get("error_type") for r in rows} == {"NoValidConfigError"}
    assert len({r["error"] for r in rows}) == 1  # the same message everywhere
    msg = rows[0]["error"]
    # One line for the one reason, with how many configs gave it and where.
    assert "\n  3 x OutOfResources: " in msg and msg.count("OutOfResources") == 1 and "[rank 1]\n" in msg
    assert "_add_one" in msg and "(64, 'torch.float32')" in msg


def test_mismatched_shapes_raise_the_mismatch_error_on_every_rank(normal_runs):
    world, results, _ = normal_runs
    rows = results["mismatch"]
    assert {r.get("error_type") for r in rows} == {"RankMismatchError"}
    for r in rows:
        for other in range(world):
            assert f"ranks [{other}]" in r["error"]
            assert f"key=({64 + 8 * other}, 'torch.float32')" in r["error"]


@pytest.mark.parametrize("scenario", ["backward", "backward_checkpoint"])
def test_backward_kernels_of_a_training_step_are_tuned_by_the_call_on_every_rank(normal_runs, scenario):
    world, results, out = normal_runs
    rows = results[scenario]
    _no_errors(rows)
    assert all(r["ok"] for r in rows)  # the gradient is exact: one accumulation, all-reduced
    # Alone, rank 0 would choose 32 and rank 1 16; the call's MAX consensus gives 16 everywhere.
    assert all(r["blocks"] == {"(64, 'torch.float32', 'torch.float32')": 16} for r in rows)
    assert all(r["tuned"] == ["_accumulate (64, 'torch.float32', 'torch.float32')"] for r in rows)
    assert len({r["executions"] for r in rows}) == 1 and rows[0]["executions"] == 3 * 4 + 1
    if _gpus():
        assert all(r["backward_threads"] == ["other"] for r in rows)  # autograd's device thread
    for r in range(world):
        events = [json.loads(line) for line in (out / "logs" / f"rank-{r}.jsonl").read_text().splitlines()]
        decisions = [e for e in events if e["event"] == "decision" and e["kernel"] == "_accumulate"]
        assert decisions and all(d["winner"] == 0 and len(d["per_rank"]) == world for d in decisions)


def test_per_rank_logs_hold_slots_and_reduced_decisions(normal_runs):
    world, _, out = normal_runs
    for r in range(world):
        events = [json.loads(line) for line in (out / "logs" / f"rank-{r}.jsonl").read_text().splitlines()]
        decisions = [e for e in events if e["event"] == "decision" and e["kernel"] == "_add_one"]
        assert decisions and all(len(d["per_rank"]) == world for d in decisions)
        assert all(e["rank"] == r for e in events)
        text = (out / "logs" / f"rank-{r}.log").read_text()
        assert f"[rank-{r}] === tuning scenario_agree.<locals>.op: world={world}" in text


def test_a_rank_that_never_joins_gives_a_timeout_error_not_a_hang(tmp_path):
    rows = run_ranks(2, ["straggler"], tmp_path, deadline_s=180)["straggler"]
    assert rows[0].get("error_type") == "CollectiveTimeoutError", rows[0]
    assert "did not complete within 3 s" in rows[0]["error"]
    assert rows[0]["wall_s"] < 30
    assert rows[1]["ok"] and "error" not in rows[1]


def test_a_collective_waited_for_in_slices_returns_when_a_late_peer_comes(tmp_path):
    rows = run_ranks(2, ["late_peer"], tmp_path)["late_peer"]
    assert [r["rows"] for r in rows] == [[10, 11], [10, 11]]
    assert [r["again"] for r in rows] == [[20, 21], [20, 21]]
    assert 0.5 < rows[0]["waited_s"] < 5.0, rows[0]  # rank 0 waited for rank 1 across about 12 slices


def test_example_matches_the_reference_through_launch(tmp_path):
    if not (ROOT / "examples" / "tp_mlp.py").exists():
        pytest.fail("examples/tp_mlp.py is missing")
    env = dict(os.environ, TRITON_CTX_TUNE_LOG_DIR=str(tmp_path / "logs"), NPROC="2", PYTHON=sys.executable)
    proc = subprocess.run([str(ROOT / "launch"), "examples/tp_mlp.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS" in proc.stdout
    assert (tmp_path / "logs" / "rank-1.jsonl").exists()
