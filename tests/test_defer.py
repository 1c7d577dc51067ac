"""A key whose configs still compile does not hold up the keys that are ready (issue 37: FLA's
chunk_bwd_kernel_dqkwg compiles for 6 s after the first execution met it, while the other keys could be
timed). Its compiles are gathered at the first step's end where every rank has finished its share, an
agreed fact (their flags ride along with the step's agreement), and meanwhile it runs a ready config, untimed.
"""
from __future__ import annotations

import math
import time

import pytest
import torch

from tests.defer_worker import events, late_add_one_, tune
from tests.kernels import DEVICE, autotuner
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


def test_the_config_the_first_execution_ran_leads_the_plan_so_the_compiled_ones_are_timed_early(tmp_path):
    """Config 0 (the plan's first) compiles for 2 s; the first execution runs config 1, the first compiled. Taken as
    config 0's warm-up, that launch left config 0's timed slot next, and a step's end could time early none of the
    compiled configs: the MLP op's GEMM key, whose config 0 compiled among the last, waited out its grace (RESULTS.md
    section 51). Now config 1's group leads, and configs 1 to 3 are timed while config 0 compiles."""
    from tests import defer_worker

    defer_worker.slow_on = "first"
    try:
        result = tune(str(tmp_path), compile_threads=2)
    finally:
        defer_worker.slow_on = "every"
    assert result["ok"] and result["late"] == [64] and result["quick"] == [32]
    _deferred(events(tmp_path), slow=0, early={1, 2, 3})
    first = next(e for e in events(tmp_path) if e["event"] == "slot" and e["kernel"] == "late_add_one_")
    assert (first["config_index"], first["ran"], first["timed"]) == (1, 1, False)  # the stand-in is its own warm-up


def test_the_keys_met_in_a_step_share_one_least_wait():
    """A step's end waits at least EARLY_WAIT_S for the keys it met that can time their compiled configs early,
    once for all of them: the MLP op's first execution meets three keys and its end waited 50 ms for each. Here two
    keys (BLOCK 64 compiles for 2 s in each) are past that shared wait: neither waits for its slow config."""
    from triton_ctx_tune.compile import precompile
    from triton_ctx_tune.engine import schedule
    from triton_ctx_tune.engine.state import KeyState
    from triton_ctx_tune.runtime import compat
    from triton_ctx_tune.runtime.collectives import Collectives

    at = autotuner(late_add_one_)
    states = []
    for n in (64, 96):
        x = torch.zeros(n, device=DEVICE)
        kwargs = {"grid": (1,), "warmup": False}
        state = KeyState(autotuner=at, key=compat.tuning_key(at, (x, n), kwargs), configs=list(at.configs),
                         n_warmup=1, n_repeat=2, kernel=compat.kernel_name(at), early_stop=1.5)
        state.compiling = precompile.start(state, (x, n), kwargs, Collectives(False), threads=2,
                                           timeout_s=math.inf, workers=0)
        states.append(state)
    deadline = time.monotonic() + 30
    while not all(s.compiling.ready_here() for s in states) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(s.compiling.ready_here() for s in states)
    now = time.monotonic()
    for state in states:
        schedule._wait_for_share(state, grace_ends=now + 30, early_ends=now - 1)  # the shared wait is over
        assert not state.compiling.done  # its compiled configs are timed first: BLOCK 64 is still compiling
        assert state.ready_first(state.compiling.ready_here()) > 0
    # Where no compiled config could be timed early, the key waits out its grace (here: until its share ends).
    schedule._wait_for_share(states[0], grace_ends=time.monotonic() + 30, early_ends=None)
    assert states[0].compiling.done
    for state in states:
        done = state.compiling.finish(Collectives(False))
        assert sorted(done.mine) == [0, 1, 2, 3] and not done.failures


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
