"""Incremental re-tuning: when only a kernel's config list changed since its cache entry, a key times the new
configs and a few anchors (the incumbent, the old entry's two fastest still listed), carries the other old
timings over scaled by the anchors' new/old ratio, and decides over every live config. Any other change
(the kernel's source, TRITON_CTX_TUNE_RETUNE=1) still tunes every config."""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from tests.kernels import DEVICE, costly, grid
from triton_ctx_tune import contextual_autotune
from triton_ctx_tune.runtime.compat import config_str
from triton_ctx_tune.store import cache as C
from triton_ctx_tune.store import incremental as I
from triton_ctx_tune.tools.report import build, format_report

N = 128
KEY = (N, "torch.float32")
FAST = dict(n_warmup=1, n_repeat=3, early_stop=False)  # 4 slots per timed config
SLOTS = 4
# Declared costs (ms; the host clock sees HOST_COST_SCALE times more) 10% apart: far above the
# interpreter's own time and noise, so the order of configs is the declared one and scale ~ 1.
BASE = {(16, 1): 100.0, (16, 2): 110.0, (32, 1): 120.0, (32, 2): 130.0, (64, 1): 140.0, (64, 2): 150.0,
        (128, 1): 160.0, (128, 2): 170.0}


def _bump(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _bump_v2(folder: Path):
    """_bump with another constant, from a module of its own (the same name: the same kernel's entries)."""
    path = folder / "bump_v2.py"
    path.write_text(inspect.getsource(_bump).replace("+ 1, mask", "+ 2, mask").join(
        ["import triton.language as tl\n\n\n", ""]))
    spec = importlib.util.spec_from_file_location("bump_v2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._bump


def _fails(nargs):
    raise OutOfResources(262144, 232448, "shared memory")


def _config(block: int, warps: int, cost: float | None) -> triton.Config:
    """Each hook captures its own cost only, so other configs' hooks (part of the identity) stay the same."""
    hook = _fails if cost is None else costly(lambda nargs, ms=cost: ms)
    return triton.Config({"BLOCK": block}, num_warps=warps, pre_hook=hook)


def _kernel(costs: dict[tuple[int, int], float | None], body=_bump):
    return triton.autotune(configs=[_config(b, w, c) for (b, w), c in costs.items()], key=["n"])(triton.jit(body))


def _tune(kernel, **opts):
    """One call on a fresh function; the call's events, and its stats."""
    @contextual_autotune(**{**FAST, **opts})
    def op(x):
        h = x.clone()
        kernel[grid(N)](h, N)
        return h

    y = op(torch.zeros(N, device=DEVICE))
    assert bool((y == 1).all()) or bool((y == 2).all())
    rows = [json.loads(line) for line in (Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]) / "rank-0.jsonl")
            .read_text().splitlines()]
    last = rows[-1]["call"]
    return [e for e in rows if e["call"] == last], op.last_call


def _timed_slots(events: list[dict]) -> Counter:
    return Counter(e["config_index"] for e in events if e["event"] == "slot" and e["timed"])


def _slots(events: list[dict]) -> Counter:
    return Counter(e["config_index"] for e in events if e["event"] == "slot" and e["config_index"] is not None)


def _only(events: list[dict], kind: str) -> dict:
    (e,) = [e for e in events if e["event"] == kind]
    return e


def _entry(kernel) -> dict:
    at = kernel
    ident = C.identity(at, KEY, at.configs, 1, "max", "median")
    return C.read_entry(C.resolve_dir() / C.entry_filename(ident["kernel"], C.entry_id(ident)))


def _first_tune(costs=BASE):
    first = _kernel(costs)
    events, call = _tune(first)
    assert call.executions == len(costs) * SLOTS + 1
    assert _timed_slots(events) == {j: 3 for j in range(len(costs))}  # a failed config's slots count too
    return first, events


def _place(costs: dict, at: int, config: tuple[int, int], cost: float) -> dict:
    items = list(costs.items())
    return dict(items[:at] + [(config, cost)] + items[at:])


