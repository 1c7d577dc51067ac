"""Confirmation of close candidates: before a key is decided, the configs within a few percent of the
fastest are re-timed, interleaved, and the decision uses all of their samples (per launch; end to end, the
whole steps alone). A ranking that drift made (a config measured fast in its own stretch of time, slower once
compared side by side) is corrected; a clear winner costs nothing extra."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import triton

from tests.kernels import DEVICE, SLOW_MS, add_one_, block_configs, chosen, costly, grid, spend
from triton_ctx_tune import contextual_autotune
from triton_ctx_tune.engine.state import (
    CONFIRM_CAP,
    CONFIRM_FLOOR,
    OVERLAP_MAX,
    TIE_FLOOR,
    close_candidates,
    confirm_rounds,
    stable_winner,
)
from triton_ctx_tune.tools.report import build, format_report

N = 128
FAST = dict(n_warmup=1, n_repeat=3, early_stop=False, cache=False)
SLOTS = 4  # per config: one warm-up and three timed launches
BIG = 10 * SLOW_MS  # declared costs far above the interpreter's own time


def _kernel(configs: list[triton.Config]) -> Any:
    return triton.autotune(configs=configs, key=["n"])(triton.jit(add_one_.fn.fn))


def _tune(kernel: Any, **opts: Any) -> Any:
    @contextual_autotune(**{**FAST, **opts})
    def op(x):
        kernel[grid(N)](x, N)
        return x

    op(torch.zeros(N, device=DEVICE))
    return op.last_call


def _events(kind: str) -> list[dict]:
    path = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])
    return [e for f in sorted(path.rglob("rank-0.jsonl")) for line in f.read_text().splitlines()
            if (e := json.loads(line))["event"] == kind]


def _drifting(fast_launches: int, early: float, late: float) -> triton.Config:
    """BLOCK 16: its first `fast_launches` launches cost `early` * BIG, every later one `late` * BIG (a GPU
    whose clocks were high while this config had the machine to itself, say)."""
    launches = [0]

    def cost(nargs: dict[str, Any]) -> float:
        launches[0] += 1
        return (early if launches[0] <= fast_launches else late) * BIG

    return triton.Config({"BLOCK": 16}, num_warps=4, pre_hook=costly(cost))


def test_close_candidates_band():
    # Twice the tie band, clamped to [3%, 10%]: a 1% tie band -> 3%; 4% -> 8%; 5% -> the 10% cap.
    tight = stable_winner([1.0, 1.02, 1.05], [1.0, 1.02, 1.05], [1.0, 1.02, 1.05])
    assert close_candidates(tight, [1.0, 1.02, 1.05]) == ([0, 1], CONFIRM_FLOOR)
    wide = stable_winner([1.0, 1.07, 1.2], [0.98, 1.07, 1.2], [1.02, 1.07, 1.2])
    assert close_candidates(wide, [1.0, 1.07, 1.2]) == ([0, 1], pytest.approx(0.08))
    capped = stable_winner([1.0, 1.09, 1.11], [0.9, 1.09, 1.11], [1.1, 1.09, 1.11])
    assert close_candidates(capped, [1.0, 1.09, 1.11]) == ([0, 1], CONFIRM_CAP)
    assert close_candidates(tight, [1.0, float("inf"), 1.02]) == ([0, 2], CONFIRM_FLOOR)  # failed: never a candidate


def test_an_overlapped_key_also_confirms_a_config_that_was_fast_on_its_luckiest_rank():
    # All-gather + GEMM on 2 H200s (issue 35, one cold run): the exhaustive best measured 0.263 ms on rank 0, which
    # overlapped its launch with the gather, and 0.1985 ms on rank 1; the max over ranks put it 38% behind.
    reduced = [0.263, 0.192, 0.205, 0.31, 0.40, 0.24]
    luckiest = [0.1985, 0.190, 0.201, 0.26, 0.39, 0.235]
    choice = stable_winner(reduced, reduced, reduced)
    assert close_candidates(choice, reduced, overlapped=True) == ([1, 2, 5], 0.30)
    assert close_candidates(choice, reduced, overlapped=True, luckiest=luckiest) == ([0, 1, 2, 5], 0.30)
    # Not for a key timed alone (its ranks measure the same launch), and never past OVERLAP_MAX candidates.
    assert close_candidates(choice, reduced, luckiest=luckiest)[0] == [1]
    many = [1.0 + 0.01 * i for i in range(12)]
    got, _ = close_candidates(stable_winner(many, many, many), many, overlapped=True, luckiest=many[::-1])
    assert len(got) == OVERLAP_MAX


def test_a_ranking_made_by_drift_is_corrected_by_the_interleaved_confirmation():
    # BLOCK 16 measures 0.98 while it runs its own block of slots, then 1.05; BLOCK 32 is a steady 1.0.
    def configs() -> list[triton.Config]:
        return [_drifting(SLOTS, 0.98, 1.05)] + block_configs([32, 64], slow={32: BIG, 64: 2 * BIG})

    plain = _kernel(configs())
    unconfirmed = _tune(plain, confirm=False)
    assert chosen(plain) == {(N, "torch.float32"): 16}  # 2% ahead in its own stretch: beyond the 1% tie band
    assert _events("confirm") == [] and unconfirmed.executions == 3 * SLOTS + 1

    kernel = _kernel(configs())
    call = _tune(kernel)
    assert chosen(kernel) == {(N, "torch.float32"): 32}
    (confirm,) = _events("confirm")
    assert confirm["candidates"] == [0, 1] and confirm["rounds"] == 3
    assert confirm["margins"][0] == pytest.approx(0.0) and confirm["margins"][1] == pytest.approx(0.02, abs=0.005)
    decision = _events("decision")[-1]
    assert decision["confirmed"] == [0, 1] and decision["winner"] == 1
    # The decision's times pool each candidate's samples: BLOCK 16's three at 0.98 and three at 1.05 (median
    # 1.015), BLOCK 32's six at 1.0.
    assert decision["reduced"][0] / decision["reduced"][1] == pytest.approx(1.015, rel=0.005)
    assert call.executions == 3 * SLOTS + 2 * 3 + 1  # the schedule, 2 candidates x 3 rounds, the final run
    text = format_report(build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert "confirmed  #0, #1 re-timed interleaved before the decision: #1 ahead by 1.5%" in text


def test_a_noisy_key_is_confirmed_in_more_rounds_and_its_band_narrows_with_them():
    # BLOCK 32 costs 1.0, but every third launch of it 1.0635 (a short kernel's hiccups); BLOCK 16 is a steady
    # 1.02, first in the list. One launch's spread (6.35%) would make them one tie, decided by config order.
    launches = [0]

    def hiccups(nargs: dict[str, Any]) -> float:
        launches[0] += 1
        return (1.0635 if launches[0] % 3 == 0 else 1.0) * BIG

    kernel = _kernel([triton.Config({"BLOCK": 16}, num_warps=4, pre_hook=costly(lambda _: 1.02 * BIG)),
                      triton.Config({"BLOCK": 32}, num_warps=4, pre_hook=costly(hiccups)),
                      *block_configs([64], slow={64: 2 * BIG})])
    call = _tune(kernel)
    assert chosen(kernel) == {(N, "torch.float32"): 32}
    (confirm,) = _events("confirm")
    # Rounds to bring the band to 1%: the first 3 samples' spread is 3.8%, and (3.8% / 1%)^2 = 14.5.
    assert confirm["candidates"] == [0, 1] and confirm["rounds"] == 15
    d = _events("decision")[-1]
    assert (d["winner"], d["fastest"], d["tie_break"], d["confirm_rounds"]) == (1, 1, None, 15)
    # 15 samples, 5 of them hiccups: spread 6.35%, band 6.35% / sqrt(15) = 1.6%: BLOCK 16's 2% is outside it.
    assert d["spread"] == pytest.approx(0.0635, rel=0.01)
    assert d["band"] == pytest.approx(0.0635 / 15 ** 0.5, rel=0.01) and d["ties"] == [1]
    assert call.executions == 3 * SLOTS + 2 * 15 + 1
    text = format_report(build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert (f"band {d['band']:.1%} (the fastest's spread {d['spread']:.1%} over the square root of 15 interleaved "
            f"rounds): no other config within it; the fastest won") in text


def test_confirm_rounds_and_the_band_after_them():
    assert confirm_rounds(0.004, 5) == 5 and confirm_rounds(0.037, 5) == 14 and confirm_rounds(0.10, 5) == 20
    assert confirm_rounds(0.10, 50) == 50  # never fewer than n_repeat
    # The GELU of the MLP op on 2 H200s (issue 35), confirmed in 5 rounds: BLOCK 1024 at 34.78 us, first in the
    # list, BLOCK 2048 the fastest at 33.86 us with a 3.1% spread: one tie by one launch's spread, not by 14 rounds'.
    times, q20, q80 = [34.78, 33.86], [33.9, 33.6], [35.0, 34.65]
    one = stable_winner(times, q20, q80)
    assert (one.winner, one.tie_break, one.ties) == (1, None, [0, 1])  # one tie; the fastest wins it
    assert stable_winner(times, q20, q80, incumbent=0).winner == 0  # the incumbent keeps it: no flip on noise
    after = stable_winner(times, q20, q80, samples=4)
    assert (after.winner, after.tie_break, after.ties) == (1, None, [1])
    assert stable_winner(times, q20, q80, incumbent=0, samples=4).winner == 1  # out of the narrowed band
    assert after.band == pytest.approx(0.031 / 2, rel=0.01)
    assert stable_winner(times, q20, q80, samples=14).band == TIE_FLOOR  # never below the floor
    # Configs within the floor stay one tie however many rounds ran: the incumbent keeps it, else the fastest
    # wins (GELU after 20 rounds, 2 H200s: 33.65 against 33.90 us; the oracles put 2048 2.5% ahead).
    within = stable_winner([33.90, 33.65], [33.7, 33.5], [34.1, 33.9], samples=20)
    assert (within.winner, within.tie_break, within.ties, within.band) == (1, None, [0, 1], TIE_FLOOR)
    kept = stable_winner([33.90, 33.65], [33.7, 33.5], [34.1, 33.9], incumbent=0, samples=20)
    assert (kept.winner, kept.tie_break, kept.fastest) == (0, "incumbent", 1)
    assert stable_winner([1.0, 1.0], [1.0, 1.0], [1.0, 1.0]).winner == 0  # equal times: the first listed


def test_a_clear_winner_is_not_confirmed_and_costs_nothing_more():
    kernel = _kernel(block_configs([16, 32, 64], slow={16: BIG, 32: 1.2 * BIG, 64: 2 * BIG}))
    call = _tune(kernel)
    assert chosen(kernel) == {(N, "torch.float32"): 16}
    assert _events("confirm") == [] and _events("decision")[-1]["confirmed"] is None
    assert call.executions == 3 * SLOTS + 1


def test_confirmation_off_by_environment(monkeypatch):
    monkeypatch.setenv("TRITON_CTX_TUNE_CONFIRM", "0")
    kernel = _kernel([_drifting(SLOTS, 0.98, 1.05)] + block_configs([32], slow={32: BIG}))
    call = _tune(kernel)
    assert chosen(kernel) == {(N, "torch.float32"): 16} and call.executions == 2 * SLOTS + 1
    assert _events("confirm") == []


def _tune_online(kernel: Any, most_calls: int = 50) -> None:
    """Call an online-tuned op until the kernel has a winner (or `most_calls` calls)."""
    @contextual_autotune(**FAST, online=True)
    def op(x):
        kernel[grid(N)](x, N)
        return x

    for _ in range(most_calls):
        if chosen(kernel):
            return
        op(torch.zeros(N, device=DEVICE))


def test_online_calls_confirm_too():
    kernel = _kernel([_drifting(SLOTS, 0.98, 1.05)] + block_configs([32], slow={32: BIG}))
    _tune_online(kernel)
    assert chosen(kernel) == {(N, "torch.float32"): 32}
    (confirm,) = _events("confirm")
    assert confirm["candidates"] == [0, 1]


# ---- objectives: only "auto" (the default) confirms end to end, and only a key that overlapped another
# stream's work (runtime/streams.py, GPU: tests/test_gpu.py); without CUDA no stream is ever busy --------------

_slows_the_rest = {"on": False}


def _noisy(block: int, base: float, hogs: bool) -> triton.Config:
    """Per-launch cost base x 0.8, 1.2, 1.0, ...; `hogs`: the rest of the step runs 50% of base slower after it
    (what starving an overlapped all-gather does to the call, which per-launch times cannot see)."""
    launches = [0]

    def hook(nargs: dict[str, Any]) -> None:
        _slows_the_rest["on"] = hogs
        launches[0] += 1
        costly(lambda a: base * (0.8, 1.2, 1.0)[launches[0] % 3])(nargs)

    return triton.Config({"BLOCK": block}, num_warps=4, pre_hook=hook)


def _overlapping(objective: str) -> tuple[Any, Any]:
    kernel = _kernel([_noisy(64, BIG, hogs=True), _noisy(32, 1.04 * BIG, hogs=False)])

    @contextual_autotune(**FAST, objective=objective)
    def op(x):
        kernel[grid(N)](x, N)
        if _slows_the_rest["on"]:
            spend(0.5 * BIG)
        return x

    op(torch.zeros(N, device=DEVICE))
    return kernel, op.last_call


def test_online_a_noisy_key_keeps_the_usual_rounds():
    # Online each round costs the program's calls: the rounds stay max(3, n_repeat) however noisy the key.
    kernel = _kernel([_noisy(64, BIG, hogs=False), _noisy(32, 1.04 * BIG, hogs=False)])
    _tune_online(kernel)
    assert chosen(kernel)
    (confirm,) = _events("confirm")
    d = _events("decision")[-1]
    assert confirm["rounds"] == 3 and d["confirm_rounds"] == 3 and d["spread"] > 0.1
    assert d["band"] == pytest.approx(min(0.05, max(0.01, d["spread"] / 3 ** 0.5)))


def test_the_default_objective_is_auto_and_a_key_no_stream_overlaps_is_confirmed_per_launch():
    kernel, call = _overlapping("auto")
    assert chosen(kernel) == {(N, "torch.float32"): 64}  # per launch 4% faster; no other stream was busy
    (confirm,) = _events("confirm")
    assert confirm["end_to_end"] is False and _events("decision")[-1]["end_to_end"] is False
    # Launches 20% apart at random: a noisy key, confirmed in the most rounds (CONFIRM_MAX_ROUNDS).
    assert confirm["rounds"] == 20 and call.executions == 2 * SLOTS + 2 * 20 + 1


def test_under_the_default_objective_a_key_launched_while_another_stream_is_busy_is_judged_by_the_call(monkeypatch):
    """The overlap stand-in: the function's side work (an all-gather on another stream) is in flight while the
    kernel launches, and the config that hogs the GPU starves it. Without CUDA no stream is ever busy, so the
    stream query is what stands in here; tests/test_gpu.py detects a real side stream's copy."""
    from triton_ctx_tune.runtime import streams

    side = {"in_flight": False}
    monkeypatch.setattr(streams, "busy_elsewhere", lambda: side["in_flight"])
    kernel = _kernel([_noisy(64, BIG, hogs=True), _noisy(32, 1.04 * BIG, hogs=False)])

    @contextual_autotune(**FAST)  # the default objective
    def op(x):
        side["in_flight"] = True  # queued on the side stream before the launch
        kernel[grid(N)](x, N)
        if _slows_the_rest["on"]:
            spend(0.5 * BIG)  # waiting for the starved all-gather
        side["in_flight"] = False
        return x

    op(torch.zeros(N, device=DEVICE))
    assert chosen(kernel) == {(N, "torch.float32"): 32}  # 4% slower per launch, 1.04 against 1.5 for the call
    (confirm,) = _events("confirm")
    assert confirm["end_to_end"] is True and confirm["candidates"] == [0, 1]
    assert _events("decision")[-1]["end_to_end"] is True
    # One whole-call round each, of resolved_e2e_runs executions (one on the host's clock, more with CUDA events):
    # config 64's is 44% behind config 32's, more than RACE_BAND, so the race ends after its first round.
    from triton_ctx_tune.options import TuneOptions
    runs = TuneOptions().resolved_e2e_runs("host" if DEVICE == "cpu" else "cuda-events")
    assert op.last_call.executions == 2 * SLOTS + 2 * 1 * runs + 1
    assert _events("confirm-round") == []


