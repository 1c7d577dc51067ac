"""Budgeted search (engine/budget.py) on a 1200-config space of a real interpreted kernel; multi-rank
agreement in test_budget_dist.py's ranks."""
from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
import torch
import triton

from tests import budget_kernels as bk
from tests.kernels import DEVICE, autotuner
from triton_ctx_tune import InvalidOptionError, contextual_autotune
from triton_ctx_tune.engine.budget import BudgetSearch
from triton_ctx_tune.options import Budget, TuneOptions

FAST = dict(n_warmup=1, n_repeat=3, quiet=True)


def _run(kernel, tmp_path, budget, **opts):
    @contextual_autotune(budget=budget, cache_dir=str(tmp_path / "cache"), log_dir=str(tmp_path / "logs"),
                         **{**FAST, **opts})
    def fn(x):
        kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK_M"]),)](x, x.numel())
        return x

    bk.launched.clear()
    fn(torch.zeros(256, device=DEVICE))
    return fn


def _two_keys(tmp_path, kernel, size, before=lambda n: None):
    """Two keys of `kernel` (256 and 512 elements) tuned in the same executions under a 600 s budget; `size["n"]` says
    which one launches, `before(n)` runs before the n-th launch. Checks that every execution ran once on each
    tensor; returns rank 0's rung events."""
    @contextual_autotune(budget=600.0, cache=False, log_dir=str(tmp_path / "logs"), **FAST)
    def fn(x, y):
        for n, t in enumerate((x, y)):
            size["n"] = t.numel()
            before(n)
            kernel[lambda meta, t=t: (triton.cdiv(t.numel(), meta["BLOCK_M"]),)](t, t.numel())
        return x, y

    x, y = torch.zeros(256, device=DEVICE), torch.zeros(512, device=DEVICE)
    fn(x, y)
    assert torch.equal(x, torch.full_like(x, fn.last_call.executions))
    assert torch.equal(y, torch.full_like(y, fn.last_call.executions))
    return _events(tmp_path, "rung")


