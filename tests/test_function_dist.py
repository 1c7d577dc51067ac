"""Function-level spaces over real torchrun ranks (gloo on the CPU, NCCL on GPUs), each run with a deadline."""
from __future__ import annotations

import pytest

from tests.kernels import DEVICE
from tests.test_dist import run_ranks

pytestmark = pytest.mark.dist


def _same_on_every_rank(rows: list[dict], *fields: str) -> None:
    for row in rows:
        assert "error" not in row, row.get("traceback")
    for f in fields:
        assert all(row[f] == rows[0][f] for row in rows), [row[f] for row in rows]


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_takes_the_max_consensus_point_and_a_point_failing_on_one_rank_is_skipped(world, tmp_path):
    results = run_ranks(world, ["consensus", "fails_on_rank1", "wrong_on_rank1"], tmp_path, worker="function_worker.py")
    rows = results["consensus"]
    _same_on_every_rank(rows, "point", "executions", "kernels", "out")
    # Alone, rank 0 would take chunks=1 and rank 1 chunks=2; their MAX makes chunks=4 the fastest.
    assert rows[0]["point"] == {"chunks": 4}
    assert sorted(k[3] for k in rows[0]["kernels"]) == [0, 1, 2]  # each point's key was tuned in its context
    assert rows[0]["out"] == [2.0 * world] * 4  # doubled, then summed over the ranks
    # Per point: its kernel's 9 slots (9, 5 and 3 executions at 1, 2 and 4 launches each), then an
    # end-to-end warm-up step and 2 timed steps of 3 back-to-back runs (e2e_runs=3); the final run.
    calls = rows[0]["calls"]
    assert [calls.count(c) for c in (1, 2, 4)] == [9 + 1 + 2 * 3, 5 + 1 + 2 * 3, 3 + 1 + 2 * 3 + 1]
    assert rows[0]["executions"] == len(calls)
    rows = results["fails_on_rank1"]
    _same_on_every_rank(rows, "point", "executions", "out")
    assert rows[0]["point"] == {"chunks": 4} and rows[0]["out"] == [2.0] * 4
    # The failing point ran once on every rank; then no rank ran it again.
    assert all(row["calls"].count(2) == 1 for row in rows)
    # validate=True: chunks=2's result is wrong on rank 1 alone; every rank drops it after one run.
    rows = results["wrong_on_rank1"]
    _same_on_every_rank(rows, "point", "executions", "out")
    assert rows[0]["point"] == {"chunks": 4} and rows[0]["out"] == [2.0] * 4
    assert all(row["calls"].count(2) == 1 for row in rows)


def test_a_second_process_serves_the_point_and_its_kernels_from_the_cache(tmp_path):
    env = {"TRITON_CTX_TUNE_CACHE_DIR": str(tmp_path / "cache")}
    first = run_ranks(2, ["cached"], tmp_path / "a", worker="function_worker.py", env_extra=env)["cached"]
    _same_on_every_rank(first, "point", "executions")
    assert first[0]["point"] == {"chunks": 2} and first[0]["executions"] > 1
    second = run_ranks(2, ["cached"], tmp_path / "b", worker="function_worker.py", env_extra=env)["cached"]
    _same_on_every_rank(second, "point", "executions", "out")
    assert second[0]["point"] == {"chunks": 2} and second[0]["executions"] == 1 and second[0]["calls"] == [2]
    assert second[0]["cache_hits"] == 1 and second[0]["kernels"] == []
    assert second[0]["out"] == first[0]["out"] == [4.0] * 4  # doubled, then summed over 2 ranks


def test_a_config_slow_per_launch_on_one_rank_only_is_still_confirmed_end_to_end_and_wins(tmp_path):
    """function_worker.luckiest_rank: BLOCK 16 is 1.5x the fastest per launch on rank 0 (it overlapped the gather
    there) and the fastest on rank 1, and the best call on both; it is among the end-to-end candidates and wins."""
    rows = run_ranks(2, ["luckiest_rank"], tmp_path, worker="function_worker.py")["luckiest_rank"]
    _same_on_every_rank(rows, "point", "executions", "kernels", "out")
    assert rows[0]["point"] == {"extra": 0.0}
    (kernel,) = [k for k in rows[0]["kernels"] if k[3] == 0]
    assert kernel[2].startswith("BLOCK=16")
    assert rows[0]["confirmed"] == [[0, 1, 2]] == rows[1]["confirmed"]


def test_an_end_to_end_race_drops_candidates_on_the_times_every_rank_agreed_on(tmp_path):
    """function_worker.race_across_ranks: over both ranks BLOCK 8 (#2) is twice behind and leaves after the first
    round; 32 (#0) and 16 (#1) stay for both later rounds and 16 wins. Raced on its own times, rank 0 would have
    dropped 16 and rank 1 would have dropped 32: every rank follows the rounds of the reduced times instead."""
    rows = run_ranks(2, ["race_across_ranks"], tmp_path, worker="function_worker.py")["race_across_ranks"]
    _same_on_every_rank(rows, "executions", "out", "candidates", "rounds", "winner", "raced_out")
    assert rows[0]["end_to_end"] is True and rows[0]["candidates"] == [[0, 1, 2]]
    assert rows[0]["rounds"] == [[[0, 1], [2], 1], [[0, 1], [], 0]]
    assert rows[0]["winner"] == 1 and rows[0]["raced_out"] == [2]
    assert rows[0]["out"] == [2.0] * 4  # the input doubled: each execution works on its own copy
    from triton_ctx_tune.options import TuneOptions
    runs = TuneOptions().resolved_e2e_runs("host" if DEVICE == "cpu" else "cuda-events")
    # 3 configs x (a warm-up and 3 timed slots), the race's rounds of 3, 2 and 2 candidates, the final run.
    assert rows[0]["executions"] == 3 * 4 + (3 + 2 + 2) * runs + 1


@pytest.mark.parametrize("world", [2, 4])
def test_a_call_budget_ends_every_ranks_tuning_at_the_same_step(world, tmp_path):
    """function_worker.call_budget: with 12 executions the call stops after the 12th and runs once more; with 0.4 s,
    rank 0's clock decides (rank 1's, 40 ms a step ahead, would stop earlier): every rank stops at the same step,
    with the same point and kernels."""
    rows = run_ranks(world, ["call_budget"], tmp_path, worker="function_worker.py")["call_budget"]
    for measure in ("executions", "seconds"):
        outcomes = [row[measure] for row in rows]
        _same_on_every_rank(outcomes, "point", "executions", "kernels", "out", "spent_at")
        assert len(outcomes[0]["spent_at"]) == 1 and outcomes[0]["executions"] == outcomes[0]["spent_at"][0] + 1
    assert rows[0]["executions"]["spent_at"] == [12]
    assert rows[0]["executions"]["point"] in ({"chunks": 1}, {"chunks": 2}, {"chunks": 4})
