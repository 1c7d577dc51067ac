"""The step schedule: which collectives end a tuning step, derived from what every rank agreed on.

A step (one execution, or one online call) ends with the tuner's collectives. Every rank must issue the
same ones in the same order, or ranks pair different collectives: a hang, or mixed payloads. So nothing one
rank saw alone picks them (its share of a split screening, its compile progress, its timings, which
config stood in, a failure). Each rank first writes down its step (StepReport). One guarded all-gather
then checks that the reports' identities match and carries every rank's flags (failed, an error). The
rest of the step's end (StepEnd) is a function of that agreed report and of the search's state, which
earlier broadcasts made the same on every rank. Its fixed order:

1. agree on the step (always, every step of a tuning call, the final run included);
2. a step some rank failed is void on every rank: nothing else, the point is failed;
3. an error any rank found (a key not launched again) is raised on every rank;
4. the final run, clean on every rank: the call ends;
5. quarantined configs of the keys met in the step (one gather per key met, in the order met);
6. compile results of the keys every rank has finished compiling (their flags rode along in step 1; one
   gather per finished key): online, of keys met in earlier steps; re-executing, of every key still compiling,
   those met in this step included, and of all of them once nothing else is left to time (the same fact
   everywhere: it reads the agreed search). Without deferral (function spaces, objective="end_to_end"): of each
   key met, at the end of the step that met it. Re-executing, a key still compiling may take as many of its
   next slots as every rank has compiled the configs of (their counts ride along in step 1 too; no collective);
7. validation verdicts, when validating;
8. the decisions of the tunables whose slots ran out (one gather of timings, one broadcast).

A tunable's slot count is part of the agreed identity: split screening pads every rank's share to the same
length, with the same warm-up positions (state.py), so "ran out" is the same fact everywhere.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .search import Assignment, PointTunable, Search
from .state import KeyState, Tunable

# Tests only (tests/test_schedule.py): skip_step_end(function, rank, step) -> True makes this rank skip that
# step's end, as a rank whose schedule diverged would. None in every real run.
skip_step_end: Callable[[str, int, int], bool] | None = None


@dataclass
class StepReport:
    """What one rank saw in a step. The identity must be equal on every rank; `failure` and `error` may
    differ between ranks and ride along as flags."""
    new: list[str]  # keys met for the first time, in the order met
    launches: int  # launches that took a per-launch slot
    measured: list[Any] | None  # the end-to-end tunable and config the step measured
    slots: list[list[Any]]  # per tunable still tuning: [what, slots taken, slots planned]
    failure: str | None = None  # the step failed here (a point's execution raised)
    error: str | None = None  # an error every rank raises once agreed (a key not launched again)
    # Per key still compiling (compiling_keys' order), whether this rank has finished its share: online and
    # when re-execution defers compiles (Session.defers); otherwise empty.
    compiled: list[int] = field(default_factory=list)
    # A function space's call budget is spent, by this rank's measure: only rank 0's is followed (every rank reads
    # it in the gathered flags), so the decision rests on one clock and is the same everywhere.
    over_budget: bool = False
    # Per key still compiling (the same keys as `compiled`), how many of its next slots are of configs compiled
    # here (KeyState.ready_first); the minimum over ranks may be taken before the compiles are gathered.
    early: list[int] = field(default_factory=list)

    def identity(self) -> bytes:
        return json.dumps([self.new, self.launches, self.measured, self.slots, len(self.compiled)],
                          sort_keys=True).encode()

    def flags(self) -> tuple[int, ...]:
        """What rides along with the identity: failed, an error, over budget, then the compile flags and the
        early slot counts (as many as the identity's count of keys compiling)."""
        return (int(self.failure is not None), int(self.error is not None), int(self.over_budget), *self.compiled,
                *self.early)

    def explain(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @staticmethod
    def of(search: Search, a: Assignment, new: list[KeyState], launches: int, failure: str | None,
           error: str | None, online: bool, defers: bool = False, over_budget: bool = False,
           world: int = 1) -> StepReport:
        tuning = [t for t in _tunables(search) if not t.settled]
        compiled: list[int] = []
        early: list[int] = []
        if online or defers:
            fresh = {id(s) for s in new}
            grace_ends, early_ends = time.monotonic() + DEFER_GRACE_S, _early_ends(new)
            for s in compiling_keys(search, new, with_new=defers and not online):
                timed_early = defers and not online and s.times_early(world)
                if id(s) in fresh:  # met just now: a share that ends within the grace is gathered now, as ever
                    _wait_for_share(s, grace_ends, early_ends if timed_early else None)
                compiled.append(int(s.compiling.done))
                early.append(s.ready_first(s.compiling.ready_here()) if timed_early else 0)
        return StepReport([s.describe() for s in new], launches,
                          None if a.measured is None else [a.measured.describe(), a.config],
                          [[name(t), t.next_slot, t.total_slots] for t in tuning], failure, error, compiled,
                          over_budget, early)


def _wait_for_share(state: KeyState, grace_ends: float, early_ends: float | None) -> None:
    """The grace of a key met in this step: wait for its share until it ends, or, where the key can time its
    compiled configs early (`early_ends` given), only until one of them is compiled here and `early_ends` has
    passed (_early_ends): the rest of the grace is better spent timing it (the MLP op's first GEMM key, 2 H200s:
    5 of its 9 configs compiled when the first execution ended, the slowest 0.2 s later)."""
    assert state.compiling is not None
    if early_ends is not None:
        state.compiling.wait(max(0.0, min(early_ends, grace_ends) - time.monotonic()))
        if state.compiling.done or state.ready_first(state.compiling.ready_here()) > 0:
            return
    state.compiling.wait(max(0.0, grace_ends - time.monotonic()))


def _early_ends(new: list[KeyState]) -> float:
    """When the least wait of the keys met in this step ends: EARLY_WAIT_S after the first of them started
    compiling, one wait for all of them. A CPU run's short step still waits it; a first execution that ran for
    0.5 s does not. Counted per key from the step's end, the MLP op's first execution (three keys met, the last
    0.5 s in) ended 0.11 to 0.16 s after its last launch on one H200 (RESULTS.md section 50)."""
    started = [s.compiling.started for s in new if s.compiling is not None]
    waited = time.perf_counter() - min(started) if started else 0.0
    return time.monotonic() + max(0.0, EARLY_WAIT_S - waited)


# Re-executing, how long a step's end waits for the compiles of a key met in that step before it may defer them:
# a key whose share ends in time is gathered at once, as without deferral (CPU runs, warm caches, small keys).
DEFER_GRACE_S = 0.25
# The least of it the keys that can time their compiled configs early wait, from the step's first compile on (a CPU
# run's compiles all end within it).
EARLY_WAIT_S = 0.05


def compiling_keys(search: Search, new: list[KeyState], with_new: bool = False) -> list[KeyState]:
    """Keys whose background compiles have not been gathered: those an earlier step started, and `with_new`,
    those of this step too. The same keys in the same order on every rank: their order is the order met, and a
    step's new keys are part of its identity, checked in the same gather that carries their flags."""
    fresh = set() if with_new else {id(s) for s in new}
    return [s for s in search.kernels.values() if s.compiling is not None and id(s) not in fresh]


@dataclass
class StepEnd:
    """The rest of a step's end, the same on every rank (see the module's order)."""
    failures: dict[int, str] = field(default_factory=dict)  # every rank's failure of the step ({}: none)
    error: str | None = None  # raised on every rank
    final: bool = False  # the final run: nothing follows
    clean: bool = False  # no slot taken and no key met, on every rank
    compiled: list[KeyState] = field(default_factory=list)  # keys every rank has finished compiling (flagged)
    # Keys still compiling, each with how many of its next slots every rank may take now (StepReport.early).
    early: list[tuple[KeyState, int]] = field(default_factory=list)
    over_budget: bool = False  # rank 0 found the call's budget spent: everything still tuning is decided now

    @property
    def void(self) -> bool:
        return bool(self.failures)


def plan(reports: list[StepReport], search: Search, new: list[KeyState], compiled: list[int],
         with_new: bool = False, over_budget: bool = False, early: list[int] | None = None) -> StepEnd:
    """The step's end from every rank's report (equal identities: checked before this), the search, the
    compile flags every rank finished (`compiled`, the minimum over ranks, of compiling_keys(with_new)), the
    early slot counts (their minimum over ranks), and rank 0's over-budget flag."""
    failures = {r: rep.failure for r, rep in enumerate(reports) if rep.failure is not None}
    error = next((rep.error for rep in reports if rep.error is not None), None)
    mine = reports[0]  # identities are equal: any rank's report says what every rank's does
    clean = mine.launches == 0 and not mine.new
    keys = compiling_keys(search, new, with_new)
    done = [s for s, flag in zip(keys, compiled) if flag]
    ahead = [(s, n) for s, flag, n in zip(keys, compiled, early or [0] * len(keys)) if not flag]
    return StepEnd(failures, None if failures else error, not failures and error is None and clean and search.finished,
                   clean, done, ahead, over_budget and not failures and error is None and not search.finished)


def _tunables(search: Search) -> list[Tunable]:
    out: list[Tunable] = list(search.kernels.values())
    if search.points is not None:
        out.append(search.points)
    return out


def name(t: Tunable) -> str:
    """A tunable as reports and schedule headers name it."""
    if isinstance(t, KeyState):
        return f"{t.kernel} key={t.key!r}" + ("" if t.point is None else f" point#{t.point}")
    assert isinstance(t, PointTunable)  # the only other kind of tunable
    return f"the points of {t.function}"