def test_an_end_to_end_confirmation_is_a_race_that_drops_the_candidates_far_behind_after_each_round(monkeypatch):
    """Three close candidates per launch; for the call, BLOCK 64 is fastest, 32 is 5% behind and 16 is 34% behind.
    16 leaves the race after the first round (more than RACE_BAND behind); 64 and 32 run all three rounds."""
    from triton_ctx_tune.runtime import streams

    monkeypatch.setattr(streams, "busy_elsewhere", lambda: True)
    after = {"ms": 0.0}

    def config(block: int, per_launch: float, rest: float) -> triton.Config:
        def hook(nargs: dict[str, Any]) -> None:
            after["ms"] = rest * BIG
            spend(per_launch * BIG)
        return triton.Config({"BLOCK": block}, num_warps=4, pre_hook=hook)

    kernel = _kernel([config(64, 1.0, 0.0), config(32, 1.02, 0.03), config(16, 1.04, 0.30)])

    @contextual_autotune(**FAST)
    def op(x):
        kernel[grid(N)](x, N)
        spend(after["ms"])  # what the config did to the rest of the call
        return x

    x = torch.zeros(N, device=DEVICE)
    out = op(x)
    assert chosen(kernel) == {(N, "torch.float32"): 64}
    (confirm,) = _events("confirm")
    assert confirm["end_to_end"] is True and confirm["candidates"] == [0, 1, 2] and confirm["rounds"] == 3
    rounds = _events("confirm-round")
    assert [(r["stay"], r["out"], r["rounds_left"]) for r in rounds] == [([0, 1], [2], 1), ([0, 1], [], 0)]
    decision = _events("decision")[-1]
    assert decision["confirmed"] == [0, 1, 2] and decision["winner"] == 0 and decision["end_to_end"] is True
    assert decision["raced_out"] == [2]
    text = format_report(build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert "re-timed interleaved before the decision: #0 ahead by" in text
    assert "#2 left the race after a round, far behind" in text
    from triton_ctx_tune.options import TuneOptions
    runs = TuneOptions().resolved_e2e_runs("host" if DEVICE == "cpu" else "cuda-events")
    assert op.last_call.executions == 3 * SLOTS + (3 + 2 + 2) * runs + 1
    assert torch.equal(out, torch.full((N,), float(op.last_call.executions)))  # add_one_ once per execution


def test_end_to_end_judges_the_call_and_finds_the_config_that_slows_it():
    kernel, call = _overlapping("end_to_end")
    assert chosen(kernel) == {(N, "torch.float32"): 32}  # 1.04 against 1.5 for the call
    assert _events("confirm") == [] and _events("decision")[-1]["end_to_end"] is True


def test_per_launch_keeps_its_meaning_and_judges_each_launch_alone():
    kernel, call = _overlapping("per_launch")
    assert chosen(kernel) == {(N, "torch.float32"): 64}
    (confirm,) = _events("confirm")  # still confirmed, per launch
    assert confirm["end_to_end"] is False and _events("decision")[-1]["end_to_end"] is False
    assert confirm["rounds"] == 20 and call.executions == 2 * SLOTS + 2 * 20 + 1


def test_a_key_re_times_its_candidates_once_the_key_launched_before_it_stops_changing_config():
    """The MLP op on 2 H200s: GELU's candidates were re-timed while its GEMM (launched before it, in the same
    executions) still timed configs up to 30% apart, each candidate after its own few of them; GELU's best in the
    op lost (RESULTS section 43). Here a consumer whose faster config depends on which producer config ran just
    before it: after the producer's winner, BLOCK 32 is 2% faster; after any other, BLOCK 16 is."""
    last: dict[str, int] = {}

    def producer_config(block: int, cost: float) -> triton.Config:
        def hook(nargs: dict[str, Any]) -> None:
            last["producer"] = block
            spend(cost * BIG)
        return triton.Config({"BLOCK": block}, num_warps=4, pre_hook=hook)

    def consumer_config(block: int) -> triton.Config:
        def cost(nargs: dict[str, Any]) -> float:
            after_winner = last.get("producer") == 32
            return BIG * (1.0 if (block == 32) == after_winner else 1.02)
        return triton.Config({"BLOCK": block}, num_warps=4, pre_hook=costly(cost))

    producer = _kernel([producer_config(16, 1.3), producer_config(32, 1.0), producer_config(64, 1.3),
                        producer_config(128, 1.3)])
    consumer = _kernel([consumer_config(16), consumer_config(32)])
    executions = 0

    @contextual_autotune(**FAST)
    def op(x):
        nonlocal executions
        executions += 1
        y = x.clone()
        producer[grid(N)](y, N)
        consumer[grid(N)](y, N)
        return y

    x = torch.zeros(N, device=DEVICE)
    torch.testing.assert_close(op(x), torch.full_like(x, 2.0))
    assert chosen(producer) == {(N, "torch.float32"): 32}
    assert chosen(consumer) == {(N, "torch.float32"): 32}  # config order and the other contexts favour 16
    (confirm,) = [e for e in _events("confirm") if e["candidates"] == [0, 1]]
    assert confirm["waits_for"] == [f"kernel=add_one_ key=({N}, 'torch.float32')"]  # the producer
    # The producer's 4 x 4 slots, then the consumer's 2 candidates x 3 rounds, then the final run.
    assert executions == 4 * SLOTS + 2 * 3 + 1
    decisions = {e["winner"]: e for e in _events("decision") if e.get("confirmed")}
    assert decisions[1]["confirmed"] == [0, 1] and decisions[1]["confirm_rounds"] == 3
