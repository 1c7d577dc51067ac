"""The slot schedule and the decision rule, without any kernel."""
from __future__ import annotations

import math
import random

import pytest
import triton

from triton_ctx_tune.engine.state import KeyState, Slot, pick_winner, summarize


def _state(n_configs: int = 3, n_warmup: int = 1, n_repeat: int = 2) -> KeyState:
    configs = [triton.Config({"BLOCK": 16 << i}) for i in range(n_configs)]
    return KeyState(autotuner=None, key=(1,), configs=configs, n_warmup=n_warmup, n_repeat=n_repeat,  # type: ignore[arg-type]
                    kernel="k")


def test_slots_walk_each_config_warmup_then_timed():
    s = _state()
    slots = [s.take_slot() for _ in range(s.total_slots)]
    assert slots == [Slot(c, i, i >= 1) for c in range(3) for i in range(3)]
    assert s.exhausted and s.take_slot() is None


def test_fallback_is_the_lowest_working_config_never_a_failed_one():
    s = _state()
    assert s.fallback() is None
    s.works.update({2, 1})
    assert s.fallback() == 1
    s.fail(1, "OutOfResources")
    assert s.fallback() == 2 and s.failures == {1: "OutOfResources"}


def test_winner_ignores_inf_and_nan_and_breaks_ties_by_index():
    assert pick_winner([3.0, 1.0, 1.0]) == 1
    assert pick_winner([math.nan, 2.0, math.inf]) == 1
    assert pick_winner([math.inf, math.nan]) is None


def test_summaries():
    assert summarize([1.0, 3.0, 2.0], "median")[0] == 2.0
    assert summarize([1.0, 3.0, 2.0], "mean")[0] == 2.0
    assert summarize([1.0, 3.0, 2.0], "min")[0] == 1.0
    s = _state()
    s.samples[0] = [lambda: 1.0, lambda: 3.0]
    s.fail(2, "x")
    stats = s.local_stats("median")
    assert stats[0][0] == 2.0 and stats[1] == (math.inf,) * 3 and stats[2] == (math.inf,) * 3


def test_summaries_match_numpy_on_random_samples():
    # Plain Python since numpy's first quantile cost 50 ms in a decision: the numbers must not move.
    import numpy as np
    rng = random.Random(7)
    for n in range(1, 40):
        values = [rng.lognormvariate(0, 0.3) for _ in range(n)]
        arr = np.asarray(values)
        q20, q80 = np.quantile(arr, [0.2, 0.8])
        for stat, ref in (("median", np.median(arr)), ("mean", np.mean(arr)), ("min", np.min(arr))):
            got = summarize(values, stat)
            assert got == pytest.approx((ref, q20, q80), rel=1e-12), (n, stat)
    # Between two infinities the percentile is infinite, not NaN (inf - inf).
    assert summarize([2.0, 3.0, math.inf, math.inf], "min") == (2.0, pytest.approx(2.6), math.inf)


def test_screening_then_interleaved_measurement_of_survivors():
    s = KeyState(autotuner=None, key=(1,), configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64)],  # type: ignore[arg-type]
                 n_warmup=2, n_repeat=3, kernel="k", early_stop=1.5)
    assert s.screening and [s.take_slot() for _ in range(6)] == [
        Slot(0, 0, False), Slot(0, 1, True), Slot(1, 0, False), Slot(1, 1, True), Slot(2, 0, False), Slot(2, 1, True)]
    assert s.exhausted
    s.keep([0, 2])
    assert not s.screening and s.dropped == {1}
    # Not precompiled: one more warm-up each, then the first of the 2 remaining timed rounds, round-robin. Each
    # later round is planned at the last one's end, for the survivors that stay (decisions.py races them).
    assert [s.take_slot() for _ in range(5)] == [
        Slot(0, 2, False), Slot(2, 2, False), Slot(0, 3, True), Slot(2, 3, True), None]
    assert s.exhausted and s.lockstep == [0, 2] and s.lockstep_left == 1
    s.next_lockstep_round([0])  # 64 leaves; 16 takes the last round alone
    assert [s.take_slot() for _ in range(2)] == [Slot(0, 4, True), None]
    assert s.raced_out == s.lockstep_out == {2} and s.lockstep == [0] and s.lockstep_left == 0


def test_configs_the_ranks_agree_to_leave_out_lose_their_slots_not_yet_run():
    """At the step end that gathers a key's compiles, its agreed failures and same-binary configs leave the plan (they
    would only be skipped), where every rank holds the same plan; a split screening's shares keep theirs."""
    s = KeyState(autotuner=None, key=(1,), configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64, 128)],  # type: ignore[arg-type]
                 n_warmup=1, n_repeat=3, kernel="k", early_stop=1.5)
    assert [s.take_slot() for _ in range(3)] == [Slot(0, 0, False), Slot(0, 1, True), Slot(1, 0, False)]
    s.unplan([1, 3])
    assert [s.take_slot() for _ in range(3)] == [Slot(2, 0, False), Slot(2, 1, True), None]  # 1's warm-up had run
    split = KeyState(autotuner=None, key=(1,), configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64, 128)],  # type: ignore[arg-type]
                     n_warmup=1, n_repeat=3, kernel="k", early_stop=1.5, share=(0, 2))
    before = list(split.plan)
    split.unplan([2])
    assert split.split and split.plan == before


def test_an_anchor_counts_its_screening_sample_as_its_first_survivor_sample():
    """Incremental re-tuning (store/incremental.py): #1 is an anchor, #2 carried, #0 and #3 new."""
    s = KeyState(autotuner=None, key=(1,), configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64, 128)],  # type: ignore[arg-type]
                 n_warmup=2, n_repeat=3, kernel="k", early_stop=1.5, carried={2}, anchors={1})
    # Screened alike: the anchor's sample puts carried and new configs on one scale at the screening decision.
    assert [s.take_slot() for _ in range(6)] == [
        Slot(0, 0, False), Slot(0, 1, True), Slot(1, 0, False), Slot(1, 1, True), Slot(3, 0, False), Slot(3, 1, True)]
    assert s.exhausted
    s.keep([0, 1, 2, 3])
    # A warm-up each, round-robin; one timed round with the anchor; then the new configs' last round alone:
    # 3 samples for a new config (its screening sample and a survivor's 2), 2 for the anchor.
    assert [s.take_slot() for _ in range(8)] == [
        Slot(0, 2, False), Slot(1, 2, False), Slot(3, 2, False), Slot(0, 3, True), Slot(1, 3, True), Slot(3, 3, True),
        Slot(0, 4, True), Slot(3, 4, True)]
    assert s.exhausted
