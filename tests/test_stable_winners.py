"""Near-ties: configs within a band of the fastest (the band is the fastest config's own spread, between 1% and
5%) are one tie, which the incumbent keeps (the last winner of this kernel and key, even from a cache entry that
no longer applies), so a re-tune does not flip configs on noise; without an incumbent the fastest wins it. (The
first in the config list used to win it, which gave away up to the band's width: issue 35.) The decision event
and `report` say the band, the spread and whether the tie-break chose."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import triton

from tests.kernels import DEVICE, SLOW_MS, add_one_, block_configs, chosen, grid
from triton_ctx_tune import contextual_autotune
from triton_ctx_tune.engine.state import TIE_CAP, TIE_FLOOR, stable_winner
from triton_ctx_tune.tools.report import build, format_report

N = 128
FAST = dict(n_warmup=1, n_repeat=3, early_stop=False)
# Declared costs dominate the host clock: 16 and 32 are 0.5% apart (a near-tie), 64 is 2x slower. BIG
# makes 0.5% (75 ms of the host clock) far more than the interpreter's own time, which differs between
# BLOCK 16 and 32 by a few ms (more programs).
NEAR = 1.005
BIG = 10 * SLOW_MS
BLOCKS = [32, 16, 64]  # the noisy test's config list


def _kernel(slow: dict[int, float]) -> triton.runtime.autotuner.Autotuner:
    """add_one_'s kernel (the same name, so the same cache entries) with configs BLOCK in `slow`'s order."""
    return triton.autotune(configs=block_configs(list(slow), slow=slow), key=["n"])(triton.jit(add_one_.fn.fn))


def _tune(kernel, **opts) -> None:
    @contextual_autotune(**FAST, **opts)
    def op(x):
        kernel[grid(N)](x, N)
        return x

    op(torch.zeros(N, device=DEVICE))


def _decisions() -> list[dict]:
    path = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])
    return [e for f in sorted(path.rglob("rank-0.jsonl")) for line in f.read_text().splitlines()
            if (e := json.loads(line))["event"] == "decision"]


def test_band_ties_and_tie_break_rules():
    # The band is the fastest's spread, clamped: 0.2% -> the floor; 3% -> 3%; 20% -> the cap.
    assert stable_winner([1.0, 0.999, 2.0], [1.0, 0.998, 2.0], [1.0, 1.0, 2.0]).band == TIE_FLOOR
    assert stable_winner([1.0, 1.0, 2.0], [0.99, 0.99, 2.0], [1.02, 1.02, 2.0]).band == pytest.approx(0.03)
    wide = stable_winner([1.05, 1.0, 1.06], [1.0, 0.9, 1.0], [1.1, 1.1, 1.1])
    assert wide.band == TIE_CAP and wide.ties == [0, 1] and wide.winner == 1 and wide.tie_break is None
    # Inside the band the incumbent wins; outside it the fastest does.
    assert stable_winner([1.0, 1.005, 3.0], [1.0, 1.0, 3.0], [1.0, 1.0, 3.0], incumbent=1).tie_break == "incumbent"
    assert stable_winner([1.0, 1.5, 3.0], [1.0, 1.5, 3.0], [1.0, 1.5, 3.0], incumbent=1).winner == 0
    # The fastest first in the list: no tie-break was needed. Failed configs (inf) are never in a tie.
    first = stable_winner([1.0, 1.004, float("inf")], [1.0] * 3, [1.0] * 3)
    assert (first.winner, first.tie_break, first.ties) == (0, None, [0, 1])
    assert stable_winner([float("inf")] * 2, [0.0] * 2, [0.0] * 2) is None


def test_a_near_tie_without_an_incumbent_goes_to_the_fastest_and_the_report_says_so():
    kernel = _kernel({32: NEAR * BIG, 16: BIG, 64: 2 * BIG})  # 16 is the fastest, by 0.5%, second in the list
    _tune(kernel, cache=False)
    assert chosen(kernel) == {(N, "torch.float32"): 16}
    (d,) = _decisions()
    assert (d["winner"], d["fastest"], d["ties"], d["tie_break"]) == (1, 1, [0, 1], None)
    assert TIE_FLOOR <= d["band"] <= TIE_CAP and d["spread"] <= d["band"]
    text = format_report(build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert f"near-ties  band {d['band']:.1%}" in text
    assert "configs [0, 1] within it; the fastest won" in text


def test_the_incumbent_keeps_its_place_when_the_config_list_changes():
    # A first run with configs 32 and 64: 32 wins and the cache keeps it.
    first = _kernel({32: BIG, 64: 2 * BIG})
    _tune(first)
    assert chosen(first) == {(N, "torch.float32"): 32}
    # 16 is added, as fast as 32 within 0.5% and first in the list: the entry no longer applies (its configs
    # changed), so the key is tuned again, and the near-tie goes to the incumbent, 32, not to the list's first.
    second = _kernel({16: BIG, 32: NEAR * BIG, 64: 2 * BIG})
    _tune(second)
    assert chosen(second) == {(N, "torch.float32"): 32}
    d = _decisions()[-1]
    assert (d["winner"], d["fastest"], d["ties"], d["tie_break"]) == (1, 0, [0, 1], "incumbent")


def test_near_ties_with_noise_go_to_what_each_run_measured_fastest():
    """Two configs 0.3% apart, each launch off by up to +-0.3% at random (another seed each run): each cold run
    picks the one it measured fastest, with no tie-break (a re-tune's incumbent: the test above)."""
    import random

    from tests.kernels import costly

    winners, fastest = [], []
    for run in range(5):
        rng = random.Random(run)

        def noisy(base: float, rng: random.Random = rng) -> triton.Config:  # (this run's rng, when the hook runs)
            return costly(lambda nargs: base * (1 + rng.uniform(-0.003, 0.003)))

        configs = [triton.Config({"BLOCK": 32}, num_warps=4, pre_hook=noisy(1.003 * BIG)),
                   triton.Config({"BLOCK": 16}, num_warps=4, pre_hook=noisy(BIG)),
                   triton.Config({"BLOCK": 64}, num_warps=4, pre_hook=noisy(2 * BIG))]
        kernel = triton.autotune(configs=configs, key=["n"])(triton.jit(add_one_.fn.fn))
        _tune(kernel, cache=False)
        d = _decisions()[-1]
        winners.append(chosen(kernel)[(N, "torch.float32")])
        fastest.append((d["fastest"], d["tie_break"]))
    assert [BLOCKS[f] for f, _ in fastest] == winners and {t for _, t in fastest} == {None}, (winners, fastest)
