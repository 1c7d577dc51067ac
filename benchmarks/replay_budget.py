"""Replay the budgeted search (engine/budget.py) against a recorded exhaustive sweep, on the CPU, in seconds.

    python benchmarks/replay_budget.py benchmarks/results/2026-11-26-2xH200/gemm1152-32937b8.json.gz
    python benchmarks/replay_budget.py <table.json.gz> --measure compiles --limit 100 --seeds 50
    python benchmarks/replay_budget.py <table.json.gz> --compiles <gemm1152-compile-s-*.json.gz> --limit 7.09

bench_gemm_space.py's exhaustive arm records every config's reduced time per shape (`runs[0].reduced`). Here a
BudgetSearch walks that table: each timed slot draws the config's recorded time with noise (a per-run offset
and a per-sample one, lognormal, --noise), rank 0's clock advances by a cost model of the device run (--rung-s
per wave of compiles as wide as --parallel, --slot-s per slot, --start-s for the first rung's start), and the
search decides as it does on a GPU. With --compiles, the first rung leaves out its stragglers as precompile
does (a config compiling longer than budget.STRAGGLERS times the rung's median fails; the wave ends at the
cutoff). It prints, per shape, in how many of --seeds runs the choice is within 3% of the table's best, and the
worst ratio. A strategy change can be judged on recorded data before a device
call (the 10% seconds budget, 32 workers: 40 of 120 runs within 3% before the coupled moves, 118 after).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from triton_ctx_tune.compile.precompile import straggler_cutoff  # noqa: E402
from triton_ctx_tune.engine.budget import (  # noqa: E402
    PARENT_BAND,
    STRAGGLERS,
    BudgetSearch,
    share_wave,
    tile_weight,
)


def load(path: str | Path) -> dict[str, dict[str, float | None]]:
    """{shape: {config label: ms or None}} from bench_gemm_space's JSON (the exhaustive arm's reduced times)."""
    opener: Any = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["runs"][0]["reduced"]


def load_compiles(path: str | Path) -> dict[str, float]:
    """{config label: compile seconds}: each config's span in a sweep's precompile event (a worker, 32 at once)."""
    with gzip.open(path, "rt") as f:
        return json.load(f)


def config_of(label: str) -> Any:
    """A triton.Config from a label such as "BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3"."""
    from triton import Config

    values = {k: int(v) for k, v in (p.split("=") for p in label.split(", "))}
    launch = {k: values.pop(k) for k in ("num_warps", "num_stages") if k in values}
    return Config(values, **launch)


def replay(table: dict[str, float | None], seed: int, measure: str = "seconds", limit: float = 6.8,
           parallel: int = 32, first_width: int = 16, noise: float = 0.015, rung_s: float = 1.2,
           slot_s: float = 0.035, start_s: float = 0.8, compile_s: float | None = None,
           compiles: dict[str, float] | None = None) -> tuple[float, int, float]:
    """One budgeted search over `table`: (its choice's recorded time over the best, configs explored, seconds).
    `compile_s`: a config's own compile time as rank 0 notes it (default rung_s; on a GPU the longest is often more
    than a wave's wall time). `compiles`: each config's recorded compile seconds (load_compiles): a wave then
    costs its longest, and rank 0 predicts them from the configs' weights (budget.tile_weight)."""
    labels = list(table)
    truth = [t if t is not None and math.isfinite(t) else math.inf for t in table.values()]
    rng = random.Random(seed)
    offset = [math.exp(rng.gauss(0.0, noise)) for _ in labels]
    search = BudgetSearch([config_of(label) for label in labels], measure, limit, 5, parallel=parallel,
                          first_width=first_width, weight=tile_weight if compiles is not None else None)
    samples: dict[int, list[float]] = {}

    def times() -> list[float]:
        return [sorted(samples[i])[len(samples[i]) // 2] if i in samples else math.inf for i in range(len(labels))]

    elapsed, rung = start_s, search.first_rung()
    while rung:
        planned = search.apply(rung)
        for i, _, timed in planned:
            if math.isfinite(truth[i]):
                samples.setdefault(i, []).extend(truth[i] * offset[i] * math.exp(rng.gauss(0.0, noise / 2))
                                                 for _ in range(timed))
        fresh = [i for i, warm, _ in planned if warm]
        if compiles is None:
            search.note_compiles({i: rung_s if compile_s is None else compile_s for i in fresh})
            elapsed += rung_s * math.ceil(len(fresh) / parallel)
        else:
            seconds = {i: compiles.get(labels[i], rung_s) for i in fresh}
            if len(search.rungs) == 1 and len(fresh) <= parallel:  # the first rung leaves out its stragglers
                cutoff = straggler_cutoff(seconds.values(), len(seconds), search.stragglers)
                for i in [i for i, t in seconds.items() if t > cutoff]:
                    del seconds[i]
                    samples.pop(i, None)
                    search.failed.add(i)
                elapsed += min(cutoff, max(compiles.get(labels[i], rung_s) for i in fresh))
            else:
                elapsed += sum(max(list(seconds.values())[k:k + parallel]) for k in range(0, len(fresh), parallel))
            search.note_compiles(seconds)
        elapsed += slot_s * sum(w + t for _, w, t in planned)  # a failed config's slots run another config
        rung = search.next_rung(times(), elapsed, slot_s)
    now = times()
    winner = min(search.pick_finalists(now), key=lambda i: now[i])
    return truth[winner] / min(truth), len(search.launched), elapsed


def makespan(seconds: list[float], workers: int) -> float:
    """The wall time of compiles handed out in this order to the first free of `workers` workers."""
    free = [0.0] * max(workers, 1)
    for t in seconds:
        k = free.index(min(free))
        free[k] += t
    return max(free, default=0.0)


def replay_together(tables: dict[str, dict[str, float | None]], seed: int, limit: float, compiles: dict[str, float],
                    parallel: int = 32, first_width: int = 16, noise: float = 0.015, slot_s: float = 0.002,
                    start_s: float = 0.8, share: bool = True,
                    wave_scale: float = 1.0) -> dict[str, tuple[float, int, float]]:
    """The shapes' keys searched side by side in one process, as bench_gemm_space's budgeted arm runs them: the keys
    meet in the same executions, so each round plans every undecided key's rung; the round's new binaries (a config
    that any key compiled is a cache hit for the others: the shapes specialize alike) compile at once on `parallel`
    workers, in the order the keys ask for them; the round's steps take the longest rung's slots. After its last
    exploring rung a key is offered the others' fast configs (siblings), as decisions.py does. Per shape: (ratio to
    the best, configs explored, seconds). `wave_scale`: the later rungs' compile steps this much slower than the
    recorded compiles say (on the device, 1.2x in section 29's call 3 and 1.9x in call 2); `share`: rank 0 cuts a
    step's rungs to the binaries the budgets pay for (decisions._share_waves)."""
    shapes = list(tables)
    labels = list(tables[shapes[0]])
    rng = random.Random(seed)
    configs = [config_of(label) for label in labels]
    truth = {sh: [t if t is not None and math.isfinite(t) else math.inf for t in (tables[sh].get(lb) for lb in labels)]
             for sh in shapes}
    offset = {sh: [math.exp(rng.gauss(0.0, noise)) for _ in labels] for sh in shapes}
    search = {sh: BudgetSearch(configs, "seconds", limit, 5, parallel=parallel, first_width=first_width,
                               weight=tile_weight) for sh in shapes}
    samples: dict[str, dict[int, list[float]]] = {sh: {} for sh in shapes}
    compiled: set[int] = set()
    left_out: set[int] = set()  # the first rung's stragglers (every key's first rung is the same spread)

    def times(sh: str) -> list[float]:
        got = samples[sh]
        return [sorted(got[i])[len(got[i]) // 2] if i in got else math.inf for i in range(len(labels))]

    def siblings(sh: str) -> list[int]:
        ratio: dict[int, float] = {}
        for other in shapes:
            if other != sh:
                t = times(other)
                fastest = min(t)
                for j, v in enumerate(t):
                    if math.isfinite(v) and v <= PARENT_BAND * fastest:
                        ratio[j] = min(ratio.get(j, math.inf), v / fastest)
        return sorted(ratio, key=lambda j: (ratio[j], j))

    elapsed = start_s
    rungs = {sh: search[sh].first_rung() for sh in shapes}
    done: dict[str, float] = {}
    while rungs:
        planned = {sh: search[sh].apply(rung) for sh, rung in rungs.items()}
        new = [i for sh in planned for i, warm, _ in planned[sh] if warm and i not in compiled]
        new = list(dict.fromkeys(new))
        seconds = {i: compiles.get(labels[i], 1.0) for i in new}
        if not compiled:  # the first rung: stragglers left out
            cutoff = straggler_cutoff(seconds.values(), len(seconds), STRAGGLERS)
            left_out = {i for i, t in seconds.items() if t > cutoff}
            elapsed += min(cutoff, makespan(sorted(seconds.values()), parallel))
        else:
            elapsed += makespan(list(seconds.values()), parallel) * wave_scale
        compiled.update(new)
        for sh in planned:
            search[sh].note_compiles({i: t for i, t in seconds.items() if i not in left_out})
            search[sh].failed |= left_out
            for i, _, timed in planned[sh]:
                if math.isfinite(truth[sh][i]) and i not in left_out:
                    samples[sh].setdefault(i, []).extend(
                        truth[sh][i] * offset[sh][i] * math.exp(rng.gauss(0.0, noise / 2)) for _ in range(timed))
        elapsed += slot_s * max(sum(w + t for _, w, t in p) for p in planned.values())
        rungs = {}
        for sh in planned:
            rung = search[sh].next_rung(times(sh), elapsed, slot_s, siblings(sh))
            if rung:
                rungs[sh] = rung
            else:
                done[sh] = elapsed
        exploring = [sh for sh in rungs if search[sh].phase == "explore"]
        if share and len(exploring) > 1:
            room = max(min(search[sh].explorable_now(elapsed) for sh in exploring), 2)
            cut, _ = share_wave([rungs[sh] for sh in exploring], [search[sh].launched for sh in exploring],
                                set().union(*(search[sh].launched for sh in shapes)), room,
                                [set(search[sh].unexplored()) for sh in exploring])
            rungs.update(zip(exploring, cut))
    out = {}
    for sh in shapes:
        now = times(sh)
        winner = min(search[sh].pick_finalists(now), key=lambda i: now[i])
        out[sh] = (truth[sh][winner] / min(truth[sh]), len(search[sh].launched), done[sh])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="+", help="bench_gemm_space JSON results (.json or .json.gz)")
    p.add_argument("--measure", default="seconds", choices=("seconds", "compiles", "executions"))
    p.add_argument("--limit", type=float, default=6.8, help="the budget (default: 10%% of a 68 s sweep)")
    p.add_argument("--parallel", type=int, default=32, help="compile workers (a seconds budget's rung width)")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--noise", type=float, default=0.015)
    p.add_argument("--compiles", help="each config's recorded compile seconds (e.g. gemm1152-compile-s-*.json.gz)")
    p.add_argument("--together", action="store_true",
                   help="the shapes' keys side by side in one process (replay_together; needs --compiles)")
    p.add_argument("--wave-scale", type=float, default=1.0,
                   help="--together: later compile steps this much slower than the recorded compiles")
    p.add_argument("--no-share", action="store_true", help="--together: the step's rungs are not cut to the budget")
    p.add_argument("--start-s", type=float, default=0.8,
                   help="the first rung's start beyond its longest compile (the workers' start; on the 2-H200 host "
                        "of RESULTS section 28 the first rung of 16 took 2.9 to 3.3 s in all)")
    a = p.parse_args(argv)
    compiles = load_compiles(a.compiles) if a.compiles else None
    if a.together and compiles is None:
        p.error("--together needs --compiles (each config's recorded compile seconds)")
    within = total = 0
    for path in a.tables:
        if a.together:
            tables = load(path)
            together = [replay_together(tables, s, a.limit, compiles or {}, a.parallel, noise=a.noise,
                                        start_s=a.start_s, share=not a.no_share, wave_scale=a.wave_scale)
                        for s in range(a.seeds)]
            for shape in tables:
                runs = [t[shape] for t in together]
                ok = sum(r <= 1.03 for r, _, _ in runs)
                within, total = within + ok, total + len(runs)
                print(f"{Path(path).name} {shape} (together): within 1.03 in {ok}/{len(runs)}, worst "
                      f"{max(r for r, _, _ in runs):.3f}, {min(n for _, n, _ in runs)} to {max(n for _, n, _ in runs)} "
                      f"configs explored, at most {max(t for _, _, t in runs):.2f} s")
            continue
        for shape, table in load(path).items():
            runs = [replay(table, s, a.measure, a.limit, a.parallel, noise=a.noise, compiles=compiles,
                           start_s=a.start_s) for s in range(a.seeds)]
            ok = sum(r <= 1.03 for r, _, _ in runs)
            within, total = within + ok, total + len(runs)
            worst = max(r for r, _, _ in runs)
            print(f"{Path(path).name} {shape}: within 1.03 in {ok}/{len(runs)}, worst {worst:.3f}, "
                  f"{runs[0][1]} configs explored, {runs[0][2]:.1f} s")
    print(f"all: within 1.03 in {within}/{total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
