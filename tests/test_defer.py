"""A key whose configs still compile does not hold up the keys that are ready (issue 37: FLA's
chunk_bwd_kernel_dqkwg compiles for 6 s after the first execution met it, while the other keys could be
timed). Its compiles are gathered at the first step's end where every rank has finished its share, an
agreed fact (their flags ride along with the step's agreement), and meanwhile it runs a ready config, untimed.
"""
from __future__ import annotations

import pytest

from tests.defer_worker import events, tune
from tests.test_dist import run_ranks


def _deferred(log: list[dict], slow: int | None = 2, early: set[int] | None = None) -> None:
    """late_add_one_'s compiles were gathered after quick_add_two_'s, which was timed meanwhile. Before that,
    late_add_one_ timed the configs every rank had compiled (`early`; never `slow`, still compiling), and ran a
    ready config untimed where it had none; its other configs' slots came after."""
    gathered = [i for i, e in enumerate(log) if e["event"] == "precompile"]
    assert [log[i]["kernel"] for i in gathered] == ["quick_add_two_", "late_add_one_"]
    before = log[gathered[0]:gathered[1]]
    assert any(e["event"] == "slot" and e["kernel"] == "quick_add_two_" and e["timed"] for e in before)
    late = [e for e in before if e["event"] == "slot" and e["kernel"] == "late_add_one_"]
    assert late and all(e["ran"] != slow for e in late)
    assert {e["config_index"] for e in late if e["timed"]} == (early or set())
    after = [e for e in log[gathered[1]:] if e["event"] == "slot" and e["kernel"] == "late_add_one_" and e["timed"]]
    assert {e["config_index"] for e in after} == {0, 1, 2, 3} - (early or set())
    assert log[gathered[1]]["failures"] == {}


def test_a_key_still_compiling_does_not_hold_up_the_keys_that_are_ready(tmp_path):
    result = tune(str(tmp_path), compile_threads=2)  # (the order the configs compile in, on any machine)
    assert result["ok"] and result["late"] == [64] and result["quick"] == [32]
    # BLOCK 16 and 32 compiled at once: timed while BLOCK 64 compiled for 2 s (BLOCK 128 queued behind it)
    _deferred(events(tmp_path), early={0, 1})
    assert result["executions"] == 17  # 22 before configs were timed early


@pytest.mark.dist
@pytest.mark.parametrize("slow", ["every", "rank1"])
def test_ranks_gather_a_deferred_key_together(tmp_path, slow):
    """With 2 gloo ranks; "rank1": only rank 1's share is slow, so rank 0 alone would have gathered it at once."""
    rows = run_ranks(2, [f"defer_{slow}"], tmp_path, deadline_s=240, worker="defer_worker.py")[f"defer_{slow}"]
    assert all("error" not in r for r in rows), rows[0].get("traceback")
    assert all(r["ok"] and r["late"] == [64] and r["quick"] == [32] for r in rows)
    assert rows[0]["executions"] == rows[1]["executions"]
    for r in (0, 1):
        _deferred(events(tmp_path / "logs" / slow, r), slow=2 if slow == "every" else 3 if r == 1 else None)


@pytest.mark.dist
def test_a_split_screening_times_each_ranks_compiled_configs_before_the_slow_one_is_gathered(tmp_path):
    """2 gloo ranks, split screening: rank 0 screens BLOCK 16 and 64, rank 1 BLOCK 32 and 128, and BLOCK 64
    compiles for 2 s everywhere. Each rank times its compiled config while BLOCK 64 compiles (the count of such
    slots is the minimum over ranks, agreed with the step), and the rest after the gather; every rank takes the
    same steps."""
    rows = run_ranks(2, ["defer_split"], tmp_path, deadline_s=240, worker="defer_worker.py")["defer_split"]
    assert all("error" not in r for r in rows), rows[0].get("traceback")
    assert all(r["ok"] and r["late"] == [64] and r["quick"] == [32] for r in rows)
    assert rows[0]["executions"] == rows[1]["executions"] == 12
    for r in (0, 1):
        log = events(tmp_path / "logs" / "split", r)
        gathered = next(i for i, e in enumerate(log) if e["event"] == "precompile" and e["kernel"] == "late_add_one_")
        late = [(i, e) for i, e in enumerate(log) if e["event"] == "slot" and e["kernel"] == "late_add_one_"]
        before = [e for i, e in late if i < gathered]
        assert {e["config_index"] for e in before if e["timed"]} == {r}  # this rank's share, compiled at once
        assert all(e["ran"] != 2 for e in before)
        assert 2 in {e["config_index"] for i, e in late if i > gathered and e["timed"]}
