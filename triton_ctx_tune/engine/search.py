"""The step-level plan of a tuning call: what each execution runs, and what it measures.

A tuning call executes the function once per *step*. The Search owns the call's tunables:
kernel keys (state.KeyState), met as the function launches them, and a function-level space
(PointTunable), known up front. Before each step it hands the executor (session.Session) an
Assignment: the point the function runs with, the end-to-end tunable measured in this step and
its config, and whether the step's time is a sample. A kernel key timed per launch takes its
slots as its launches come (one slot per launch, several keys side by side); a tunable timed
end to end takes one slot per step, and only in a step where nothing else varies, so that the
step's time belongs to that one choice. After the step the executor hands back whether it was
clean (no per-launch slot taken, no key met for the first time) and its time.

With a space, points are screened first, each with its kernels screened in context and held
at their screening's best, then timed end to end; the points within early_stop of the best
survive, their kernels finish tuning, and the survivors are timed round-robin. A point that
loses the screening never pays for its kernels' full tuning.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .state import KeyState, Tunable


@dataclass(kw_only=True)
class PointTunable(Tunable):
    """A function-level space: each config is a dict of keyword arguments for the function."""
    function: str
    configs: list[dict[str, Any]]
    seen: set[int] = field(default_factory=set)  # points that have run once (their kernels are known)
    screened: list[float] = field(default_factory=list)  # each point's screening time (inf: none), once screened

    def describe(self) -> str:
        return f"{self.function} points={self.configs!r}"

    def screening_warmups(self) -> int:
        # A point's first executions pay for first uses (a new stream, a communicator's first
        # collective on it, allocator growth): its screening sample comes after every warm-up.
        return self.n_warmup

    def survivor_warmups(self) -> int:
        # A surviving point has run its warm-ups and its screening step, then every step of its kernels' tuning
        # since: nothing of a first use is left to pay (and on a GPU each end-to-end step drops its first run).
        # Two warm-up steps per point were 6% of all-gather + GEMM's executions (issue 35).
        return 0

    def keep(self, survivors: list[int]) -> None:
        """End the points' screening. A survivor's screening sample ran its kernels at their screening's best,
        not at the configs they will be decided on: it is dropped, and the survivors are judged on the
        samples they take once their kernels are decided (the point and its kernels by one end-to-end rule)."""
        # Best first: the survivors' kernels finish tuning in this order, so that a call budget that runs out
        # midway has tuned the points most likely to win (the rest are decided on their screening times).
        if self.screened:
            survivors = sorted(survivors, key=lambda c: (self.screened[c], c))
        super().keep(survivors)
        for c in survivors:
            self.samples[c] = []


# Every Tunable is one of these two: a test on one narrows to the other.
AnyTunable = KeyState | PointTunable


@dataclass
class Assignment:
    """What one step runs: the function's point, and which end-to-end tunable it measures with which config."""
    point: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    measured: AnyTunable | None = None
    config: int | None = None
    timed: bool = False  # a timed slot of `measured` (else a warm-up slot, or nothing measured)
    reference: bool = False  # every key on its known-good config: the result is validation's reference
    validating: tuple[KeyState, int] | None = None  # this key runs this config, every other its known-good one

    def config_for(self, state: KeyState) -> int:
        """The config every launch of `state` runs in this step when it takes no per-launch slot."""
        if self.validating is not None and self.validating[0] is state:
            return self.validating[1]
        if self.measured is state and self.config is not None:
            return self.config
        return state.step_config()

    @property
    def fixed(self) -> bool:
        """Whether every launch runs a config chosen before the step (no per-launch slot is taken)."""
        return self.reference or self.validating is not None


