"""Tunables and their slot schedule: a kernel key (KeyState) here, a function's space in search.py.

Without early stopping a state owns `len(configs) * (n_warmup + n_repeat)` slots: config 0's
warm-up slots, then its timed slots, then config 1's, and so on. With early stopping it first
*screens*: one warm-up and one timed slot per config; the step's collective then keeps the
configs within `early_stop` times the best, and only those get their remaining slots, taken
round-robin so that every config is measured across the same stretch of time. Every
launch of the key takes the next slot, so the number of function executions depends on the
config count and on decisions every rank receives from the same broadcast, never on which
configs fail locally: ranks stay in lockstep.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..runtime.compat import Autotuner, Config, config_str
from ..store.incremental import Plan
from .budget import BudgetSearch


@dataclass(frozen=True)
class Slot:
    config: int
    iteration: int  # counts warm-up and timed launches of this config from 0
    timed: bool  # this rank records a sample
    # The slot's place in the plan's shape, the same on every rank at the same index even when `timed` is
    # not (a split screening's padding, a lockstep slot only one rank times): what may stand in for it, or
    # be dropped, is decided by this, so that every rank takes the same number of slots.
    # None: a warm-up exactly where it is untimed.
    shape_warmup: bool | None = field(default=None, compare=False)

    @property
    def warmup(self) -> bool:
        return not self.timed if self.shape_warmup is None else self.shape_warmup


@dataclass
class SlotRecord:
    """What happened in one slot, kept until the step ends and it is logged."""
    slot: Slot | None  # None: a launch after the schedule ran out, before the decision
    ran: int | None  # the config index actually launched (fallbacks differ from slot.config)
    sample: Callable[[], float] | None = None  # resolves to milliseconds at the end of the step
    failure: str | None = None
    ms: float | None = None
    lead_s: float | None = None  # a timed launch's GPU sleep before its start event (runtime/timing.HostLead)


@dataclass(kw_only=True)
class Tunable:
    """A tuning choice with a slot plan: a kernel key (KeyState) or a function's space (search.PointTunable).

    A slot is one measurement of one config: one launch for a kernel timed per launch, one whole
    execution for anything timed end to end. The plan, screening and statistics are the same for
    every kind; what a config *is*, and where a winner goes, is each kind's own.
    """
    configs: list[Any]
    n_warmup: int
    n_repeat: int
    samples: list[list[Callable[[], float]]] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)
    works: set[int] = field(default_factory=set)
    records: list[SlotRecord] = field(default_factory=list)
    early_stop: float | None = None  # keep configs within this factor of the best after screening
    plan: list[Slot] = field(default_factory=list)
    next_slot: int = 0
    screening: bool = False  # the plan so far is the screening pass; its end is a pruning decision
    dropped: set[int] = field(default_factory=set)
    precompiled: bool = False
    winner: int | None = None
    started: float = field(default_factory=time.perf_counter)
    tuning_s: float = 0.0
    # Held after screening (a kernel of a function-level point that may yet be dropped): the
    # survivors wait here, and the screening's best runs meanwhile, until resume() or the end.
    held: list[int] | None = None
    provisional: int | None = None
    # A budgeted key held after its first rung: the next rung, agreed already, planned at resume() (issue 35: a
    # function space's budget ran out before its best point had its first end-to-end sample).
    held_rung: dict[int, int] | None = None
    # Configs that take no slot: their times were carried over from an earlier tuning (incremental.py).
    carried: set[int] = field(default_factory=set)
    # Configs an earlier tuning found among the fastest, timed again to calibrate (incremental.py's anchors).
    # Screening has nothing to find out about them, so their screening sample is the first of their
    # survivor samples rather than one more (keep()).
    anchors: set[int] = field(default_factory=set)
    # Confirmation (decisions.py): the close candidates that were re-timed, interleaved, before the decision.
    confirmed: list[int] | None = None
    # An end-to-end confirmation's fresh samples are whole steps: the per-launch ones it replaced stay here.
    launch_samples: list[list[Callable[[], float]]] | None = None
    # An end-to-end confirmation is a race (race()): its rounds still to plan, and the candidates it left behind.
    confirm_left: int = 0
    # A per-launch confirmation's interleaved rounds: each candidate's time is the statistic of at least that many
    # samples, which narrows the tie band it is judged with (stable_winner's `samples`).
    confirmed_rounds: int = 0
    raced_out: set[int] = field(default_factory=set)
    # A per-launch confirmation that waits while keys launched before this one still change config from step to
    # step (decisions.py, confirm_after): the keys it waits for, and its rounds. Its candidates wait in `held`, and
    # its fastest so far (`provisional`) runs meanwhile, untimed.
    confirm_waits: list[Any] | None = None
    confirm_waiting_rounds: int = 0
    # Split screening: (rank, world) when the ranks share the screening pass, each screening a different
    # share of the configs in the same executions (the function still runs in lockstep).
    share: tuple[int, int] | None = None
    split: bool = False
    screen_ms: list[float] | None = None  # each config's screening time, on the one rank that measured it
    launched_here: set[int] = field(default_factory=set)  # split: the configs this rank has launched
    # A screening's survivors are timed one round at a time, on every rank alike (keep()): the configs in the
    # current round and the rounds still to plan. Each round's end lets decisions.py drop those far behind (the MLP
    # op's GEMMs kept 9 or 10 of 18 configs at 1.5x, and 4 rounds of them were 40 of its 75 executions).
    lockstep: list[int] = field(default_factory=list)
    lockstep_left: int = 0
    lockstep_out: set[int] = field(default_factory=set)  # survivors that left (in raced_out too)
    readmitted: list[int] = field(default_factory=list)
    # Budgeted search (budget.py): the plan grows one rung at a time, each decided at the last one's end.
    budget: BudgetSearch | None = None
    later: set[int] = field(default_factory=set)  # configs not in the first rung: precompile leaves them
    # A function space's call budget ran out (search.force_decide): decided at this step's end on its samples.
    forced: bool = False
    forced_checked: set[int] = field(default_factory=set)  # configs a forced decision ran once on every rank
    prefetch: list[int] = field(default_factory=list)  # a later rung's new configs, to compile in the background

    def __post_init__(self) -> None:
        self.samples = [[] for _ in self.configs]
        if self.budget is not None:
            self.early_stop, self.screening = None, False
            rung = self.budget.first_rung()
            self.later = set(range(len(self.configs))) - set(rung)
            self.add_rung(rung)
            self.prefetch = []  # the first rung is precompiled
            return
        self.screening = self.early_stop is not None and self.n_repeat > 1
        first = (self.screening_warmups(), 1) if self.screening else (self.n_warmup, self.n_repeat)
        pool = [c for c in range(len(self.configs)) if c not in self.carried]
        share = self.share if self.screening and len(pool) > 1 else None
        self.split = share is not None and share[1] > 1
        if share is None or not self.split:
            self._extend(pool, *first)
            return
        # Rank r screens configs r, r+W, ...; a rank with a smaller share runs untimed launches of a config
        # it has, so every rank takes the same number of slots and the executions stay in lockstep.
        rank, world = share
        mine = pool[rank::world]
        self._extend(mine, *first)
        # Padding mirrors a share's shape (warm-ups, then one place for a sample) with untimed launches of a
        # config this rank has, so every rank's plan has the same length and warm-up positions.
        pad = (mine or pool)[0]
        for _ in range(-(-len(pool) // world) - len(mine)):
            done = sum(1 for s in self.plan if s.config == pad)
            self.plan += [Slot(pad, done + i, timed=False, shape_warmup=i < first[0]) for i in range(sum(first))]
        self.launched_here = {pad} | set(mine)

    def screening_warmups(self) -> int:
        """Warm-ups before a config's screening sample: one launch is enough to load and warm a kernel."""
        return min(self.n_warmup, 1)

    def survivor_warmups(self) -> int:
        """Warm-ups a screening's survivor takes before its remaining timed slots. A precompiled config has been
        compiled, loaded and launched once: more warm-ups add nothing."""
        return 0 if self.precompiled else max(self.n_warmup - 1, 0)

    def _extend(self, configs: Iterable[int], warmups: int, timed: int, interleave: bool = False) -> None:
        configs = list(configs)
        done = {c: sum(1 for s in self.plan if s.config == c) for c in configs}
        if not interleave:
            for c in configs:
                self.plan += [Slot(c, done[c] + i, timed=i >= warmups) for i in range(warmups + timed)]
            return
        # Round-robin: each round times every config once, so slow drift (clocks, temperature) during
        # tuning lands on all of them alike instead of on whichever config was measured last.
        for i in range(warmups + timed):
            self.plan += [Slot(c, done[c] + i, timed=i >= warmups) for c in configs]

    @property
    def total_slots(self) -> int:
        return len(self.plan)

    @property
    def exhausted(self) -> bool:
        return self.next_slot >= len(self.plan)

    @property
    def decided(self) -> bool:
        return self.winner is not None

    @property
    def settled(self) -> bool:
        """Decided, or held after screening: its launches run one known config and take no slot."""
        return self.winner is not None or self.held is not None

    def peek(self) -> Slot | None:
        return None if self.exhausted else self.plan[self.next_slot]

    def take_slot(self) -> Slot | None:
        if self.exhausted:
            return None
        self.next_slot += 1
        return self.plan[self.next_slot - 1]

    def keep(self, survivors: list[int]) -> None:
        """End the screening pass: only `survivors` get their remaining warm-ups and timed slots."""
        self.screening = False
        self.dropped = set(range(len(self.configs))) - set(survivors)
        if self.split:
            # Anchors too take every lockstep slot: their screening sample came from one rank only.
            self._time_in_lockstep([c for c in survivors if c not in self.carried], one_round=self.races())
            return
        warmups = self.survivor_warmups()
        timed = [c for c in survivors if c not in self.carried]
        # A survivor earns its n_repeat - 1 timed slots with a screening sample that asked whether it was worth
        # them; an anchor was already known to be (the old entry's fastest, or its winner), so its screening
        # sample, which calibrated the screening's scale, counts as the first of those slots: n_repeat - 1
        # samples in all, every round but the last taken in step with the new configs'.
        if self.anchors or not self.races():
            self._extend(timed, warmups, self.n_repeat - 1 - bool(self.anchors), interleave=True)
            if self.anchors:
                self._extend([c for c in timed if c not in self.anchors], 0, 1, interleave=True)
            return
        # One round at a time, as after a split screening: each round's end may drop the survivors far behind.
        self._extend(timed, warmups, min(1, self.n_repeat - 1), interleave=True)
        self.lockstep, self.lockstep_left = timed, max(self.n_repeat - 2, 0)

    def races(self) -> bool:
        """Whether a screening's survivors are timed one round at a time, those far behind leaving after each
        (decisions.py, _lockstep_stay): a kernel key timed per launch, not a function's points."""
        return False

    def _time_in_lockstep(self, configs: list[int], one_round: bool = False) -> None:
        """After a split screening: every rank takes the same slots of `configs`, round-robin, so every
        rank's data counts and the executions stay in lockstep: as many as a lockstep screening's survivors
        take (n_repeat - 1, at least 2). A rank's first slot of a config it did not screen is its warm-up
        (loading the kernel); the rank that screened it times every slot and keeps its screening sample.
        With `one_round`, only the first round is planned, and next_lockstep_round() plans each later one."""
        done = {c: sum(1 for s in self.plan if s.config == c) for c in configs}
        rounds = max(self.n_repeat - 1, 2)
        if one_round:
            self.lockstep, self.lockstep_left, rounds = list(configs), rounds - 1, 1
        for i in range(rounds):
            # (the first round loads a config on the ranks that did not screen it: untimed there, never dropped)
            self.plan += [Slot(c, done[c] + i, timed=i > 0 or c in self.launched_here, shape_warmup=False)
                          for c in configs]
        self.launched_here.update(configs)

    def next_lockstep_round(self, stay: list[int]) -> None:
        """A round of the survivors has run: those in `stay` get the next one, the others leave the race (raced_out).
        Every rank has launched each survivor by now, so every slot of the round is timed."""
        self.lockstep_out |= set(self.lockstep) - set(stay)
        self.raced_out |= self.lockstep_out
        self.lockstep = [c for c in self.lockstep if c in stay]
        self.lockstep_left -= 1
        self._extend(self.lockstep, 0, 1, interleave=True)

    def add_rung(self, rung: dict[int, int]) -> None:
        """A budgeted search's next rung, the same on every rank: a config not launched yet takes a warm-up
        (its first launch compiles and loads it), then its timed slots; configs already launched are
        re-timed round-robin."""
        assert self.budget is not None
        planned = self.budget.apply(rung)
        self.later -= set(rung)
        self.prefetch = [c for c, warm, _ in planned if warm and c not in self.failures]
        for c, warm, timed in planned:
            if warm:
                self._extend([c], warm, timed)
        again = [(c, timed) for c, warm, timed in planned if not warm]
        for i in range(max((t for _, t in again), default=0)):
            self._extend([c for c, t in again if t > i], 0, 1)

    def readmit(self, configs: list[int]) -> None:
        """A split screening's dropped configs that the survivors' lockstep times put back within reach."""
        self.readmitted += configs
        self.dropped -= set(configs)
        self._time_in_lockstep(configs)

    def check_everywhere(self, configs: list[int]) -> None:
        """A forced decision (the call's budget spent) whose configs were not all timed on every rank: these run one
        lockstep round first (the plan is exhausted: the key was finishing), and are not checked again."""
        self.forced_checked.update(configs)
        self._time_in_lockstep(configs)

    def confirm(self, candidates: list[int], rounds: int, end_to_end: bool = False) -> None:
        """Re-time the close candidates before deciding: `rounds` more timed slots each, round-robin, so that
        they are also compared over the same stretch of time. Per launch, the rounds add to the samples the
        candidates already have, and the decision takes the statistic of all of them: on the MLP op's GELU
        (2 H200s), the confirmation's rounds alone chose the config both oracles put first in 24 of 31
        decisions, and all of a candidate's samples in 30 (RESULTS.md section 45). With `end_to_end`, each
        slot is a whole step timed end to end, what the candidate does to the rest of the call counts too, and
        the decision takes those samples alone (a per-launch span and a whole step do not mix)."""
        self.confirmed = list(candidates)
        if end_to_end:
            self.end_to_end = True
            self.launch_samples = [list(taken) for taken in self.samples]
            for c in candidates:
                self.samples[c] = []
            # A round end to end costs a whole step per candidate (half of all-gather + GEMM's default tuning):
            # one round is planned at a time, and each round's end drops the candidates far behind (race()).
            self.confirm_left, rounds = rounds - 1, 1
        else:
            self.confirmed_rounds = rounds
        self._extend(candidates, 0, rounds, interleave=True)

    def confirm_after(self, candidates: list[int], rounds: int, best: int, waits: list[Any]) -> None:
        """confirm(candidates, rounds), once no key in `waits` changes its config from step to step any more (each
        candidate is then timed after the same kernels as the others); `best` runs until then, untimed."""
        self.held, self.provisional = list(candidates), best
        self.confirm_waits, self.confirm_waiting_rounds = list(waits), rounds

    def release_confirmation(self) -> None:
        rounds = self.confirm_waiting_rounds
        candidates, _ = self.unhold()
        assert candidates is not None
        self.confirm(candidates, rounds)

    def racing(self) -> list[int]:
        """The confirmation's candidates still in its race."""
        return [c for c in self.confirmed or [] if c not in self.raced_out]

    def race(self, stay: list[int]) -> None:
        """An end-to-end confirmation's round has run: the candidates in `stay` get one more round, interleaved."""
        self.raced_out |= set(self.racing()) - set(stay)
        self.confirm_left -= 1
        self._extend(stay, 0, 1, interleave=True)

    def skip_warmups(self) -> None:
        """Drop the warm-ups not yet taken: online, once every config is compiled and loaded, since
        there each slot costs a call of the user's program and a loaded config's first launch is a
        fair sample (screening keeps only those within early_stop of the best, and re-times them)."""
        self.plan = self.plan[:self.next_slot] + [s for s in self.plan[self.next_slot:] if not s.warmup]

    def hold(self, survivors: list[int], best: int) -> None:
        """End the screening pass, but plan nothing more until resume(): `best` runs meanwhile."""
        self.screening = False
        self.dropped = set(range(len(self.configs))) - set(survivors)
        self.held, self.provisional = survivors, best

    def hold_rung(self, rung: dict[int, int], best: int) -> None:
        """A budgeted key's first rung has run while its point is screened: plan nothing more until resume(),
        which plans `rung`; `best` runs meanwhile."""
        self.held, self.provisional, self.held_rung = sorted(rung), best, rung

    def unhold(self) -> tuple[list[int] | None, dict[int, int] | None]:
        """Let go of what hold() or hold_rung() kept, planning nothing: (the survivors, the rung) held."""
        held = self.held, self.held_rung
        self.held, self.provisional, self.held_rung = None, None, None
        self.confirm_waits, self.confirm_waiting_rounds = None, 0
        return held

    def resume(self) -> None:
        if self.confirm_waits is not None:
            self.release_confirmation()
            return
        survivors, rung = self.unhold()
        if rung is not None:
            self.add_rung(rung)
        elif survivors is not None:
            self.keep(survivors)

    def fail(self, config: int, reason: str) -> None:
        self.failures.setdefault(config, reason)
        self.works.discard(config)

    def unplan(self, configs: Iterable[int]) -> None:
        """Take the slots of `configs` that have not run out of the plan (they would only be skipped), when every rank
        holds the same plan (not a split screening, whose shares differ) and the ranks agreed on `configs`: each
        rank drops the same slots and they stay in lockstep."""
        gone = set(configs)
        if gone and not self.split:
            self.plan = self.plan[:self.next_slot] + [s for s in self.plan[self.next_slot:] if s.config not in gone]

    def fallback(self, untried: bool = False) -> int | None:
        """A config already known to work on this rank, to keep the function running; with `untried`,
        when none is, the first config that has not failed."""
        usable = sorted(self.works - self.failures.keys())
        if not usable and untried:
            usable = [i for i in range(len(self.configs)) if i not in self.failures]
        return usable[0] if usable else None

    def describe(self) -> str:
        """What ranks must agree on before tuning."""
        raise NotImplementedError

    def _measured(self, samples: list[list[Callable[[], float]]] | None = None) -> list[list[float] | None]:
        """Per config its samples in ms; None for failed or unmeasured."""
        out: list[list[float] | None] = []
        for i, taken in enumerate(self.samples if samples is None else samples):
            values = [s() for s in taken]
            bad = i in self.failures or not values or any(math.isnan(v) for v in values)
            out.append(None if bad else values)
        return out

    def local_fastest(self) -> list[float]:
        """Per config its fastest sample in ms; +inf for failed or unmeasured (the survivors' race judges by it)."""
        return [math.inf if values is None else min(values) for values in self._measured()]

    def local_stats(self, stat: str, samples: list[list[Callable[[], float]]] | None = None
                    ) -> list[tuple[float, float, float]]:
        """Per config (statistic, 20th, 80th percentile) in ms; +inf for failed or unmeasured."""
        return [(math.inf, math.inf, math.inf) if values is None else summarize(values, stat)
                for values in self._measured(samples)]


