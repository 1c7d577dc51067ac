"""One tuning call's driver: begin a step, run it, have the ranks agree, decide at its end.

A step is one execution of the tuned function (re-execution) or one real call of it (online).
What each launch of the step runs is the executor's business (executor.py). At the end of the
step, ranks check that they agree on what they tuned, and the keys whose planned slots ran out are
decided together (decisions.py): their timings are gathered from every rank and reduced, and the
group's rank 0 broadcasts either the survivors of a screening pass or the winner.
"""
from __future__ import annotations

import collections
import functools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import CollectiveTimeoutError, CtxTuneError, NoValidPointError, RankMismatchError, ScheduleMismatchError
from ..options import TuneOptions
from ..runtime import collector
from ..runtime.collectives import Collectives
from ..runtime.libraries import forget
from ..runtime.timing import head_start
from ..tools.logs import RankLog, fmt_ms
from . import schedule
from .decisions import Decisions, TunedKey, plain_point
from .executor import Executor
from .progress import steps_left
from .schedule import StepEnd, StepReport
from .search import Assignment, PointTunable, Search
from .services import CallServices, StepServices
from .state import KeyState
from .validate import StepChecks, Validator

# A seconds call budget counts this many steps ahead (at the median of the last ones) for what follows the step that
# spends it, the decisions and the final run, and for the step in between checks; from the RESERVE_AFTER-th step
# measured (_over_budget). On all-gather + GEMM (2 H200s) the spending step's end to the call's end took 1.8 to 7.0
# times the median of the last steps (12 to 30 ms; RESULTS section 28, 13 runs), and at 8 two runs of 13 ended 9 and
# 19 ms past the budget.
FINISH_STEPS = 12
RESERVE_AFTER = 4
RECENT_STEPS = 8  # ... the median of this many


class StepClock:
    """What a step costs on this rank: the seconds of the last RECENT_STEPS steps (the first step, which starts
    everything, is not one of them). A seconds budget, the call's or a key's, counts what is left in steps."""

    def __init__(self) -> None:
        self.recent: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self.mark: float | None = None  # when the last step ended (None: before the first)

    def tick(self) -> float:
        """A step ended: now."""
        now = time.perf_counter()
        if self.mark is not None:
            self.recent.append(now - self.mark)
        self.mark = now
        return now

    def median(self, at_least: int = 1) -> float | None:
        return statistics.median(self.recent) if len(self.recent) >= at_least else None


@dataclass
class CallStats:
    """What the last call of a tuned function did (also written to the logs)."""
    function: str
    executions: int = 0
    wall_s: float = 0.0
    tuned: list[TunedKey] = field(default_factory=list)
    cache_hits: int = 0  # keys whose winner came from the persistent cache
    point: dict[str, Any] | None = None  # the function-level point the call ran with (autotune())
    # (kernel, key) met by a call that could not re-execute (exactly_once.py): ran untuned, tuned next call
    deferred: list[tuple[str, tuple]] = field(default_factory=list)
    # (kernel, key) with no tuned result met by a frozen call (options.freeze): ran a borrowed config
    frozen: list[tuple[str, tuple]] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)  # tuning-cache entries this call wrote (rank 0)
    # every (kernel, key) this tuning call met, with the key's values by name (tune_ahead checks inputs with it)
    met: dict[tuple[str, tuple], dict[str, Any]] = field(default_factory=dict)
    # one per key precompiled in the call (executor._precompiled): where its configs compiled, and when
    compiles: list[dict[str, Any]] = field(default_factory=list)
    first_launch_at: float | None = None  # perf_counter at the first launch of a key this call tuned
    first_slot_s: float | None = None  # from that launch to the call's first timed slot