def test_a_new_config_faster_than_all_is_timed_with_the_anchors_alone_and_wins():
    first, _ = _first_tune()
    # The 9th config, inserted third (configs are matched by their text, not their place), is the fastest.
    costs = _place(BASE, 2, (16, 4), 90.0)
    second = _kernel(costs)
    events, call = _tune(second)
    # Timed: the new config (#2) and the anchors: the incumbent #0 {16, w1}, also the fastest, and the runner-up #1.
    assert _timed_slots(events) == {2: 3, 0: 3, 1: 3}
    assert _slots(events) == {2: SLOTS, 0: SLOTS, 1: SLOTS}
    assert call.executions == 3 * SLOTS + 1 < (len(costs) * SLOTS + 1) / 2  # 13, where a full tune takes 37
    decision = _only(events, "decision")
    assert decision["winner"] == 2 and decision["winner_config"] == config_str(second.configs[2])
    inc = _only(events, "incremental")
    assert (inc["new"], inc["anchors"], inc["carried"], inc["carried_failed"], inc["removed"]) == (
        [2], [0, 1], [3, 4, 5, 6, 7, 8], [], 0)
    assert inc["scale"] == pytest.approx(1.0, rel=0.03)
    # Every config has a time in the decision; the carried ones are the old times on the new scale.
    old = {t["config"]: t["ms"] for t in _entry(first)["timings"]}
    reduced = dict(zip(decision["configs"], decision["reduced"]))
    for j in inc["carried"]:
        text = config_str(second.configs[j])
        assert reduced[text] == pytest.approx(old[text] * inc["scale"])
    # Against #0's measured time (declared 100 ms): a GPU's sleep may run at another rate than declared.
    assert reduced[config_str(second.configs[2])] == pytest.approx(0.9 * reduced[config_str(second.configs[0])],
                                                                   rel=0.03)
    stale = _only(events, "cache-stale")
    assert stale["reasons"] == ["the configs changed (8 -> 9 configs)"]  # no hook change named: theirs did not
    # The entry covers every live config; the carried ones say so.
    entry = _entry(second)
    assert entry["winner"]["index"] == 2 and all(t["ms"] for t in entry["timings"])
    assert [j for j, t in enumerate(entry["timings"]) if t.get("carried")] == inc["carried"]
    assert entry["tuned"]["incremental"]["scale"] == inc["scale"]
    text = format_report(build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert f"incremental: timed 1 new + 2 anchors of 9, carried 6, scale {inc['scale']:.2f}" in text
    assert "(carried over, scaled)" in text

    # A second edit works again from the incremental entry: a 10th config, slower than the winner.
    costs3 = _place(costs, 9, (256, 1), 200.0)
    third = _kernel(costs3)
    events, call = _tune(third)
    assert _timed_slots(events) == {9: 3, 2: 3, 0: 3}  # the new one; the incumbent #2 and the runner-up #0
    inc = _only(events, "incremental")
    assert (inc["new"], inc["anchors"], len(inc["carried"])) == ([9], [0, 2], 7)
    assert _only(events, "decision")["winner"] == 2 and call.executions == 3 * SLOTS + 1


def test_a_slower_new_config_leaves_the_winner_and_failed_configs_stay_failed():
    base = dict(BASE)
    base[(128, 2)] = None  # fails (out of resources) every time
    first, _ = _first_tune(base)
    costs = {**base, (256, 1): 180.0}
    second = _kernel(costs)
    events, call = _tune(second)
    assert _timed_slots(events) == {8: 3, 0: 3, 1: 3}  # the failed #7 takes no slot: it is not tried again
    assert call.executions == 3 * SLOTS + 1
    inc = _only(events, "incremental")
    assert (inc["new"], inc["anchors"], inc["carried"], inc["carried_failed"]) == ([8], [0, 1], [2, 3, 4, 5, 6], [7])
    decision = _only(events, "decision")
    assert decision["winner"] == 0 and decision["reduced"][7] == float("inf")
    assert decision["reduced"][8] == pytest.approx(1.8 * decision["reduced"][0], rel=0.03)  # 180 ms against 100
    entry = _entry(second)
    assert entry["timings"][7]["ms"] is None and entry["timings"][7]["failure"] == I.CARRIED_FAILURE
    text = format_report(build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert "incremental: timed 1 new + 2 anchors of 9, carried 5 (+1 failed before, still failed)" in text


def test_removing_the_winner_re_times_only_the_anchors():
    _first_tune()
    costs = {k: v for k, v in BASE.items() if k != (16, 1)}  # the old winner leaves
    second = _kernel(costs)
    events, call = _tune(second)
    assert _timed_slots(events) == {0: 3, 1: 3}  # no incumbent: the two fastest left, {16, w2} and {32, w1}
    assert call.executions == 2 * SLOTS + 1
    inc = _only(events, "incremental")
    assert (inc["new"], inc["anchors"], inc["carried"], inc["removed"]) == ([], [0, 1], [2, 3, 4, 5, 6], 1)
    decision = _only(events, "decision")
    assert decision["winner"] == 0 and decision["winner_config"] == config_str(second.configs[0])
    assert _only(events, "cache-stale")["reasons"] == ["the configs changed (8 -> 7 configs)"]


@pytest.mark.parametrize("added", [False, True], ids=["same-configs", "and-a-config"])
def test_a_changed_kernel_source_tunes_every_config(added, tmp_path):
    _first_tune()
    costs = _place(BASE, 2, (16, 4), 90.0) if added else BASE
    second = _kernel(costs, body=_bump_v2(tmp_path))
    events, call = _tune(second)
    assert _timed_slots(events) == {j: 3 for j in range(len(costs))}
    assert call.executions == len(costs) * SLOTS + 1
    assert not [e for e in events if e["event"] == "incremental"]
    assert _only(events, "decision")["winner"] == (2 if added else 0)
    assert "the source of the kernel _bump changed" in _only(events, "cache-stale")["reasons"]


def test_retune_env_times_every_config(monkeypatch):
    _first_tune()
    monkeypatch.setenv("TRITON_CTX_TUNE_RETUNE", "1")
    costs = _place(BASE, 2, (16, 4), 90.0)
    events, call = _tune(_kernel(costs))
    assert _timed_slots(events) == {j: 3 for j in range(len(costs))} and call.executions == len(costs) * SLOTS + 1


def test_a_changed_hook_of_a_kept_config_is_not_a_config_list_change():
    _first_tune()
    costs = {**BASE, (16, 1): 105.0, (256, 1): 180.0}  # the hook of {16, w1} now declares another cost
    events, call = _tune(_kernel(costs))
    assert call.executions == len(costs) * SLOTS + 1
    assert _only(events, "cache-stale")["reasons"] == ["the configs changed (8 -> 9 configs)",
                                                       "a config pre_hook or the autotuner's pre/post hook changed"]


def test_the_plan_anchors_the_incumbent_and_the_two_fastest():
    timings = [{"config": c, "ms": ms, "q20": ms, "q80": ms, "per_rank_ms": [ms]}
               for c, ms in (("a", 3.0), ("b", 1.0), ("c", 2.0), ("d", None), ("e", 4.0))]
    p = I.plan(timings, "e", ["x", "a", "b", "c", "d", "e"], world=1)  # "e" won a tie-break once
    assert (p.new, p.anchors, p.carried, p.carried_failed, p.removed) == ([0], [2, 3, 5], [1], [4], 0)
    assert p.scale([9.0, 9.0, 2.0, 4.0, 9.0, 12.0]) == pytest.approx(2.0)  # median of 2, 2, 3
    assert p.carried_times(2.0) == {1: ((6.0, 6.0, 6.0), [6.0])}
    again = I.Plan.from_tensor(p.to_tensor(), p.removed)
    assert again.roles == p.roles and again.old[1] == p.old[1]
    assert I.plan(timings, "b", ["x", "d"], world=1) is None  # nothing with a time left to anchor on


def test_screening_keeps_carried_configs_within_its_factor_and_times_only_the_others():
    _first_tune()
    costs = _place(BASE, 2, (16, 4), 90.0)
    second = _kernel(costs)
    events, call = _tune(second, early_stop=1.5)
    # Screening: one timed slot each for the new config and the anchors; all three are within 1.5x. The new
    # config gets a survivor's other two; an anchor's screening sample was the first of those two, so it gets
    # one more. Carried configs take no slot: those within 1.5x of the best (135 ms) stay in the decision.
    assert _timed_slots(events) == {2: 3, 0: 2, 1: 2}
    # Warm-ups: one each before screening, none after (precompiled); the final run.
    assert call.executions == (1 + 3) + 2 * (1 + 2) + 1
    (screen,) = [e for e in events if e["event"] == "screen"]
    assert screen["kept"] == [0, 1, 2, 3, 4]  # #3 {32, w1} 120 and #4 {32, w2} 130 carried, within 1.5x
    decision = _only(events, "decision")
    assert decision["winner"] == 2 and decision["screened_out"] == [5, 6, 7, 8]
    assert decision["reduced"][4] == pytest.approx(1.3 * decision["reduced"][0], rel=0.03)  # 130 ms against 100


DEFAULTS = dict(n_warmup=3, n_repeat=5, early_stop=None, confirm=False)  # the default schedule, confirm off
COSTS_18 = {(b, w): 100.0 + 11.0 * i for i, (b, w) in enumerate((b, w) for b in (16, 32, 64, 128, 256, 512)
                                                                for w in (1, 2, 4))}
# The executions of an incremental re-tuning that adds one config to COSTS_18, on the default schedule, when all
# three timed configs pass the screening: the new config takes one warm-up, a screening sample and a survivor's
# n_repeat - 1 = 4 samples (precompiled: no more warm-ups); each of the two anchors (the incumbent, the
# runner-up) a warm-up and 4 samples, the first of which is its screening sample; then the final run.
GROWN_18 = (1 + 1 + 4) + 2 * (1 + 4) + 1


def _full_18():
    assert len(COSTS_18) == 18
    _, full = _tune(_kernel(COSTS_18), **DEFAULTS)
    # Screening 18 x 2 slots; the 5 within 1.5x of 100 ms (100 to 144) a first round each (precompiled), after
    # which 111 to 144 ms are over RACE_BAND behind and leave, and 100 takes the other 3 rounds alone; the final run.
    assert full.executions == 18 * 2 + 5 + 3 + 1
    return full


def test_a_config_added_to_a_list_of_18_on_the_default_schedule():
    """Counted on the default schedule (n_warmup=3, n_repeat=5, screening at 1.5x), on the CPU with declared,
    deterministic costs: the new config is screened and timed, the two anchors timed, 17 executions against 45
    for the full tune of 18 (38%)."""
    full = _full_18()
    grown = _place(COSTS_18, 5, (16, 8), 90.0)  # a 19th config, the new fastest
    events, again = _tune(_kernel(grown), **DEFAULTS)
    inc = _only(events, "incremental")
    assert inc["new"] == [5] and inc["anchors"] == [0, 1]
    assert _only(events, "decision")["winner"] == 5
    assert _timed_slots(events) == {5: 5, 0: 4, 1: 4}
    assert again.executions == GROWN_18 == 17 <= 0.38 * full.executions


def test_on_the_default_schedule_a_slower_new_config_leaves_the_incumbent():
    _full_18()
    grown = _place(COSTS_18, 0, (16, 8), 105.0)  # listed first, 5% slower than the incumbent
    events, again = _tune(_kernel(grown), **DEFAULTS)
    assert _only(events, "incremental")["anchors"] == [1, 2]  # the incumbent {16, w1} and the runner-up
    d = _only(events, "decision")
    assert (d["winner"], d["tie_break"]) == (1, None)
    assert d["reduced"][0] == pytest.approx(1.05 * d["reduced"][1], rel=0.01)
    assert again.executions == GROWN_18


@pytest.mark.parametrize("cost, tie_break", [(101.5, None), (99.5, "incumbent")], ids=["1.5%-slower", "0.5%-faster"])
def test_on_the_default_schedule_a_new_config_close_to_the_incumbent_leaves_it(cost, tie_break, tmp_path, monkeypatch):
    """A new config listed first and within 2% of the incumbent, confirmation on (the default): it is re-timed
    with the incumbent, and the incumbent stays, as the fastest or, within the tie band (the 1% floor here:
    declared costs have no spread), by the tie-break that prefers it over the list's first. Twice from an
    empty cache, alike."""
    for attempt in range(2):
        monkeypatch.setenv("TRITON_CTX_TUNE_CACHE_DIR", str(tmp_path / f"cache-{attempt}"))
        _full_18()
        events, again = _tune(_kernel(_place(COSTS_18, 0, (16, 8), cost)), **{**DEFAULTS, "confirm": None})
        assert _only(events, "incremental")["anchors"] == [1, 2]
        assert _only(events, "confirm")["candidates"] == [0, 1]  # within 3% (the confirmation's floor)
        d = _only(events, "decision")
        assert (d["winner"], d["tie_break"], d["confirmed"]) == (1, tie_break, [0, 1])
        # The incremental re-tuning's 17, then 5 more interleaved samples of the two candidates.
        assert again.executions == GROWN_18 + 2 * 5
