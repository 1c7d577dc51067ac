"""The survivors' race replayed on the committed logs (benchmarks/replay_lockstep_race.py): the survivors it would
have dropped after their first round, and not one config that won or came within 1% of winning."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from replay_lockstep_race import committed, replay  # noqa: E402
from triton_ctx_tune.engine.state import RACE_BAND  # noqa: E402


def test_the_race_on_committed_logs_drops_two_fifths_of_the_survivors_and_none_that_mattered():
    r = replay(committed(until="2026-11-28i"))  # the runs before the race (later ones raced already)
    # Logs of sessions on 1 and 2 H200s: the MLP op's GEMM and GELU keys, split over 2 ranks or screened by one.
    assert (r.keys, r.split, r.survivors, r.out, len(r.mattered)) == (159, 128, 1230, 518, 302)
    assert r.lost == []
    assert round(max(r.mattered), 3) == 1.064 < 1 + RACE_BAND


def test_the_race_on_its_own_runs_keeps_every_config_that_mattered():
    # Section 49's runs on one H200: the MLP op cold and its quality table, and the FLA step, each beside the old
    # rule's. Their first two samples say what the race saw. Judged by the median, as the rule first was, GEMM #14
    # (a near-tie) left in a quality run; by the 20th percentile an FLA key's winner (0.035 and 0.209 ms) would
    # have; by the fastest sample no config that mattered leaves.
    r = replay(sorted((ROOT / "benchmarks" / "results" / "2026-11-28i-H200").glob("*.tgz")))
    assert (r.keys, r.survivors, r.out, len(r.mattered)) == (184, 1673, 785, 311)
    assert r.lost == [] and round(max(r.mattered), 3) == 1.034