class Search:
    def __init__(self, points: PointTunable | None = None) -> None:
        self.points = points
        self.kernels: dict[tuple[int | None, int, tuple], KeyState] = {}
        # Output validation (validate.py): a reference step, then one step per (key, config) to check.
        self.reference_pending = False
        self.validation: list[tuple[KeyState, int]] = []

    def plan_validation(self, states: list[KeyState], user_reference: bool) -> None:
        """Check every config of these keys, but the first when the reference is the result with the
        first configs. Each check runs every other key on its first config, taken as known-good."""
        first = 0 if user_reference else 1
        for s in states:
            self.validation += [(s, c) for c in range(first, len(s.configs)) if c not in s.failures]
        self.reference_pending = self.reference_pending or (not user_reference and bool(states))

    def kernel(self, point: int | None, at: Any, key: tuple) -> KeyState | None:
        return self.kernels.get((point, id(at), key))

    def add(self, state: KeyState) -> None:
        self.kernels[(state.point, id(state.autotuner), state.key)] = state

    def of_point(self, point: int | None) -> list[KeyState]:
        return [s for s in self.kernels.values() if s.point == point]

    @property
    def finished(self) -> bool:
        """Every tunable that the final run needs is decided: the next step is that run.

        Kernels of points that lost may stay held at their screening's best: nothing runs them again.
        """
        pts = self.points
        if pts is not None and not pts.decided:
            return False
        final = None if pts is None else pts.winner
        return all(s.decided for s in self.of_point(final))

    def finishing(self) -> list[AnyTunable]:
        """The tunables whose planned slots have all run: the step's end decides them."""
        out: list[AnyTunable] = [s for s in self.kernels.values() if not s.settled and s.exhausted]
        if self.points is not None and not self.points.decided and self.points.exhausted:
            out.append(self.points)
        return out

    def hold_screened_kernels(self) -> bool:
        """Whether a kernel that ends its screening now waits for its point to survive the points' screening."""
        return self.points is not None and self.points.screening

    def assignment(self) -> Assignment:
        point = self._point()
        a = Assignment(point, {} if point is None or self.points is None else dict(self.points.configs[point]))
        if self.reference_pending:
            a.reference = True
            return a
        if self.validation:
            a.validating = self.validation[0]
            return a
        mine = self.of_point(point)
        if any(not s.end_to_end and not s.settled for s in mine):
            return a  # kernels timed per launch are still tuning: nothing else is measured
        e2e = next((s for s in mine if s.end_to_end and not s.settled), None)
        if e2e is not None:
            slot = e2e.peek()
            if slot is not None:
                a.measured, a.config, a.timed = e2e, slot.config, slot.timed
            return a
        pts = self.points
        if pts is not None and not pts.decided and point is not None and point in pts.seen:
            slot = pts.peek()
            if slot is not None:
                a.measured, a.config, a.timed = pts, slot.config, slot.timed
        return a

    def _point(self) -> int | None:
        pts = self.points
        if pts is None:
            return None
        if pts.decided:
            return pts.winner
        # Slots of failed points are passed over; every rank knows the same failures.
        while (slot := pts.peek()) is not None and slot.config in pts.failures:
            pts.take_slot()
        slot = pts.peek()
        return slot.config if slot is not None else pts.fallback()

    def force_decide(self) -> None:
        """A function space's call budget is spent (rank 0's measure, agreed in the step's flags): every tunable
        still tuning ends its plan, and this step's end decides it on the samples it has (decisions.py, forced).
        Held kernels come back so that their point, if it wins, has them decided too. Called on every rank at
        the same step's end, from agreed state only."""
        # (Called at every step's end once the budget is spent: a tunable already forced is on its last plan, a
        # forced key's lockstep round, which must not be cut again; only one met since is new here.)
        tunables: list[AnyTunable] = [s for s in self.kernels.values() if s.winner is None and not s.forced]
        if self.points is not None and not self.points.decided and not self.points.forced:
            tunables.append(self.points)
        for t in tunables:
            if isinstance(t, KeyState):
                t.unhold()
            t.plan = t.plan[: t.next_slot]
            t.screening = False
            t.forced = True

    def abandon(self, point: int) -> None:
        """A point failed: drop its kernels' states, which no later step will launch."""
        for k in [k for k, s in self.kernels.items() if s.point == point]:
            del self.kernels[k]

    def resume_point(self, point: int) -> None:
        """A point survived the screening: its held kernels finish their tuning."""
        for s in self.of_point(point):
            if s.held is not None:
                s.resume()
