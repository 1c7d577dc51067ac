"""Budgeted search: a kernel key whose config space is larger than its budget covers (options.Budget).

The key is searched in *rungs*. Each rung is a set of configs with a number of timed slots each; a
config the run has not launched yet also takes one warm-up slot (its first launch compiles and loads
it). At a rung's end the step's decision (decisions.py) gathers every rank's times and reduces them;
rank 0 asks `BudgetSearch.next_rung` for the next rung and broadcasts it in the keep-mask, and every
rank adds the same slots to its plan (`apply`). So the plan depends only on agreed times and on rank
0's measure of the budget: which collective a rank issues next never depends on its own state.

The rungs, in order:

1. **Spread.** Half of the configs the budget can explore, chosen to cover the space: a
   farthest-point sample over each config's tile coordinates (BLOCK_*, GROUP_*, num_warps,
   num_stages, any other meta-parameter: each value's rank among that parameter's values, scaled to
   [0, 1]), starting from the config nearest the upper middle of the space. When the kernel has a
   `perf_model` with a `top_k`, Triton's own pruning has already cut and sorted the configs by it: the
   model's first picks take half of this rung.
2. **Local search.** Rungs of about an eighth of the explorable configs each (a seconds budget: as wide as
   the compile workers, below): the unexplored neighbours of the three fastest configs so far (those within
   1.5x of the fastest): the fastest's coupled moves first (a meta-parameter and num_warps one step each, the
   same way: a larger tile wants more warps), then one parameter one step up or down, round-robin over the
   parents, then two parameters at once; when none is left, more spread samples. Until the budget for new
   configs is spent. A rung's new configs compile side by side before its first slot.
3. **Siblings.** Up to SIBLING_PICKS configs that other budgeted keys of the same kernel ran fastest, not run
   here, one slot each (next_rung's `siblings`; the decisions layer reads rank 0's per-launch times of them).
4. **Halving.** The 2F fastest (F = 3 finalists) get one more timed slot each; then the F fastest by
   their samples so far are re-timed, interleaved, up to `n_repeat` samples each. With an executions
   budget, the final rung also takes whatever slots are left, so the key spends exactly its budget.

The winner is chosen among the finalists by the usual near-tie rule (state.stable_winner).

Budgets (each per key): `executions` counts slots (warm-ups included), `compiles` counts distinct
configs launched, `seconds` is rank 0's wall clock from the key's first launch; rank 0 converts what is
left into a number of new configs at each rung's end from what a config has cost so far, and the
first spread rung is sized before anything is measured (EARLY_RUNG configs). With compile workers a rung
costs about one compile's wall time whatever its width up to theirs, so the first rung is wider
(FIRST_RUNG_WITH_WORKERS), the later rungs are as wide as rank 0's workers, and what is left buys rungs
priced as a wave of compiles (what the last rung cost beyond its slots) plus their slots at what a step
costs now, after the re-timing's slots are set aside; the last rung may be narrower, and a rung leaves out
the configs whose predicted compile (from their weight and the compiles seen so far) the rest cannot pay
for (on 1152 GEMM configs, rungs priced per config were 2 or 3 configs wide: 16 configs explored in 5.6 s;
priced at the whole first rung, a slow start left no local rung; priced at the last rung alone, a rung of
large tiles ran 10% of the sweep to 12.4%). The first rung's precompile leaves out a config still compiling
after STRAGGLERS times the rung's median compile, once half of it has compiled. Keys of one kernel whose rungs
compile in one step bring together at most the binaries their budgets pay for (share_wave). Once the seconds are
spent, the key is decided on the samples it has (no halving or final re-timing). So a seconds budget is
overrun by at most one rung's misprediction.

A cache entry written by a budgeted search records what it explored and spent (`tuned.budget`); a later
run whose budget goes further continues from it (`Prior`): it re-times the earlier run's best
(anchors), carries the other explored configs' times over on the anchors' scale, never explores a
config twice, and counts its budget cumulatively (a budget of 400 after 200 spends 200 more).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..runtime.compat import tile_stages_warps

FINALISTS = 3  # F: configs re-timed to n_repeat samples before the decision
TOP_PARENTS = 3  # the fastest configs whose neighbours the local search explores
PARENT_BAND = 1.5  # ... those within this factor of the fastest
EARLY_RUNG = 8  # the first rung of a seconds budget, sized before any config was measured
MODEL_MIN = 8  # configs whose compile time is known before a rung's compiles are predicted from them
# ... raised by the farthest of their own times above the fitted line (a rung ends with its slowest compile: in
# the replay of recorded compile times, the 80th and 95th percentiles of those distances overran budgets by 3.5%)
MODEL_QUANTILE = 1.0
FIRST_RUNG_WITH_WORKERS = 16  # ... when compile workers compile it side by side (its wall time is about one's)
# A seconds budget's first rung does not wait for a config still compiling after this many times the median compile
# of the rung's configs, once half of them have compiled: the GEMM space's first rung of 16 waited 2.9 s of its 7.4 s
# for 256x256 tiles on 4 warps, 3.4 to 4.7 s to compile (the others 0.2 to 1.2 s) and 9 to 50 times slower than the
# best. (A share of the budget instead, 15%, left out nearly every config of a function space's points, whose
# budgets are shares of the call's: 1.15 to 1.51 of the best on all-gather + GEMM at 10%.)
STRAGGLERS = 3.0
# After its last exploring rung, a key also times up to this many of the configs that other budgeted keys of the same
# kernel found fastest and it has not run (next_rung's `siblings`): shapes that specialize alike share binaries, so
# they cost slots, not compiles (the GEMM space's 4096-cube and 16384x1024 shapes: each one's 5 fastest within 1 to
# 4% of the other's best; each key explored 48 of 1152 configs, and the three explored 80 between them).
SIBLING_PICKS = 8
MEASURES = ("executions", "compiles", "seconds")


def tile_weight(config: Any) -> float:
    """What a seconds budget predicts a config's compile time from (on a line fitted in log-log to the compiles seen so
    far): its tile times num_stages times num_warps (tile_stages_warps).

    precompile.compile_weight, the tile per warp times stages, orders compiles better and fits the GEMM space's
    recorded compile times better (rank correlation 0.87 against 0.67 over its 990 configs). The budget stays on this
    one: replayed on that sweep (40 seeds x 3 shapes, 10% of it), its rungs cut by the other explored less (6.16 s of
    7.09 on average against 6.49) and came within 1.03 of the best in 103 of 120 runs against 112 (RESULTS.md section
    51)."""
    tile, stages, warps = tile_stages_warps(config)
    return float(tile * stages * warps)
LAUNCH_PARAMS = ("num_warps", "num_stages", "num_ctas", "maxnreg")  # a config's coordinates beside its meta-parameters


@dataclass
class Prior:
    """What an earlier budgeted search of this key explored, on every rank (the lookup's broadcast)."""
    times: list[float]  # per config, ms on the earlier run's scale; nan: not explored; inf: failed
    spent: dict[str, float]  # that run's executions, compiles and seconds (cumulative over its own priors)

    @property
    def explored(self) -> set[int]:
        return {i for i, t in enumerate(self.times) if not math.isnan(t)}


def coordinates(configs: list[Any]) -> tuple[list[str], list[tuple[int, ...]], list[int]]:
    """Each config's coordinates: per parameter (meta-parameters, num_warps, num_stages, ...), the rank of its
    value among that parameter's values; the parameter names; and how many values each takes."""
    rows: list[dict[str, Any]] = []
    for c in configs:
        row = dict(getattr(c, "kwargs", {}) or {})
        for name in LAUNCH_PARAMS:
            value = getattr(c, name, None)
            if value is not None:
                row[name] = value
        rows.append(row)
    names = sorted({k for r in rows for k in r})

    def order(v: Any) -> tuple[int, Any]:
        return (0, float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, repr(v))

    values = {n: sorted({order(r.get(n)) for r in rows}) for n in names}
    coords = [tuple(values[n].index(order(r.get(n))) for n in names) for r in rows]
    return names, coords, [len(values[n]) for n in names]


@dataclass
class BudgetSearch:
    """One key's rungs. Every rank holds one; rank 0's next_rung() decides, every rank apply()s."""
    configs: list[Any]
    measure: str
    limit: float
    n_repeat: int
    model_ranked: bool = False  # the config list is sorted by the kernel's perf_model (Triton's pruning)
    # How many configs compile side by side (the rank's compile workers; 1: none). A seconds budget is spent
    # in rungs whose cost is mostly their compile's wall time, which does not grow with the rung's size up to
    # this width: its rungs are this wide, and what is left is counted in rungs rather than in configs.
    # (Rank 0's own setting: only its next_rung() reads it.)
    parallel: int = 1
    # The first rung of a seconds budget, sized before anything is measured. Every rank computes that rung, so
    # this reads only what is the same on every rank (executor: wider when compile workers are on).
    first_width: int = EARLY_RUNG
    prior: Prior | None = None
    failed: set[int] = field(default_factory=set)  # known before the search (quarantined, carried failures)
    # Agreed state, the same on every rank: what the plan holds so far.
    launched: set[int] = field(default_factory=set)  # configs with a slot in this run
    timed: dict[int, int] = field(default_factory=dict)  # planned timed slots per config
    slots: int = 0
    rungs: list[list[int]] = field(default_factory=list)
    finalists: list[int] | None = None
    last_retimed: bool = False  # the last rung re-timed configs already launched (halving, final)
    # Rank 0's own progress through the phases (only rank 0's next_rung() is ever followed).
    phase: str = "explore"
    explore_total: int = 0  # new configs the budget allows (counted budgets)
    step_s: float | None = None  # what a step costs on rank 0 now (next_rung's argument): a slot that compiles nothing
    # A config's relative compile cost (tile_weight; rank 0's own): with the compile times noted so
    # far it predicts a rung's longest compile, and a seconds budget leaves out what it cannot pay for.
    weight: Callable[[Any], float] | None = None
    compile_seconds: dict[int, float] = field(default_factory=dict)  # rank 0's compile time per config noted
    last_wave_s: float | None = None  # what the last rung with new configs cost beyond its slots (rank 0's clock)
    # The last rung on rank 0's clock: (elapsed seconds when planned, its new configs, its slots).
    _last_rung: tuple[float, int, int] = field(default=(0.0, 0, 0), init=False)
    sibling_room: int = 0  # SIBLING_PICKS once rank 0's next_rung was offered siblings: their slots are kept
    # Rank 0: how the last rung shared its step's compiles with other keys' rungs (decisions._share_waves): how many
    # rungs, the new binaries they bring together, the cap, and how many configs of this rung it left out.
    wave: dict[str, int] | None = None

    def __post_init__(self) -> None:
        assert self.measure in MEASURES
        self.names, self.coords, sizes = coordinates(self.configs)
        # Each parameter's ranks scaled to [0, 1], in integers: 2 * rank * (L / (size - 1)) with L the least common
        # multiple of the (size - 1)s, so that distances are exact. (In floats, the spread's ties broke one way under
        # Python 3.11's sum() and another under 3.12's compensated one: two first rungs for one space.)
        span = math.lcm(*(s - 1 for s in sizes if s > 1)) if any(s > 1 for s in sizes) else 1
        self.scale = [2 * span // (s - 1) if s > 1 else 0 for s in sizes]
        # Where the spread starts: each parameter's middle value, the upper one of the two where it takes an even
        # number of values (BLOCK_N in 32..256: 128, not 64; 8 warps of 4 and 8). Larger tiles, more warps and deeper
        # pipelines are where a compute-bound kernel's fast configs lie on current GPUs, and the rest of the first
        # rung is the farthest from it. On the GEMM space's recorded sweeps (3 x 3 shapes x 3 seeds, RESULTS.md
        # section 32) the upper middle found each shape within 1.03 of the best in 27 of 27 replays at 5% and at 10%
        # of the sweep; the lower one in 0 and 17 of 27.
        self._start = tuple(2 * (s // 2) * (span // (s - 1)) if s > 1 else 0 for s in sizes)
        self.where: dict[tuple[int, ...], int] = {}
        for i, c in enumerate(self.coords):
            self.where.setdefault(c, i)
        self._mindist = [math.inf] * len(self.configs)
        for i in self.prior.explored if self.prior is not None else ():
            self._note_explored(i)
        self.explore_total = self.explorable_now(0.0)

    # ---- budget ---------------------------------------------------------------------------------

    @property
    def n(self) -> int:
        return len(self.configs)

    def spent(self, elapsed_s: float) -> dict[str, float]:
        """What the key has cost, cumulatively over the runs it continues."""
        before = self.prior.spent if self.prior is not None else {}
        explored = self.launched | (self.prior.explored if self.prior is not None else set())
        return {"executions": before.get("executions", 0.0) + self.slots, "compiles": float(len(explored)),
                "seconds": before.get("seconds", 0.0) + elapsed_s}

    def _retime_slots(self) -> int:
        """Slots the halving and final rungs may take."""
        return 2 * FINALISTS + FINALISTS * max(self.n_repeat - 2, 0)

    def _reserve_slots(self) -> int:
        """Slots kept from exploring: the re-timing's, and a warm-up and a slot for each sibling pick once
        sibling keys are known (rank 0's next_rung notes it)."""
        return self._retime_slots() + 2 * self.sibling_room

    def explorable_now(self, elapsed_s: float) -> int:
        """How many new configs the budget still allows (rank 0's view for seconds)."""
        left = self.limit - self.spent(elapsed_s)[self.measure]
        if self.measure == "compiles":
            return max(int(left), 0)
        if self.measure == "executions":  # a small budget keeps most of itself for exploring
            return max(int((left - min(self._reserve_slots(), self.limit // 4)) // 2), 0)
        if not self.launched:
            return self.first_width
        slot = self._slot_s(elapsed_s)
        room = left - self._reserve_slots() * slot  # the halving and final rungs re-time: slots that compile nothing
        if self.parallel > 1:
            # A rung of up to `parallel` new configs costs one wave of compiles (about its longest compile,
            # whatever its width) plus a warm-up and a timed slot per config. A wave is priced at what the last
            # rung with new configs cost beyond its slots; after the first rung, at the longest compile so far, or
            # at what the first rung cost beside its slots, counted twice since it also paid the start (workers, a
            # fresh process's first compiles), if more. (The longest compile alone, 2 s or more where a 32-wide
            # rung took 1.5 s, priced the 10% GEMM budget out of its third rung.) What is left buys
            # whole rungs, then a narrower last one. Priced at the whole first rung, with the re-timing at the
            # average slot (compiles included), a slow first rung (5.0 s of 8.3 on the GEMM space's 4096-cube)
            # left no local rung at all.
            wave = (self.last_wave_s if self.last_wave_s is not None else
                    max(self.longest_compile_s, max(elapsed_s - self.slots * slot, 0.0) / (len(self.rungs) + 1)))
            per_rung = wave + 2 * self.parallel * slot
            whole = max(int(room // max(per_rung, 1e-9)), 0)
            rest = room - whole * per_rung
            last = int((rest - wave) // max(2 * slot, 1e-9)) if rest > wave else 0
            return whole * self.parallel + (last if 2 <= last < self.parallel else 0)
        per_config = elapsed_s / max(len(self.launched), 1)
        return max(int(room // max(per_config, 1e-9)), 0)

    @property
    def stragglers(self) -> float:
        """The first rung's precompile leaves out (failed, on every rank, as a compile timeout is) a config still
        compiling after this many times the median compile of the rung: STRAGGLERS for a seconds budget; never
        for the other measures, which do not count compile time."""
        return STRAGGLERS if self.measure == "seconds" else math.inf

    def note_compiles(self, seconds: dict[int, float]) -> None:
        """Rank 0's compile times of configs of this key (a rung's, as they end): what a wave of compiles costs."""
        self.compile_seconds.update(seconds)

    @property
    def longest_compile_s(self) -> float:
        """The longest compile of a config of this key noted so far on rank 0."""
        return max(self.compile_seconds.values(), default=0.0)

    def _compile_model(self) -> Callable[[int], float] | None:
        """Config index -> its predicted compile seconds: a line through log(seconds) over log(weight) of the configs
        compiled so far, raised to MODEL_QUANTILE of their distances from it; None until MODEL_MIN are known."""
        weight = self.weight
        if weight is None:
            return None
        points = [(math.log(w), math.log(t)) for i, t in self.compile_seconds.items()
                  if t > 0 and (w := weight(self.configs[i])) > 0]
        if len(points) < MODEL_MIN:
            return None
        mx = sum(x for x, _ in points) / len(points)
        my = sum(y for _, y in points) / len(points)
        sxx = sum((x - mx) ** 2 for x, _ in points)
        slope = min(max(sum((x - mx) * (y - my) for x, y in points) / sxx, 0.0), 1.0) if sxx > 0 else 0.0
        above = sorted(y - my - slope * (x - mx) for x, y in points)[int(MODEL_QUANTILE * (len(points) - 1))]
        return lambda j: math.exp(my + slope * (math.log(max(weight(self.configs[j]), 1e-9)) - mx) + above)

    def _affordable(self, rung: dict[int, int], elapsed_s: float) -> dict[int, int]:
        """A seconds budget's exploring rung, less the configs whose compile it cannot pay for: the rung's longest
        predicted compile plus its slots must fit what is left after the re-timing (the GEMM space's third rung,
        priced at the second's cost, reached the large tiles, compiled longer, and ran 10% of the sweep to 12.4%).
        The cheapest to compile stay."""
        model = self._compile_model() if self.measure == "seconds" and self.parallel > 1 else None
        if model is None:
            return rung
        slot = self._slot_s(elapsed_s)
        room = self.limit - self.spent(elapsed_s)["seconds"] - self._reserve_slots() * slot
        cost = {j: model(j) for j in rung}
        kept: list[int] = []
        for j in sorted(rung, key=lambda j: (cost[j], j)):
            if cost[j] + 2 * (len(kept) + 1) * slot > room:
                break
            kept.append(j)
        return {j: t for j, t in rung.items() if j in kept}  # in the rung's order: its best candidates first

    def _slot_s(self, elapsed_s: float) -> float:
        """What one more slot costs on rank 0: a step's seconds where measured, at most the average slot so far."""
        average = elapsed_s / max(self.slots, 1)
        return min(self.step_s, average) if self.step_s is not None else average

    def unexplored(self) -> list[int]:
        """The configs this search may still explore: not launched here, not explored by the run it continues, not
        known to fail."""
        known = self.launched | (self.prior.explored if self.prior is not None else set())
        return [i for i in range(self.n) if i not in known and i not in self.failed]

    # ---- rungs ----------------------------------------------------------------------------------

    def first_rung(self) -> dict[int, int]:
        """The spread rung (and, continuing, the earlier run's best few as anchors)."""
        rung: dict[int, int] = {}
        if self.prior is not None:
            ranked = sorted((t, i) for i, t in enumerate(self.prior.times) if math.isfinite(t))
            rung.update({i: 1 for _, i in ranked[:FINALISTS]})
        want = self.explore_total if self.measure == "seconds" else -(-self.explore_total // 2)
        want = min(max(want, 2 - len(rung)), len(self.unexplored()))
        if self.model_ranked:
            rung.update({i: 1 for i in self.unexplored()[: want // 2]})
        rung.update({i: 1 for i in self.spread(want - (len(rung) - len(rung.keys() & self._anchor_set())), rung)})
        return rung

    def _anchor_set(self) -> set[int]:
        return self.prior.explored if self.prior is not None else set()

    def spread(self, k: int, taken: dict[int, int] | set[int]) -> list[int]:
        """k unexplored configs far from everything explored (and from each other): a farthest-point sample."""
        pool = [i for i in self.unexplored() if i not in taken]
        if k <= 0 or not pool:
            return []
        mind = list(self._mindist)
        for i in taken:
            self._update(mind, i)
        out: list[int] = []
        mid = self._start
        for _ in range(min(k, len(pool))):
            if all(math.isinf(mind[i]) for i in pool):  # nothing explored yet: start at the (upper) middle
                best = min(pool, key=lambda i: (self._dist_to(i, mid), i))
            else:
                best = max(pool, key=lambda i: (mind[i], -i))
            out.append(best)
            pool.remove(best)
            self._update(mind, best)
        return out

    def _point(self, i: int) -> tuple[int, ...]:
        return tuple(c * s for c, s in zip(self.coords[i], self.scale))

    def _dist_to(self, i: int, p: tuple[int, ...]) -> int:
        return sum((a - b) ** 2 for a, b in zip(self._point(i), p))

    def _update(self, mind: list[float], j: int) -> None:
        pj = self._point(j)
        for i in range(self.n):
            d = self._dist_to(i, pj)
            if d < mind[i]:
                mind[i] = d

    def _note_explored(self, i: int) -> None:
        self._update(self._mindist, i)

    def neighbours(self, i: int) -> tuple[list[int], list[int]]:
        """Configs one parameter one step away, and those two parameters one step each."""
        c = self.coords[i]
        single, double = [], []
        for a in range(len(c)):
            for da in (-1, 1):
                j = self.where.get(c[:a] + (c[a] + da,) + c[a + 1:])
                if j is not None:
                    single.append(j)
                for b in range(a + 1, len(c)):
                    for db in (-1, 1):
                        moved = list(c)
                        moved[a] += da
                        moved[b] += db
                        j = self.where.get(tuple(moved))
                        if j is not None:
                            double.append(j)
        return single, double

    def coupled(self, i: int) -> list[int]:
        """Configs with one meta-parameter and num_warps one step each, the same way: a larger tile wants more
        warps, and either step alone can be slower (the 4096-cube's best, 128x256 with 8 warps, is two steps
        from 128x128 with 4, where the local search settled at 1.15 of the best: RESULTS.md section 25)."""
        if "num_warps" not in self.names:
            return []
        w, c, out = self.names.index("num_warps"), self.coords[i], []
        for a, name in enumerate(self.names):
            if name in LAUNCH_PARAMS:
                continue
            for d in (1, -1):
                moved = list(c)
                moved[a] += d
                moved[w] += d
                if (j := self.where.get(tuple(moved))) is not None:
                    out.append(j)
        return out

    def leaps(self, i: int) -> list[int]:
        """Configs one parameter two steps away: a parameter whose best value lies two steps off (a deeper pipeline,
        num_stages 3 to 5) is reached in one rung, not two."""
        c, out = self.coords[i], []
        for a in range(len(c)):
            for d in (2, -2):
                if (j := self.where.get(c[:a] + (c[a] + d,) + c[a + 1:])) is not None:
                    out.append(j)
        return out

    def _local(self, parents: list[int], wide: bool) -> list[int]:
        """The local search's candidates in order: the fastest parent's coupled moves (a tile step with a warps
        step) and one-step neighbours first; then, for a wide rung, which must reach far in one go, the fastest's
        leaps, the other parents' one-step neighbours and coupled moves round-robin, then every parent's two-step
        ones; a narrow rung (there are more of them) walks down from the best, parent by parent."""
        if not parents:
            return []
        tiers = [(self.coupled(p), *self.neighbours(p)) for p in parents]
        if not wide:
            return [j for pair, one, two in tiers for j in pair + one + two]
        (pair, one, _), rest = tiers[0], tiers[1:]
        return (pair + one + self.leaps(parents[0]) + _round_robin([o for _, o, _ in rest])
                + _round_robin([p for p, _, _ in rest]) + _round_robin([t for _, _, t in tiers]))

    def current_times(self, times: list[float]) -> list[float]:
        """Each config's best-known time: this run's, else an earlier run's on this run's scale (anchors)."""
        out = list(times)
        if self.prior is None:
            return out
        ratios = sorted(times[i] / self.prior.times[i] for i in self.prior.explored
                        if math.isfinite(times[i]) and math.isfinite(self.prior.times[i]) and self.prior.times[i] > 0)
        scale = ratios[len(ratios) // 2] if ratios else 1.0
        for i in self.prior.explored:
            if i not in self.launched:
                out[i] = self.prior.times[i] * scale
        return out

    def ranked(self, times: list[float]) -> list[int]:
        return sorted((i for i, t in enumerate(times) if math.isfinite(t)), key=lambda i: (times[i], i))

    def next_rung(self, times: list[float], elapsed_s: float, step_s: float | None = None,
                  siblings: list[int] | None = None) -> dict[int, int]:
        """Rank 0, at a rung's end: {config: timed slots} of the next rung; {} when it is time to decide.
        `times` are the reduced times of this run (inf: failed or not timed); `step_s`: what a step costs now;
        `siblings`: configs other budgeted keys of the same kernel found fast, the fastest first (rank 0's
        reading: the rung it decides is broadcast)."""
        if step_s is not None:
            self.step_s = step_s
        if siblings and self.measure != "compiles":
            self.sibling_room = SIBLING_PICKS
        began, new, slots = self._last_rung
        if new and len(self.rungs) > 1:  # a later rung with new configs: what a wave costs, measured
            self.last_wave_s = max(elapsed_s - began - slots * self._slot_s(elapsed_s), 0.0)
        self._last_rung = (elapsed_s, 0, 0)
        now = self.current_times(times)
        ranked = self.ranked(now)
        if self.phase == "explore":
            left = min(self.explorable_now(elapsed_s), len(self.unexplored()))
            if left > 0:
                # Counted budgets: rungs of an eighth of what they may explore; seconds: as wide as the compile
                # workers (each rung costs about one compile's wall time), else a quarter of what is left at each
                # rung's end, so that rank 0 re-measures what a config costs as it goes.
                if self.measure != "seconds":
                    per = -(-self.explore_total // 8)
                else:
                    per = self.parallel if self.parallel > 1 else -(-left // 4)
                size = min(left, max(2, per))
                rung: dict[int, int] = {}
                fresh = set(self.unexplored())
                # Parents: the fastest few, within PARENT_BAND of the fastest (on 1152 GEMM configs the spread
                # rung's second and third were 2.7x slower: their neighbourhoods took two thirds of the next rung).
                parents = [i for i in ranked[:TOP_PARENTS] if now[i] <= PARENT_BAND * now[ranked[0]]]
                for j in self._local(parents, wide=self.measure == "seconds" and self.parallel > 1):
                    if len(rung) < size and j in fresh:
                        rung[j] = 1
                rung.update({i: 1 for i in self.spread(size - len(rung), rung)})
                rung = self._affordable(rung, elapsed_s)
                if rung:
                    return rung
            self.phase = "siblings"
        if self.phase in ("siblings", "halve", "final") and self._out_of_time(elapsed_s):
            self.phase = "done"  # a seconds budget already spent: decide on the samples there are
        if self.phase == "siblings":
            self.phase = "halve"
            if picks := self._sibling_rung(siblings or [], elapsed_s):
                return picks
        if self.phase == "halve":
            self.phase = "final"
            mine = [i for i in ranked if i in self.launched]
            halve = {i: 1 for i in mine[: 2 * FINALISTS] if self.timed.get(i, 0) < 2}
            if len(mine) > FINALISTS and halve and ((room := self._slots_left(elapsed_s)) is None
                                                             or room >= len(halve) + FINALISTS):
                return halve
        if self.phase == "final":
            self.phase = "done"
            finalists = self.pick_finalists(times)
            rung = {i: max(self.n_repeat - self.timed.get(i, 0), 0) for i in finalists}
            if (spare := self._slots_left(elapsed_s)) is not None:
                while sum(rung.values()) > spare and any(rung.values()):  # never past the budget
                    worst = max((i for i in finalists if rung[i]), key=finalists.index)
                    rung[worst] -= 1
                k = 0
                while sum(rung.values()) < spare and finalists and self.measure == "executions":  # spent exactly
                    rung[finalists[k % len(finalists)]] += 1
                    k += 1
            rung = {i: r for i, r in rung.items() if r > 0}
            if rung:
                return rung
        return {}

    def _sibling_rung(self, siblings: list[int], elapsed_s: float) -> dict[int, int]:
        """Up to SIBLING_PICKS of `siblings` this key has not run, one timed slot each, as far as the budget's slots
        (after the halving and final re-timing) pay for a warm-up and a slot each; none under a compiles budget,
        where each would count as a compile."""
        if self.measure == "compiles":
            return {}
        known = self.launched | self.failed | (self.prior.explored if self.prior is not None else set())
        picks = [j for j in siblings if j not in known][:SIBLING_PICKS]
        if (room := self._slots_left(elapsed_s)) is not None:
            picks = picks[: max((room - self._retime_slots()) // 2, 0)]
        return {j: 1 for j in picks}

    def _out_of_time(self, elapsed_s: float) -> bool:
        return self.measure == "seconds" and self.spent(elapsed_s)["seconds"] >= self.limit

    def _slots_left(self, elapsed_s: float) -> int | None:
        """Slots the budget still pays for: an executions budget's, or a seconds budget's at what a slot costs now
        (_slot_s), so that the halving and final rungs never start what they cannot finish (they crossed 10% of
        the GEMM sweep by 0.1 to 1%); None for a compiles budget."""
        if self.measure == "executions":
            return int(self.limit - self.spent(elapsed_s)["executions"])
        if self.measure == "seconds" and self.slots:
            return max(int((self.limit - self.spent(elapsed_s)["seconds"]) / max(self._slot_s(elapsed_s), 1e-9)), 0)
        return None

    def pick_finalists(self, times: list[float]) -> list[int]:
        """The configs the decision chooses among, the same on every rank (it reads only the reduced times and
        the agreed plan): after a re-timing rung (the final, or the halving), the F fastest of the configs with at
        least as many timed samples as the fewest of that rung's, so that no config with fewer samples slips in;
        after an exploring rung (a seconds budget ran out), the F fastest launched in this run.

        (Not the F fastest of that rung alone: a halving re-times only the candidates with one sample, and a
        candidate that already had two, from a rung that share_wave cut and padded, is one too. On the GEMM space's
        4096-cube the halving re-timed one config, the fastest three had two samples each, and the key chose the
        one re-timed config at 1.45 of the exhaustive best: RESULTS.md section 32.)"""
        now = self.current_times(times)
        pool = self.launched
        if self.rungs and self.last_retimed:
            least = min(self.timed.get(i, 0) for i in self.rungs[-1])
            pool = {i for i in self.launched if self.timed.get(i, 0) >= least}
        return [i for i in self.ranked(now) if i in pool][:FINALISTS]

    def apply(self, rung: dict[int, int]) -> list[tuple[int, int, int]]:
        """Every rank: add the rung to the agreed state; (config, warm-ups, timed slots) per config, by index."""
        self.last_retimed = all(i in self.launched for i in rung)
        out = []
        for i in sorted(rung):
            warm = 0 if i in self.launched else 1
            out.append((i, warm, rung[i]))
            if i not in self.launched:
                self.launched.add(i)
                self._note_explored(i)
            self.timed[i] = self.timed.get(i, 0) + rung[i]
            self.slots += warm + rung[i]
        self.rungs.append(sorted(rung))
        self._last_rung = (self._last_rung[0], sum(w for _, w, _ in out), sum(w + t for _, w, t in out))
        return out

    def record(self, elapsed_s: float, decided_by_budget: bool) -> dict[str, Any]:
        """What the cache entry keeps (tuned.budget): a later run with a larger budget continues from it."""
        explored = sorted(self.launched | (self.prior.explored if self.prior is not None else set()))
        return {"measure": self.measure, "limit": self.limit, "spent": self.spent(elapsed_s),
                "explored": explored, "rungs": len(self.rungs), "finalists": self.finalists,
                "decided_by_budget": decided_by_budget, "continued": self.prior is not None,
                "space": self.n}


def share_wave(rungs: list[dict[int, int]], launched: list[set[int]], compiled: set[int],
               cap: int, unexplored: list[set[int]] | None = None) -> tuple[list[dict[int, int]], int]:
    """Rank 0: the exploring rungs that several seconds-budgeted keys of one kernel decided in the same step, cut
    so that together they bring at most `cap` new binaries (the configs the most constrained key's budget pays
    for, priced in waves of its workers). They compile in one step (executor.prefetch), and a config any of the
    keys launched is a cache hit for the others (shapes that specialize alike), so the step costs the union's
    waves, while each key priced its own rung alone: three GEMM keys' third rungs of 32 brought 65 binaries to 32
    workers (in the replay of RESULTS section 29's call 3 with waves 1.25x slower, 9% past the budget).

    `launched`: each rung's key's launched configs; `compiled`: every config any key of the kernel launched. Kept
    first: configs that several keys asked for, then each key's own in its rung's order, round-robin; a config
    already compiled always stays, and each key keeps at least two configs of its rung. A cut rung takes the slots
    it lost first as the step's other new binaries that it has not explored (`unexplored`: each key's), a warm-up
    and a timed slot each: they compile for the other keys anyway, so they cost it slots, not compiles (on 2 H200s
    the 4096-cube's rung was cut from 32 configs to 20 beside two keys that compiled the other 12). Then as more
    timed slots of the configs it kept, so that the keys' rungs still end in the same step and share the next
    one's compiles too. Returns the rungs and how many new binaries they bring."""
    wanted: dict[int, list[int]] = {}  # new binary -> its places in the rungs that ask for it
    for rung in rungs:
        for place, j in enumerate(j for j in rung if j not in compiled):
            wanted.setdefault(j, []).append(place)
    if len(wanted) <= cap:
        return rungs, len(wanted)
    shared = sorted((j for j in wanted if len(wanted[j]) > 1), key=lambda j: (-len(wanted[j]), min(wanted[j]), j))
    own = _round_robin([[j for j in rung if j in wanted and len(wanted[j]) == 1] for rung in rungs])
    chosen = set((shared + own)[:cap])
    for rung in rungs:  # at least two per key: a rung of one config decides nothing
        for j in [j for j in rung if j not in compiled and j not in chosen][:max(
                0, min(2, len(rung)) - sum(j in compiled or j in chosen for j in rung))]:
            chosen.add(j)

    def slots(rung: dict[int, int], mine: set[int]) -> int:
        return sum(t + (j not in mine) for j, t in rung.items())

    target = max(slots(rung, mine) for rung, mine in zip(rungs, launched))
    wave = [j for j in shared + own if j in chosen] + sorted(chosen - set(shared + own))
    takeable = unexplored if unexplored is not None else [set() for _ in rungs]
    out = []
    for k, (rung, mine) in enumerate(zip(rungs, launched)):
        kept = {j: t for j, t in rung.items() if j in compiled or j in chosen}
        for j in wave:
            if target - slots(kept, mine) < 2:
                break
            if j not in kept and j in takeable[k]:
                kept[j] = 1
        order = itertools.cycle([j for j in rung if j in kept])
        for _ in range(target - slots(kept, mine)):
            kept[next(order)] += 1
        out.append(kept)
    return out, len(chosen)


def _round_robin(lists: list[list[int]]) -> list[int]:
    """The first of each list, then the second of each, ..."""
    out: list[int] = []
    for row in itertools.zip_longest(*lists):
        out += [j for j in row if j is not None]
    return out