def _entry(tmp_path):
    files = list((tmp_path / "cache").glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def _events(tmp_path, kind):
    lines = (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()
    return [e for e in (json.loads(x) for x in lines) if e["event"] == kind]


@pytest.mark.parametrize("budget", [Budget(executions=200), "200 executions"])
def test_an_executions_budget_takes_exactly_its_slots_and_finds_a_config_near_the_best_of_1200(tmp_path, budget):
    """(With the spread's upper-middle start the search ends one GROUP_M step short of BEST, 1.1x its declared
    cost, where the float ties of Python 3.11 happened to lead to BEST itself: RESULTS.md section 32.)"""
    kernel = bk.make_kernel()
    configs = autotuner(kernel).configs
    assert len(configs) == 1200
    _run(kernel, tmp_path, budget)
    (chosen,) = autotuner(kernel).cache.values()
    assert bk.cost_ms(bk.point_of(chosen)) <= 1.1 * bk.BASE_MS + 1e-9, bk.point_of(chosen)
    entry = _entry(tmp_path)
    record = entry["tuned"]["budget"]
    assert record["decided_by_budget"] and record["measure"] == "executions"
    assert record["spent"]["executions"] == 200  # exactly the budget
    explored = record["explored"]
    assert 20 < len(explored) < 100
    # Every config that ran was explored, and only those: the final run's launch is the winner's.
    assert len(set(bk.launched)) == len(explored)
    # Slots: one launch each (the final run adds one launch of the winner).
    assert len(bk.launched) == 200 + 1
    unexplored = [t for t in entry["timings"] if t.get("explored") is False]
    assert len(unexplored) == 1200 - len(explored) and all(t["failure"] is None for t in unexplored)
    rungs = _events(tmp_path, "rung")
    assert len(rungs) >= 3 and rungs[-1]["spent"]["executions"] == 200


def test_a_compiles_budget_explores_exactly_that_many_configs_and_precompiles_only_the_first_rung(tmp_path):
    kernel = bk.make_kernel()
    _run(kernel, tmp_path, "40 compiles")
    (chosen,) = autotuner(kernel).cache.values()
    # Within 1.3x of the best config's cost (the bowl is smooth: the local search walks down it).
    assert bk.cost_ms(bk.point_of(chosen)) <= 1.3 * bk.BASE_MS
    record = _entry(tmp_path)["tuned"]["budget"]
    assert record["spent"]["compiles"] == 40 and len(record["explored"]) == 40
    assert len(set(bk.launched)) == 40
    (pre,) = _events(tmp_path, "precompile")
    assert len(pre["mine"]) == 20  # the spread rung: half the explorable configs, nothing else compiled


def test_a_larger_budget_continues_from_the_entry_and_no_budget_is_not_fooled(tmp_path):
    kernel = bk.make_kernel()
    _run(kernel, tmp_path, "20 compiles")
    first = _entry(tmp_path)["tuned"]["budget"]
    assert len(first["explored"]) == 20
    # The same budget again: the entry answers, nothing runs but the call itself.
    kernel2 = bk.make_kernel()
    fn = _run(kernel2, tmp_path, "20 compiles")
    assert fn.last_call.cache_hits == 1 and len(bk.launched) == 1
    # A larger budget: continues, explores 30 more configs, none of the first 20 again but its best 3 (anchors).
    kernel3 = bk.make_kernel()
    _run(kernel3, tmp_path, "50 compiles")
    second = _entry(tmp_path)["tuned"]["budget"]
    assert second["continued"] and second["spent"]["compiles"] == 50 and len(second["explored"]) == 50
    assert set(first["explored"]) < set(second["explored"])
    names = [",".join(f"{k}={v}" for k, v in bk.point_of(c).items()) for c in autotuner(kernel3).configs]
    again = {names.index(n) for n in set(bk.launched)} & set(first["explored"])
    assert len(again) <= 3  # the anchors, re-timed to put the earlier times on today's scale
    (chosen,) = autotuner(kernel3).cache.values()
    assert bk.cost_ms(bk.point_of(chosen)) <= 1.3 * bk.BASE_MS
    # No budget: a budget-decided entry is no answer; the key is tuned whole (every config runs).
    kernel4 = bk.make_kernel()
    fn = _run(kernel4, tmp_path, None, early_stop=1.5)
    assert fn.last_call.cache_hits == 0 and len(set(bk.launched)) == 1200
    assert bk.point_of(next(iter(autotuner(kernel4).cache.values()))) == bk.BEST


def test_a_seconds_budget_stops_exploring(tmp_path):
    kernel = bk.make_kernel()
    _run(kernel, tmp_path, 3.0)
    record = _entry(tmp_path)["tuned"]["budget"]
    assert record["measure"] == "seconds" and 8 <= len(record["explored"]) < 1200
    assert record["decided_by_budget"]


def test_a_seconds_budget_with_compile_workers_explores_in_rungs_as_wide_as_the_workers():
    """A rung's configs compile side by side, so a rung costs about one compile's wall time whatever its width (up
    to the workers): rank 0 counts what is left in rungs, each as wide as its workers. A wide rung takes the fastest
    config's coupled moves (a tile step with a warps step), one-step neighbours and leaps (one parameter two steps),
    then the next parents' within 1.5x of the fastest; a config 1.53x slower is no parent."""
    configs = bk.configs()
    costs = [bk.cost_ms(bk.point_of(c)) for c in configs]
    wide = BudgetSearch(configs, "seconds", 10.0, n_repeat=3, parallel=16, first_width=16)
    first = wide.first_rung()
    assert len(first) == 16
    wide.apply(first)
    times = [costs[i] if i in first else math.inf for i in range(len(configs))]
    # The first rung took 2 s: 32 slots at 0.02 s (a step now) and 1.36 s of compiles (the start and one wave). A
    # rung of 16 costs a wave (the longest compile so far, 0.8 s, more than 1.36 / 2) and 32 slots: 1.44 s. The 8 s
    # left, less the finalists' 9 slots, buy 5 such rungs; with 0.5 s more, a last one of 8 configs as well.
    wide.note_compiles({0: 0.5, 1: 0.8, 2: 0.6})
    wide.step_s = 0.02
    assert wide.explorable_now(2.0) == 5 * 16
    wide.limit = 10.5
    assert wide.explorable_now(2.0) == 5 * 16 + 8
    wide.limit = 10.0
    rung = wide.next_rung(times, 2.0, 0.02)
    assert len(rung) == 16 and not set(rung) & set(first)
    fastest = sorted(first, key=lambda i: costs[i])[:4]
    assert [round(costs[i] / costs[fastest[0]], 2) for i in fastest] == [1.0, 1.09, 1.5, 1.53]
    coupled, (one_step, _) = wide.coupled(fastest[0]), wide.neighbours(fastest[0])
    assert len(coupled) == 4 and len(one_step) == 10  # BLOCK_K/M/N or GROUP_M with num_warps, the same way
    assert set(coupled) | set(one_step) <= set(rung)  # 14 of the 16
    leaps = wide.leaps(fastest[0])
    assert len(leaps) == 5 and set(rung) == set(coupled) | set(one_step) | set(leaps[:2])
    # A narrow rung (no workers) walks from the fastest alone while its neighbourhood lasts: no leaps.
    narrow_order = wide._local(fastest[:2], wide=False)
    assert narrow_order[:14] == coupled + one_step and not set(leaps) & set(narrow_order[:14])
    # Without workers the same state is priced per config (2 s / 16) and a rung is a quarter of what is left.
    narrow = BudgetSearch(configs, "seconds", 10.0, n_repeat=3)
    assert len(narrow.first_rung()) == 8
    narrow.apply(first)
    left = narrow.explorable_now(2.0)
    assert left == int((8.0 - 9 * 2.0 / 32) // (2.0 / 16))
    assert len(narrow.next_rung(times, 2.0)) == -(-left // 4)


def test_after_exploring_a_key_times_what_its_sibling_keys_found_fastest_once_within_its_budget(tmp_path):
    """Two keys of one kernel, tuned in the same executions: key 512 pays 0.3 ms more for 3 stages, so the two
    searches explore different configs. After its exploring rungs each key times, once, up to SIBLING_PICKS of the
    configs the other ran fastest that it has not run, within its executions budget (exactly spent still)."""
    from triton_ctx_tune.engine.budget import SIBLING_PICKS
    size = {"n": 0}
    kernel = bk.make_kernel(lambda point: 0.3 * (point["num_stages"] == 3) if size["n"] == 512 else 0.0)

    @contextual_autotune(budget="200 executions", cache=False, log_dir=str(tmp_path / "logs"), **FAST)
    def fn(x, y):
        for t in (x, y):
            size["n"] = t.numel()
            kernel[lambda meta, t=t: (triton.cdiv(t.numel(), meta["BLOCK_M"]),)](t, t.numel())
        return x, y

    fn(torch.zeros(256, device=DEVICE), torch.zeros(512, device=DEVICE))
    rungs = _events(tmp_path, "rung")
    by_key = {n: [r for r in rungs if r["key"][0] == n] for n in (256, 512)}
    ran = {n: set().union(*(set(r["configs"]) for r in rs)) for n, rs in by_key.items()}
    for n, other in ((256, 512), (512, 256)):
        # The sibling rung is the last rung that brings new configs (the halving and final rungs re-time): all of
        # them new, all run by the other key, at most SIBLING_PICKS.
        seen: set[int] = set()
        bringing = []
        for r in by_key[n]:
            if set(r["configs"]) - seen:
                bringing.append((set(r["configs"]) - seen, set(r["configs"])))
            seen |= set(r["configs"])
        new, configs = bringing[-1]
        assert new == configs and new <= ran[other] and len(new) <= SIBLING_PICKS, (n, bringing)
        assert by_key[n][-1]["spent"]["executions"] == 200
    assert {bk.point_of(c)["num_stages"] for c in autotuner(kernel).cache.values()} == {2, 3}


def test_a_slow_first_rung_still_leaves_a_local_rung_when_the_rest_pays_for_one():
    """The GEMM space's 4096-cube at 10% of a slower machine's sweep (8.3 s; RESULTS section 26, call 4): the first
    rung ended 5.0 s in. Priced at the whole first rung (2.5 s, the start counted as half) with the re-timing at the
    average slot, compiles included (15 slots at 5.0 / 32 s), nothing was left for a local rung, and the key was
    decided on its spread samples (1.73 of the best). A wave at the longest compile or at half of what the first
    rung's slots did not cost (2.42 s), slots at a step's 5 ms: one 32-wide rung fits in the 3.3 s left."""
    configs = bk.configs()
    search = BudgetSearch(configs, "seconds", 8.3, n_repeat=3, parallel=32, first_width=16)
    first = search.first_rung()
    search.apply(first)
    search.note_compiles({0: 1.6, 1: 2.0})
    times = [bk.cost_ms(bk.point_of(c)) if i in first else math.inf for i, c in enumerate(configs)]
    rung = search.next_rung(times, 5.0, 0.005)
    assert len(rung) == 32 and not set(rung) & set(first)
    search.apply(rung)
    # That rung cost 2.42 s and its 64 slots: the rest goes to the halving and the final re-timing, within the limit.
    rest = search.next_rung(times + [], 5.0 + 2.42 + 64 * 0.005, 0.005)
    assert rest and set(rest) <= search.launched and sum(rest.values()) <= (8.3 - 7.74) / 0.005


def test_the_finalists_after_a_halving_include_candidates_that_already_had_two_samples():
    """A rung that share_wave cut took its lost slots as second samples of the configs it kept; the halving then
    re-times only the candidates with one sample. The finalists are the fastest configs with two samples or more,
    not that rung's configs alone (on the device the GEMM 4096-cube's key chose its one re-timed config, 1.45 of the
    best, over three faster ones with two samples each)."""
    configs = bk.configs()
    search = BudgetSearch(configs, "executions", 400, n_repeat=5, first_width=16)
    first = search.first_rung()
    search.apply(first)
    costs = {i: float(rank + 1) for rank, i in enumerate(sorted(first))}  # ms; the fewer the faster
    fast = sorted(first)[:3]
    search.apply({i: 1 for i in fast})  # padded slots: the three fastest have two samples each
    times = [costs.get(i, math.inf) for i in range(len(configs))]
    search.phase = "halve"
    halving = search.next_rung(times, 0.0)
    assert set(halving) == set(sorted(first)[3:6])  # the 2F fastest with one sample
    search.apply(halving)
    assert search.pick_finalists(times) == fast
    final = search.next_rung(times, 0.0)
    assert set(final) == set(fast) and min(final.values()) >= 5 - 2  # (an executions budget spends the rest too)
    search.apply(final)
    assert search.pick_finalists(times) == fast


@pytest.mark.parametrize("value", ["ten runs", "2.5 compiles", -1, 0, float("inf"), True, "3 executions",
                                   Budget.__new__(Budget)])
def test_bad_budgets_say_how_to_write_one(value):
    with pytest.raises(InvalidOptionError, match="budget"):
        if isinstance(value, Budget):
            Budget(executions=10, compiles=5)
        TuneOptions(budget=value)
    with pytest.raises(InvalidOptionError, match="online"):
        TuneOptions(budget=30.0, online=True)


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_follows_rank_0s_rungs_and_budget(world, tmp_path):
    from tests.test_dist import run_ranks

    results = run_ranks(world, ["budget_executions", "budget_seconds", "budget_continue", "budget_shared_waves"],
                        tmp_path, worker="budget_worker.py")
    for name in ("budget_executions", "budget_seconds"):
        rows = results[name]
        for row in rows:
            assert "error" not in row, row.get("traceback")
        # The same rungs (every decision), winner and executions on every rank, though each rank's costs differ.
        for f in ("rungs", "winner", "executions", "explored_here", "out"):
            assert all(row[f] == rows[0][f] for row in rows), (name, f, [row[f] for row in rows])
        assert len(rows[0]["rungs"]) >= 3
        assert rows[0]["cost"] <= 1.3 * bk.BASE_MS + 0.4
    (record,) = results["budget_executions"][0]["entry"]
    assert record["spent"]["executions"] == 150 and record["decided_by_budget"]
    rows = results["budget_continue"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
    for f in ("rungs", "winner", "executions", "explored_here"):
        assert all(row["second"][f] == rows[0]["second"][f] for row in rows)
    (record,) = rows[0]["second"]["entry"]
    assert record["continued"] and len(record["explored"]) == 45
    # New configs, not repeats: 25 new ones and the earlier run's best 3 as anchors.
    assert rows[0]["second"]["explored_here"] == 25 + 3
    # Rank 0's cut of two keys' rungs to one wave of binaries is every rank's (its clock alone priced it).
    rows = results["budget_shared_waves"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
    for f in ("rungs", "executions", "winners"):
        assert all(row[f] == rows[0][f] for row in rows), (f, [row[f] for row in rows])
    assert rows[0]["shared"] and all(step["binaries"] <= step["cap"] == bk.WAVE for step in rows[0]["shared"])
    assert rows[0]["left_out"] > 0 and all(row["left_out"] == 0 for row in rows[1:])  # rank 0's own reading


def test_the_report_lists_only_the_explored_configs_and_says_how_many(tmp_path):
    from triton_ctx_tune.tools.report import build, format_report

    _run(bk.make_kernel(), tmp_path, "60 executions")
    text = format_report(build(tmp_path / "logs"))
    assert "failures   none" in text
    explored = len(_entry(tmp_path)["tuned"]["budget"]["explored"])
    assert f"budget     explored {explored} of 1200 configs" in text
    assert sum(1 for line in text.splitlines() if "BLOCK_M=" in line and line.startswith("    ")) == explored


def test_a_perf_model_with_top_k_seeds_the_first_rung(tmp_path):
    def model(**kw):  # a perfect model: the declared cost itself
        return bk.cost_ms({k: kw[k] for k in bk.SPACE})

    kernel = triton.autotune(configs=bk.configs(), key=["n"],
                             prune_configs_by={"perf_model": model, "top_k": 600})(bk._tiled_add_one)
    _run(kernel, tmp_path, "12 compiles")
    (chosen,) = autotuner(kernel).cache.values()
    assert bk.point_of(chosen) == bk.BEST
    # Triton's pruning kept the model's 600 best, best first; the first rung took the model's first picks
    # (config #0 among them) beside its spread sample, so the best was compiled before any rung was decided.
    assert len(_entry(tmp_path)["timings"]) == 600
    (pre,) = _events(tmp_path, "precompile")
    assert 0 in pre["mine"] and len(pre["mine"]) == 6
    assert len(_entry(tmp_path)["tuned"]["budget"]["explored"]) == 12


def test_a_seconds_budget_never_starts_a_final_rung_it_cannot_pay_for():
    """The halving and final rungs are priced at the cost per slot so far: with 0.5 s left at 0.3 s a slot (9.5 s
    for 32), the final re-timing takes 1 slot, not its 3 finalists x (n_repeat - 1); with nothing left, none."""
    configs = bk.configs()
    costs = [bk.cost_ms(bk.point_of(c)) for c in configs]

    def at_final(left_s: float) -> dict[int, int]:
        search = BudgetSearch(configs, "seconds", 10.0, n_repeat=5, first_width=16)
        search.apply(search.first_rung())  # 16 configs: 32 slots
        times = [costs[i] if i in search.launched else math.inf for i in range(len(configs))]
        search.phase = "final"  # (the explore and halving rungs are spent)
        return search.next_rung(times, 10.0 - left_s)

    per_slot = (10.0 - 0.5) / 32
    rung = at_final(0.5)
    assert sum(rung.values()) == int(0.5 / per_slot) == 1 and len(rung) == 1
    assert at_final(0.01) == {}
    roomy = at_final(9.0)  # 9 s left at 1/32 s a slot: the whole final, and no more
    assert sorted(roomy.values()) == [4, 4, 4]


def test_new_rungs_compile_in_a_step_of_their_own_and_decide_as_before(tmp_path, monkeypatch):
    """The executor's half of a later rung's compiles (executor._compile_rung): on a GPU each rung's new configs
    compile in the workers (tests/test_gpu.py); the interpreter has nothing to compile, so precompile.prefetch
    returns None there and the rung compiles at its launches. A thread that notes its rung and sleeps stands in
    for the workers here: each new rung then takes one step in which its key runs a config that works, untimed,
    the step's end waits for every rung started in it, and the search explores and decides exactly as it does
    without that step."""
    import threading
    import time

    from tests import kernels
    from triton_ctx_tune.compile import precompile

    # The two runs must decide alike: declared costs far above the interpreter's own time, which on a loaded
    # 2-core machine varied enough to swap two configs 2.5% apart (the clock is virtual: nothing sleeps longer).
    monkeypatch.setattr(kernels, "HOST_COST_SCALE", 10_000.0)
    kernel = bk.make_kernel()

    def tune(logs: str) -> tuple[Any, Any]:
        @contextual_autotune(budget="40 compiles", cache=False, log_dir=str(tmp_path / logs), **FAST)
        def fn(x, y):
            for t in (x, y):
                kernel[lambda meta, t=t: (triton.cdiv(t.numel(), meta["BLOCK_M"]),)](t, t.numel())
            return x, y

        x, y = torch.zeros(256, device=DEVICE), torch.zeros(512, device=DEVICE)
        fn(x, y)
        assert torch.equal(x, torch.full_like(x, fn.last_call.executions))  # +1 per execution, untimed ones too
        return fn.last_call, dict(autotuner(kernel).cache)

    plain, plain_winners = tune("plain")
    autotuner(kernel).cache.clear()
    rungs: list[tuple[tuple, list[int], float]] = []  # (key, configs, when its compile ended)

    def stand_in(state, indices, args, kwargs, threads, timeout_s=math.inf, workers=0, on_done=None):
        def run() -> None:
            time.sleep(0.02)
            rungs.append((state.key, list(indices), time.time()))
            if on_done is not None:
                on_done({i: 0.02 for i in indices})
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    monkeypatch.setattr(precompile, "prefetch", stand_in)
    staged, staged_winners = tune("staged")
    assert staged_winners == plain_winners
    events = [json.loads(x) for x in (tmp_path / "staged" / "rank-0.jsonl").read_text().splitlines()]
    later = [(i, e) for i, e in enumerate(events) if e["event"] == "rung" and e["new"]]
    assert len(later) >= 4 and len(rungs) == len(later)  # both keys, every later rung with new configs
    for i, rung in later:
        key = tuple(rung["key"])
        before = [e["step"] for e in events[:i] if e["event"] == "slot" and tuple(e["key"]) == key]
        first = next(e for e in events[i:] if e["event"] == "slot" and tuple(e["key"]) == key)
        assert first["step"] == before[-1] + 2  # the step between compiled the rung
        ended = next(t for k, configs, t in rungs if k == key and configs == sorted(rung["new"]))
        assert ended < first["time"]
    # The same search, one execution more per step that compiled rungs (the two keys' rungs share theirs).
    compile_steps = len({before_step for before_step in
                         (max(e["step"] for e in events[:i] if e["event"] == "slot") for i, _ in later)})
    assert staged.executions == plain.executions + compile_steps


def test_two_keys_rungs_that_compile_in_one_step_bring_only_the_binaries_their_budgets_pay_for(tmp_path, monkeypatch):
    """Two seconds-budgeted keys of one kernel decide their rungs in the same steps, and the rungs compile together:
    a config either key launched is compiled for both. Each key's budget pays for one wave of WAVE binaries
    (bk.OneWave); its own rung is that wide, so the two rungs together brought up to twice that, and the step cost
    two waves where each key priced one. Now rank 0 cuts them to what the budgets pay for, and every rung keeps at
    least two configs. A cut rung takes the slots it lost as more timed slots of what it kept, so the keys still
    end their rungs in the same step and share the next one's compiles too."""
    from tests import kernels
    from triton_ctx_tune.engine import executor

    monkeypatch.setattr(executor, "BudgetSearch", bk.OneWave)
    monkeypatch.setattr(kernels, "HOST_COST_SCALE", 10_000.0)  # declared costs, not a loaded machine's, rank configs
    size = {"n": 0}
    kernel = bk.make_kernel(lambda p: bk.elsewhere(p) if size["n"] == 512 else 0.0)
    rungs = _two_keys(tmp_path, kernel, size)
    shared = bk.shared_waves(rungs)
    # Every exploring rung after the first (the spread, planned before any step) is shared: the keys stay in step
    # until each has explored EXPLORE configs (a cut rung explores fewer, so there may be more than the 2 uncut).
    assert len(shared) >= (bk.EXPLORE - bk.WAVE) // bk.WAVE, shared
    for step in shared:
        assert step["cap"] == bk.WAVE and step["binaries"] <= bk.WAVE, shared
        assert min(step["sizes"]) >= 2 and len(set(step["slots"])) == 1, shared  # in step: the same slots
    assert any(sum(step["left_out"]) for step in shared)  # the cut happened: apart, they brought more
    # ... and a cut key timed the other key's new binaries in the slots it lost: they compiled in its step anyway.
    assert any(sum(step["taken"]) for step in shared), shared
    assert "configs left out: with the other keys' rungs of this step it brings" in \
        (tmp_path / "logs" / "rank-0.log").read_text()
    assert sorted(d["key"][0] for d in _events(tmp_path, "decision")) == [256, 512]
    from triton_ctx_tune.tools.report import build, format_report
    text = format_report(build(tmp_path / "logs"))
    for n in (256, 512):
        left_out = sum(r["wave"]["left_out"] for r in rungs if r["wave"] and r["key"][0] == n)
        taken = sum(r["wave"]["taken"] for r in rungs if r["wave"] and r["key"][0] == n)
        assert (f"{len(shared)} rungs compiled in one step with other keys' rungs; {left_out} configs left out of "
                f"them, to what the budgets paid for; {taken} of the other keys' new binaries taken instead") in text


def test_budgeted_keys_of_one_kernel_met_in_one_step_count_their_seconds_from_the_first_ones_launch(tmp_path,
                                                                                                     monkeypatch):
    """The second key is met 0.5 s after the first (the first execution runs the first key's launch before it), and
    both tune in the same executions from then on: its seconds count from the first key's launch, so the two keys'
    budgets end together. Counted from its own, its rungs ran on after the first key's budget was spent, and the
    first key's last rungs waited for its compiles."""
    from triton_ctx_tune.engine import executor

    monkeypatch.setattr(executor, "BudgetSearch", bk.OneWave)
    first = {"execution": True}

    def wait_once(n: int) -> None:
        if n == 1 and first["execution"]:
            first["execution"] = False
            time.sleep(0.5)
    rungs = _two_keys(tmp_path, bk.make_kernel(lambda p: 0.0), {"n": 0}, before=wait_once)
    by_key = {n: [r["spent"]["seconds"] for r in rungs if r["key"][0] == n] for n in (256, 512)}
    assert by_key[256] and by_key[512]
    # Logged one after the other at each step's end: the same clock, give or take the logging between them.
    assert abs(by_key[512][0] - by_key[256][0]) < 0.25, by_key
    assert min(by_key[512]) >= 0.5, by_key  # the wait before its first launch counts


def test_share_wave_keeps_the_shared_configs_first_then_each_keys_own_in_turn_and_evens_the_slots():
    from triton_ctx_tune.engine.budget import share_wave

    compiled = {0, 1, 2}
    a = {9: 1, 10: 1, 11: 1, 12: 1, 0: 2}  # 0: a re-timing, already compiled: it stays
    b = {20: 1, 10: 1, 21: 1, 22: 1}
    c = {30: 1, 31: 1, 10: 1, 20: 1}
    launched = [{0, 1}, {1}, {2}]
    (ca, cb, cc), binaries = share_wave([a, b, c], launched, compiled, cap=5)
    # New binaries asked for: 9 10 11 12 20 21 22 30 31 (9 > 5). 10 (three keys) and 20 (two) first, then each
    # key's own in its rung's order, round-robin: 9, 21, 30.
    assert binaries == 5
    assert set(ca) == {10, 9, 0} and set(cb) == {20, 10, 21} and set(cc) == {30, 10, 20}
    # Every rung takes as many slots as the widest did before the cut (a: 4 warm-ups and 6 timed, 10), the lost
    # ones as more timed slots of what it kept, round-robin in the rung's order.
    def slots(rung, mine):
        return sum(t + (j not in mine) for j, t in rung.items())
    assert [slots(r, m) for r, m in zip((ca, cb, cc), launched)] == [10, 10, 10]
    assert ca == {9: 3, 10: 2, 0: 3} and cb == {20: 3, 10: 2, 21: 2}
    # Within the cap nothing changes; at a cap below two per key, each keeps two anyway.
    assert share_wave([a, b], launched[:2], compiled, cap=9) == ([a, b], 7)
    cut, binaries = share_wave([{5: 1, 6: 1, 7: 1}, {8: 1, 9: 1, 10: 1}], [set(), set()], set(), cap=1)
    assert [sorted(r) for r in cut] == [[5, 6], [8, 9]] and binaries == 4

    # Given what each key may still explore, a cut rung first takes the step's other new binaries (they compile for
    # the other keys anyway), a warm-up and a timed slot each, in the wave's order (10 20 9 21 30); then more timed
    # slots. The binaries stay the same five.
    fresh = [set(range(40)) - m for m in launched]
    fresh[0].discard(20)  # (known to fail for the first key, say)
    (ca, cb, cc), binaries = share_wave([a, b, c], launched, compiled, cap=5, unexplored=fresh)
    assert binaries == 5
    assert ca == {9: 1, 10: 1, 0: 2, 21: 1, 30: 1}
    assert cb == {20: 1, 10: 1, 21: 1, 9: 1, 30: 1} and cc == {30: 1, 10: 1, 20: 1, 9: 1, 21: 1}
    assert [slots(r, m) for r, m in zip((ca, cb, cc), launched)] == [10, 10, 10]