@dataclass(kw_only=True)
class KeyState(Tunable):
    """One (Autotuner, key): its configs are triton.Configs, its winner goes into Autotuner.cache."""
    autotuner: Autotuner
    key: tuple
    kernel: str
    configs: list[Config]
    reset_pending: bool = False  # the final run's first launch zeroes reset_to_zero args, as Triton's does
    key_id: str = ""  # the cache identity's id: what quarantine records name
    point: int | None = None  # the function-level point it is tuned under (None: no space)
    end_to_end: bool = False  # judged by whole executions (objective="end_to_end"), not per launch
    compiling: Any = None  # precompile.Precompiling while its configs compile behind the step that met it
    proven: set[int] = field(default_factory=set)  # configs whose launch completed under the quarantine's note
    incremental: Plan | None = None  # only the config list changed since its cache entry: what is re-timed
    overlapped: bool = False  # a timed launch ran while another stream of the function was busy (streams.py)
    scale: float | None = None  # incremental: the anchors' new/old time ratio at the last decision
    # Configs precompile could not build on some rank (agreed), and why: their launch decides (executor._try).
    rejected: dict[int, str] = field(default_factory=dict)
    disagreed: set[int] = field(default_factory=set)  # of those, the ones whose launch worked here
    # While its configs compile: the slots below this index are of configs every rank has compiled (agreed at a
    # step's end, schedule.py), so they are taken and timed before the compiles are gathered.
    early_until: int = 0

    @property
    def config_ids(self) -> tuple[int, ...]:
        """Its configs by identity: keys of one kernel whose pruned config lists are the same share indices, and a
        config one of them compiled is a cache hit for the others when they specialize alike."""
        return (id(self.autotuner), *map(id, self.configs))

    def launch_times(self, stat: str) -> list[float] | None:
        """Each config's time per launch on this rank (inf: none), kept through an end-to-end confirmation;
        None for a key judged end to end from its start."""
        if self.launch_samples is not None:
            samples = self.launch_samples
        elif self.end_to_end:
            return None
        else:
            samples = self.samples
        return [t for t, _, _ in self.local_stats(stat, samples)]

    def describe(self) -> str:
        """What ranks must agree on before tuning: kernel, key and the pruned configs in order."""
        where = "" if self.point is None else f" point#{self.point}"
        return f"{self.kernel} key={self.key!r}{where} configs=[{'; '.join(config_str(c) for c in self.configs)}]"

    def races(self) -> bool:
        # Not a kernel of a function-level point: its point is judged by the call's time, and its close
        # candidates are confirmed end to end (decisions.py).
        return self.point is None and not self.end_to_end

    def times_early(self, world: int) -> bool:
        """Whether, re-executing, this key may time the configs every rank has compiled while the others still
        compile: its plan's order of configs is this rank's own (alone, or a split screening's share), and it is
        neither a budgeted search (its rungs compile as they come) nor judged end to end. Agreed facts only."""
        return self.budget is None and not self.end_to_end and (world == 1 or self.split)

    def ready_first(self, ready: Collection[int]) -> int:
        """While this key's configs compile: move the slot groups of the configs in `ready` (compiled on this rank)
        ahead of the others and return how many slots from next_slot on are theirs (at most all but the plan's last,
        so that the plan cannot run out before the compiles are gathered). A group is one config's warm-ups and
        timed slots; every group of the plan's first pass has one shape, so the new order changes which config a
        slot launches, never where the warm-ups are: the plan keeps the shape every rank agrees on. 0 where the
        rest of the plan is not such groups."""
        size = self.screening_warmups() + 1 if self.screening else self.n_warmup + self.n_repeat
        start = self.next_slot
        head_end = min(len(self.plan), -(-start // size) * size)  # the rest of the group next_slot is inside of
        head, rest = self.plan[start:head_end], self.plan[head_end:]
        groups = [rest[i:i + size] for i in range(0, len(rest), size)]
        shape = [slot.warmup for slot in self.plan[:size]]
        if any(len(g) != size or [slot.warmup for slot in g] != shape or len({slot.config for slot in g}) != 1
               for g in groups) or (head and head[0].config not in ready):
            return 0
        first = [g for g in groups if g[0].config in ready]
        self.plan = self.plan[:head_end] + [slot for g in first + [g for g in groups if g[0].config not in ready]
                                            for slot in g]
        return max(0, min(len(head) + size * len(first), len(self.plan) - start - 1))

    def step_config(self) -> int:
        """The config every launch of this key runs in a step where it is not the one measured."""
        if self.winner is not None:
            return self.winner
        if self.provisional is not None:
            return self.provisional
        usable = [i for i in range(len(self.configs)) if i not in self.failures]
        return usable[0] if usable else 0


def summarize(values: list[float], stat: str) -> tuple[float, float, float]:
    """(stat, 20th, 80th percentile) of a config's samples; percentiles interpolate linearly between order
    statistics, as numpy.quantile's default does. Plain Python: a decision summarizes every config of every key
    it decides, and numpy's first quantile call in a process took 50 to 60 ms on 2 H200s (later ones 0.1 ms),
    stalling the first decision of each tuning process (RESULTS.md section 40)."""
    ordered = sorted(values)
    reducers: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "mean": statistics.fmean,
                                                           "min": min}
    central = reducers[stat](ordered)
    return float(central), _percentile(ordered, 0.2), _percentile(ordered, 0.8)


def _percentile(ordered: list[float], q: float) -> float:
    at = q * (len(ordered) - 1)
    below = int(at)
    above = min(below + 1, len(ordered) - 1)
    if ordered[above] == ordered[below]:  # (also two infinities, whose difference is NaN)
        return float(ordered[below])
    return float(ordered[below] + (ordered[above] - ordered[below]) * (at - below))


def pick_winner(times: list[float]) -> int | None:
    """Index of the fastest finite time; ties go to the lowest index; NaN counts as a failure."""
    best: int | None = None
    for i, t in enumerate(times):
        if math.isfinite(t) and (best is None or t < times[best]):
            best = i
    return best


# Near-ties: candidates within a band of the fastest are one tie, which the incumbent (the key's last winner)
# keeps, so that a re-tune does not flip configs on noise; without one, the fastest wins. The band is the
# fastest config's own spread (q80 - q20 over its median), at least TIE_FLOOR (timers' resolution) and at most
# TIE_CAP (the most a tie-break may give away). After a per-launch confirmation of n interleaved rounds, the
# times compared are statistics of n samples taken side by side, and the band is the spread over sqrt(n): how
# far apart two such statistics fall by chance, not how far apart two single launches do. (The MLP op's GELU on
# 2 H200s: single launches 3 to 4% apart at random, so BLOCK 1024 and 2048 were one tie. Config order, the old
# rule without an incumbent, gave away the 1.1% by which 2048 was faster alone in 2 of 5 runs, and, with the
# band narrowed, 2.5% in 3 of 8 calls, where each call's medians put 2048 first by 0.3 to 0.8%: issue 35.)
TIE_FLOOR = 0.01
TIE_CAP = 0.05


@dataclass(frozen=True)
class Choice:
    """A decision among measured configs: the winner, and how it was reached."""
    winner: int
    fastest: int
    spread: float  # the fastest config's (q80 - q20) / median
    band: float  # configs within fastest * (1 + band) are one tie
    ties: list[int]
    tie_break: str | None  # None: the fastest won; "incumbent": it did ("config order" in older logs)


def stable_winner(times: list[float], q20: list[float], q80: list[float],
                  incumbent: int | None = None, samples: int = 1) -> Choice | None:
    """The winner among near-ties: the incumbent (the last winner of this kernel and key) if it is in the
    band, else the fastest (of equal times, the first listed); None when no config has a finite time.
    `samples`: the rounds of an interleaved confirmation the times come from (the band narrows by its square
    root)."""
    fastest = pick_winner(times)
    if fastest is None:
        return None
    best = times[fastest]
    spread = _spread(fastest, times, q20, q80)
    band = min(TIE_CAP, max(TIE_FLOOR, spread / math.sqrt(max(1, samples))))
    ties = [i for i, t in enumerate(times) if math.isfinite(t) and t <= best * (1 + band)]
    winner = incumbent if incumbent in ties else fastest
    how = None if winner == fastest else "incumbent"
    return Choice(winner, fastest, spread, band, ties, how)


def fastest_spread(times: list[float], q20: list[float], q80: list[float]) -> float | None:
    """The fastest config's spread, (q80 - q20) over its time; None when no config has a finite time."""
    fastest = pick_winner(times)
    return None if fastest is None else _spread(fastest, times, q20, q80)


def _spread(i: int, times: list[float], q20: list[float], q80: list[float]) -> float:
    best, width = times[i], q80[i] - q20[i]
    return width / best if best > 0 and math.isfinite(width) else 0.0


# Confirmation: before a key is decided, the candidates within CONFIRM_FACTOR times the tie band of the
# fastest (at least CONFIRM_FLOOR, at most CONFIRM_CAP) are re-timed, interleaved, in CONFIRM_ROUNDS or
# n_repeat more slots each, whichever is more (a noisy key: more, confirm_rounds).
CONFIRM_FACTOR = 2.0
CONFIRM_FLOOR = 0.03
CONFIRM_CAP = 0.10
CONFIRM_ROUNDS = 3
# A noisy key's confirmation takes up to this many rounds (confirm_rounds; 4 times the default n_repeat's):
# samples, not a wider band, are what tell a 1% difference from chance.
CONFIRM_MAX_ROUNDS = 20


def confirm_rounds(spread: float, base: int) -> int:
    """The rounds of a per-launch confirmation: `base`, or for a noisy key as many as bring its band after
    confirmation (the spread over their square root) down to TIE_FLOOR, at most CONFIRM_MAX_ROUNDS."""
    need = math.ceil((spread / TIE_FLOOR) ** 2 - 1e-9)
    return max(base, min(need, CONFIRM_MAX_ROUNDS))


# After each round of an end-to-end confirmation, a candidate more than RACE_BAND behind the fastest leaves the
# race. (All-gather + GEMM, 2 H200s, 58 keys confirmed end to end in 5 runs: after the first round each winner
# was at most 7.0% behind that round's fastest, and 94 of the 294 candidates that lost were over 10% behind.)
RACE_BAND = 0.10


# A key that overlaps another stream's work (runtime/streams.py) is confirmed end to end, its candidates
# within OVERLAP_BAND of the fastest per launch, the OVERLAP_MAX fastest of them: per-launch times do not show
# what a config does to the work it overlaps, so the band is wider than the per-launch one. (At 15%, the
# all-gather + GEMM op's best config, 0.3% outside it per launch, was never re-timed: issue 35.)
OVERLAP_BAND = 0.30
OVERLAP_MAX = 8


def close_candidates(choice: Choice, times: list[float], overlapped: bool = False,
                     luckiest: list[float] | None = None,
                     elsewhere: list[float] | None = None) -> tuple[list[int], float]:
    """The configs close enough to the fastest that one more, interleaved, look may reorder them.

    `luckiest` (overlapped keys): each config's time on the rank where it was fastest. A launch beside another
    stream's work is slowed by what it happened to overlap on each rank, so a config is also a candidate when its
    luckiest rank puts it within the band (all-gather + GEMM: the exhaustive best measured 0.263 ms on one rank
    and 0.199 ms on the other, and the reduced 0.263 left it out of the end-to-end confirmation).

    `elsewhere` (overlapped keys): each config's fastest time per launch for the same kernel and key under the
    function's other points. Beside the overlapped work, the config that overlaps it best looks slow per launch,
    since its span takes in what it hid; so a config within the per-launch band of the fastest elsewhere is a
    candidate too (all-gather + GEMM: the exhaustive best measured 1.31x the fastest per launch beside the
    gather, outside OVERLAP_BAND, and the call chose a config 3.3% slower)."""
    narrow = min(CONFIRM_CAP, max(CONFIRM_FLOOR, CONFIRM_FACTOR * choice.band))
    band = max(narrow, OVERLAP_BAND) if overlapped else narrow

    def near(ts: list[float], width: float) -> dict[int, float]:
        finite = [t for i, t in enumerate(ts) if math.isfinite(t) and math.isfinite(times[i])]
        if not finite:
            return {}
        fastest = min(finite)
        return {i: t / fastest for i, t in enumerate(ts)
                if math.isfinite(t) and math.isfinite(times[i]) and t <= fastest * (1 + width)}

    close = near(times, band)
    if overlapped:
        for other, width in ((luckiest, band), (elsewhere, narrow)):
            for i, r in near(other or [], width).items():
                close[i] = min(close.get(i, math.inf), r)
        return sorted(sorted(close, key=lambda i: (close[i], i))[:OVERLAP_MAX]), band
    return sorted(close), band


def screen(times: list[float], factor: float) -> list[int]:
    """Configs whose screening time is finite and within `factor` of the best one."""
    finite = [t for t in times if math.isfinite(t)]
    if not finite:
        return []
    limit = factor * min(finite)
    return [i for i, t in enumerate(times) if math.isfinite(t) and t <= limit]