class Session:
    """The driver of a tuning call: plans each step (search.py), has the executor (executor.py) run its
    launches, and at the step's end has the ranks agree, and decides (decisions.py).

    Re-execution (tuner.py, call.py) drives it with run_step()/finish(): one step per execution.
    Online (tuner.py) drives it with begin_step()/end_step() around each real call of the function.
    `points` is a function-level space (autotune()); `pins` are kernel winners already known for the
    point that runs (a function-cache hit).
    """

    def __init__(self, function: str, opts: TuneOptions, points: PointTunable | None = None,
                 pins: dict[tuple[str, str], tuple[int, list[str]]] | None = None) -> None:
        self.function = function
        self.opts = opts
        self.search = Search(points)
        self.stats = CallStats(function)
        self.services = CallServices(function, opts)
        self.executor = Executor(self.services, opts, self.search, self.stats, pins)
        self.online = opts.online
        # Re-executing, a key whose configs still compile at the end of the step that met it no longer holds up
        # every other key: its compiles are gathered at the first step's end where every rank has finished its
        # share (schedule.py, 6), and meanwhile its launches run a config that is ready, untimed. Not for a
        # function space or objective="end_to_end", whose steps are timed whole.
        self.defers = not self.online and points is None and opts.objective != "end_to_end"
        self._slot_marks: dict[int, int] = {}
        self.on_point_decided: Callable[[Session, Any], None] = lambda session, decided: None  # function_tuner's store
        ex, sv = self.executor, self.services
        # Getters, not values: the services are built on first use, new_states is rebound at each step.
        step_services = StepServices(
            function, opts, self.search, self.stats, ex.misses, get_comm=lambda: sv.comm, get_log=lambda: sv.log,
            get_cache=lambda: sv.cache, get_progress=lambda: sv.progress, get_early_stop=lambda: sv.early_stop,
            get_new_states=lambda: ex.new_states, ensure_header=sv.ensure_header, point_failed=self.point_failed,
            point_decided=lambda decided: self.on_point_decided(self, decided))
        self.decisions = Decisions(step_services)
        self.validator = (Validator(opts.atol, opts.rtol, opts.max_mismatch_ratio, opts.compare)
                          if opts.validate else None)
        self.checks = None if self.validator is None else StepChecks(step_services, self.validator)
        self._started = time.perf_counter()
        self._clock = StepClock()
        self._budget_said = False  # the call-budget event is written once, when the call's budget is first spent
        self._host_s = 0.0  # the host side of the last execution (run_step): an end-to-end sample's head start
        self._gpu_floor_s = 0.0  # the fastest end-to-end sample so far: the GPU's part of the head start

    # What call.py, tuner.py and function_tuner.py read of the executor and the services.
    @property
    def comm(self) -> Collectives:
        return self.services.comm

    @property
    def log(self) -> RankLog:
        return self.services.log

    @property
    def final(self) -> bool:
        return self.executor.final

    @property
    def lean(self) -> bool:
        return self.executor.lean

    @property
    def installed(self) -> list[tuple[Any, tuple, Any]]:
        return self.executor.installed

    @property
    def assignment(self) -> Assignment:
        return self.executor.assignment

    @property
    def new_states(self) -> list[KeyState]:
        return self.executor.new_states

    def ensure_header(self) -> None:
        self.services.ensure_header()

    def launch(self, at: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        return self.executor.launch(at, args, kwargs)

    def close(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None) -> None:
        try:
            if isinstance(exc, Exception) and not isinstance(exc, (CollectiveTimeoutError, ScheduleMismatchError)):
                # A rank that leaves with an error tells the ranks still at one of the call's collectives,
                # which then raise at once instead of at the deadline (every rank ends the same way).
                self.comm.abandon(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        except (ScheduleMismatchError, CollectiveTimeoutError):
            pass  # the ranks that did not leave raise the mismatch; this rank raises its own error
        finally:
            self.services.close(self.stats, self._started, exc_type, exc)

    # ---- steps --------------------------------------------------------------------------------

    def begin_step(self, midway: bool = False) -> Assignment:
        """Plan the next step; `midway`: the execution in progress became the first step (call.py)."""
        collector.between_steps()  # outside every sample: the step's own cycles, freed before the next one runs
        self._slot_marks = {id(s): s.next_slot for s in self.search.kernels.values() if not s.decided}
        self.comm.at(self.stats.executions + 1, f"running step {self.stats.executions + 1}")
        assignment = self.search.assignment()
        self.executor.begin(assignment, final=self.search.finished and not midway)
        return assignment

    def before_execution(self) -> None:
        """The function is about to run a step whose launches are timed one by one (not the final run):
        flush_l2="step" clears L2 here, once, and each launch then meets what the launches before it leave."""
        if not self.executor.final:
            self.services.timer.begin_step()

    def run_step(self, execute: Callable[[dict[str, Any]], Any]) -> tuple[bool, Any]:
        """Run one more step: (whether it was the final run, its result).

        `execute(kwargs)` runs the function with the point's keyword arguments. A step measured end
        to end is timed around the whole execution on the current stream. While a space is being
        searched, an exception from the function is that point's failure, not the call's.
        """
        a = self.begin_step()
        timed = a.measured is not None and a.timed
        timer = self.services.timer
        runs = self.opts.resolved_e2e_runs(timer.kind) if timed else 1
        if timed:
            # The function's own collectives would charge one rank's late start to the others' time.
            self.comm.barrier("line the ranks up before an end-to-end step")
        pts = self.search.points
        if a.measured is None:  # launches timed one by one (a step timed whole starts its own span)
            self.before_execution()
        installed = self.executor.install_step_configs(a) if timed else []
        self.executor.lean = bool(installed)
        samples: list[Callable[[], float]] = []
        began = time.perf_counter()
        run = 0
        try:
            for run in range(runs):
                token = None
                if timed:
                    # A sample would include the host's time to enqueue each launch whenever the GPU waits for
                    # the host, which a busy program hides: points with more launches (a chunked all-gather's)
                    # would look slower than they run. So the GPU first waits about as long as the host takes
                    # to enqueue all the step's runs, less its own work on the runs before the last
                    # (timing.head_start): they are then queued back to back, and the collectives in them keep
                    # the ranks in step. (Waiting only one execution's host time, a later run found
                    # the GPU idle wherever the host was the slower: all-gather + GEMM on an H200, 0.6 ms of
                    # GPU work per execution and about as much host work while tuning; issue 35.)
                    lead = head_start(self._host_s, runs, self._gpu_floor_s) if run == 0 else 0.0
                    token = timer.start("step", head_start_s=lead)
                result = execute(a.kwargs)
                if token is not None:
                    samples.append(timer.stop(token))
        except Exception as e:
            if a.point is None or pts is None or pts.decided:
                raise
            return self.end_step(failure=f"{type(e).__name__}: {e}", runs=run + 1), None
        finally:
            self.executor.lean = False
            for st in installed:  # an undecided key must never be left to Triton's cache
                if st.winner is None:
                    forget(st.autotuner, st.key)
                else:
                    st.autotuner.cache[st.key] = st.configs[st.winner]
        self._host_s = (time.perf_counter() - began) / runs
        # Of several runs, the first lined the ranks' GPUs up: its time holds their skew, not the function's.
        return self.end_step(samples[1:] or samples, output=result, runs=runs), result

    def finish(self, execute: Callable[[dict[str, Any]], Any]) -> Any:
        """Run steps until the final run; its result."""
        while True:
            final, result = self.run_step(execute)
            if final:
                return result

    def end_step(self, samples: list[Callable[[], float]] | None = None, failure: str | None = None,
                 output: Any = None, runs: int = 1) -> bool:
        """Close one step of `runs` executions; True when it ran every kernel with its final config.

        Every collective below follows the schedule (schedule.py): the ranks first agree on the step,
        and each later branch reads only that agreement and the search's agreed state."""
        self.stats.executions += runs
        a, ex = self.assignment, self.executor
        ex.join_prefetches()  # before the clock's tick: the step took what its rungs' compiles took
        self.comm.at(self.stats.executions, f"ending step {self.stats.executions}")
        if schedule.skip_step_end is not None and schedule.skip_step_end(self.function, self.comm.rank,
                                                                         self.stats.executions):
            return False
        try:
            end = self._agree(StepReport.of(self.search, a, ex.new_states, ex.tuning_launches, failure,
                                            self._missing_launch(failure), self.online, self.defers,
                                            self._over_budget(self._clock.tick()), self.comm.world))
        except CollectiveTimeoutError as e:
            self.executor.name_suspects(e)
            raise
        if end.void:
            ex.finish_compiles(void=True)
            self.point_failed(a, "; ".join(f"rank {r}: {m}" for r, m in sorted(end.failures.items())),
                              {str(r): m for r, m in end.failures.items()})
            return False
        if end.error is not None:
            raise CtxTuneError(end.error)
        if end.final:
            return True
        if self.stats.executions >= self.opts.max_executions and not self.online:
            raise CtxTuneError(
                f"{self.function} ran {self.stats.executions} times without finishing its tuning "
                f"(max_executions={self.opts.max_executions}); it probably launches new keys on every "
                "execution (a shape that changes each time). Make its shapes fixed within one call.")
        if self.services.quarantine is not None:
            for state in ex.new_states:
                ex.apply_quarantine(state)
        ex.finish_compiles(void=False, everywhere=end.compiled, defers=self.defers,
                           early=any(slots > 0 for _, slots in end.early))
        for state, slots in end.early:
            if state.compiling is not None:  # (finish_compiles gathers it anyway once nothing else is left to time)
                state.early_until = state.next_slot + slots
        self.services.timer.sync()
        if self.checks is not None and self.checks.point_invalid(a, output):
            return False
        if a.measured is not None and end.clean:
            self._take_step_sample(a, samples or [])
        if self.checks is not None:
            self.checks.after_step(a, output)
        if self.search.points is not None and a.point is not None:
            self.search.points.seen.add(a.point)
        self.executor.log_slots(self.stats.executions)
        if end.over_budget:
            self._budget_spent()
        finishing = self.search.finishing()  # slot counts are agreed: the same tunables on every rank
        if finishing:
            self.services.progress.clear()  # the decisions print summary lines
            self.comm.at(self.stats.executions, "deciding " + ", ".join(schedule.name(t) for t in finishing))
            self.decisions.decide(finishing, self._clock.median())
        if self.search.finished:
            for s in self.search.kernels.values():
                s.reset_pending = True  # the next execution is the final one
        left = steps_left((s.total_slots - s.next_slot, s.next_slot - self._slot_marks.get(id(s), 0))
                          for s in self.search.kernels.values() if not s.settled and not s.end_to_end)
        self.services.progress.update(self.stats.executions, self.stats.executions + left)
        return False

    def _over_budget(self, now: float) -> bool:
        """A function space's budget bounds the whole call (options.Budget): whether this rank finds it spent at
        `now`, a step's end (only rank 0's answer is followed). Seconds on this rank's clock from the call's start,
        or executions; a compiles budget only bounds each key (executor: a share of it each)."""
        budget = self.opts.resolved_budget()
        if budget is None or self.search.points is None or self.search.finished or self.online:
            return False
        if budget.measure == "seconds":
            # The decisions and the final run come after the step that finds the budget spent, and the budget is
            # checked once a step: the check counts FINISH_STEPS steps ahead, at the median of the last ones (10%
            # of all-gather + GEMM's sweep was overrun by 0.1 to 1.7% without it, by 0.01 to 0.16% with 4 steps).
            # Not before RESERVE_AFTER steps: the first ones compile, and priced at them a budget was spent after
            # 2 or 3 executions.
            per = self._clock.median(at_least=RESERVE_AFTER) or 0.0
            return now - self._started + FINISH_STEPS * per >= budget.limit
        return budget.measure == "executions" and self.stats.executions >= budget.limit

    def _budget_spent(self) -> None:
        budget = self.opts.resolved_budget()
        assert budget is not None
        self.search.force_decide()
        if self._budget_said:
            return
        self._budget_said = True
        spent = time.perf_counter() - self._started
        self.log.write("call-budget", f"{self.function}: the call's budget ({budget.limit:g} {budget.measure}) is "
                       f"spent after {self.stats.executions} executions, {spent:.2f} s (rank 0's measure): "
                       "every choice still open is decided on the samples taken", function=self.function,
                       measure=budget.measure, limit=budget.limit, executions=self.stats.executions,
                       seconds=spent)

    def _missing_launch(self, failure: str | None) -> str | None:
        """Re-execution: a key still tuning that this execution did not launch cannot finish (online, a key
        waits for the calls that launch it). Raised on every rank once the ranks agree on the step."""
        if failure is not None or self.online:
            return None
        for s in self.search.of_point(self.assignment.point):
            if not s.settled and not s.end_to_end and id(s) not in self.executor.launched:
                return (f"kernel {s.kernel} key {s.key!r} was launched in an earlier execution of {self.function} "
                        "but not in the last one, so its tuning cannot finish. A tuned function must launch the "
                        "same kernels with the same keys every time it runs within one call; move data-dependent "
                        "launches out of it.")
        return None

    def note_online_call(self, wall_s: float, decided_before: set[int]) -> None:
        """Log one call of an online session: what it cost and what it advanced (report.py sums them)."""
        keys: list[dict[str, Any]] = [
            {"kernel": s.kernel, "key": list(s.key), "slots": s.next_slot - self._slot_marks.get(id(s), 0)}
            for s in self.search.kernels.values() if id(s) in self.executor.launched]
        decided = [{"kernel": s.kernel, "key": list(s.key)} for s in self.search.kernels.values()
                   if s.decided and id(s) not in decided_before]
        self.ensure_header()
        self.log.write("online-call", f"online call {self.stats.executions}: {wall_s * 1e3:.3f} ms, "
                       + ", ".join(f"{k['kernel']} key={tuple(k['key'])!r} {k['slots']} slots" for k in keys)
                       + (f"; decided {len(decided)} keys" if decided else ""),
                       function=self.function, call=self.stats.executions, wall_s=wall_s, keys=keys, decided=decided)

    def _take_step_sample(self, a: Assignment, samples: list[Callable[[], float]]) -> None:
        m = a.measured
        assert m is not None
        slot = m.take_slot()
        if slot is None:
            return
        ok = slot.config not in m.failures
        ms = [sample() for sample in samples] if ok and slot.timed else []
        if ms:
            floor = min(ms) / 1e3
            self._gpu_floor_s = floor if self._gpu_floor_s == 0.0 else min(self._gpu_floor_s, floor)
        if ok:
            m.works.add(slot.config)
            m.samples[slot.config] += [functools.partial(float, v) for v in ms]
        what = (f"point#{slot.config} {a.kwargs}" if isinstance(m, PointTunable)
                else f"kernel={m.kernel} key={m.key!r} config#{slot.config}")
        result = (f"FAILED {m.failures[slot.config]}" if not ok else
                  " ".join(fmt_ms(v) for v in ms) if slot.timed and ms else "-")
        self.log.write("step", f"step {self.stats.executions} end-to-end {what} iter={slot.iteration} "
                       f"{'timed' if slot.timed else 'warmup'} {result}",
                       step=self.stats.executions, point=a.point, config_index=slot.config,
                       kind="point" if isinstance(m, PointTunable) else "kernel", iteration=slot.iteration,
                       timed=slot.timed, ms=ms, failure=m.failures.get(slot.config))

    def point_failed(self, a: Assignment, reason: str, failures: dict[str, str]) -> None:
        pts = self.search.points
        assert pts is not None and a.point is not None
        pts.fail(a.point, reason)
        self.search.abandon(a.point)
        self.ensure_header()
        self.log.write("point-failed", f"point#{a.point} {a.kwargs} failed: {reason}", point=a.point,
                       kwargs=plain_point(a.kwargs), failures=failures)
        self.services.progress.clear()
        self.log.summary(f"{self.function}: point {a.kwargs} failed, skipped on every rank ({reason})")
        if len(pts.failures) == len(pts.configs):
            raise NoValidPointError(self.function, {repr(p): [pts.failures[i]] for i, p in enumerate(pts.configs)})

    def _agree(self, mine: StepReport) -> StepEnd:
        """Step 1 of the schedule: one guarded all-gather of the reports' identities and every rank's flags;
        the plan of the rest of the step's end. Ranks whose reports differ (other keys, other slot counts)
        raise RankMismatchError together, unless some rank failed the step (its launches need not match)."""
        new = self.executor.new_states
        if not self.comm.active:
            return schedule.plan([mine], self.search, new, mine.compiled, self.defers, mine.over_budget, mine.early)
        flags, differing = self.comm.agree(mine.identity(), "agree on the step", mine.explain, payload=mine.flags())
        least = flags[:, 3:].amin(0).tolist() if differing is None else []
        # (equal identities give every rank as many compile flags; the early slot counts follow them)
        keys = len(mine.compiled)
        compiled, early = least[:keys], least[keys:]
        over = bool(flags[0, 2])  # rank 0's clock decides for every rank
        if differing is None and not bool(flags[:, :2].any()):
            return schedule.plan([mine] * self.comm.world, self.search, new, compiled, self.defers, over, early)
        if differing is None:  # the same step everywhere, but a rank failed or found an error: say which
            differing = self.comm.all_gather_bytes(mine.explain(), "agree on the step: every rank's failures")
        reports = [StepReport(**json.loads(b)) for b in differing]
        if not bool(flags[:, 0].any()) and any(r.identity() != reports[0].identity() for r in reports):
            raise RankMismatchError(_describe_mismatch(reports))
        return schedule.plan(reports, self.search, new, compiled, self.defers, over, early)


def _describe_mismatch(everyone: list[StepReport]) -> str:
    groups: dict[bytes, list[int]] = {}
    for rank, report in enumerate(everyone):
        groups.setdefault(report.identity(), []).append(rank)
    common = set.intersection(*[set(r.new) for r in everyone]) if everyone else set()
    lines = []
    for ranks in groups.values():
        r = everyone[ranks[0]]
        differing = [d for d in r.new if d not in common] or ["(same keys, different launch or slot counts)"]
        slots = ", ".join(f"{what}: slot {taken}/{planned}" for what, taken, planned in r.slots)
        lines.append(f"  ranks {ranks}: {r.launches} tuning launches; their own keys: " + " | ".join(differing)
                     + (f"; slots: {slots}" if slots else ""))
    return "\n".join(lines)

