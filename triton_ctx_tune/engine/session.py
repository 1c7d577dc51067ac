"""One tuning call: the states it meets, what each launch runs, and the decision at each step's end.

A step is one execution of the tuned function. A new (kernel, key) is first looked up in the
persistent cache (cache.py: rank 0 answers for everyone) and otherwise precompiled
(precompile.py); then every launch of it takes that key's next slot. At the end of the step,
ranks check that they agree on what they tune, and the keys whose planned slots ran out are
decided together (decisions.py): their timings are gathered from every rank and reduced, and the
group's rank 0 broadcasts either the survivors of a screening pass or the winner.
"""
from __future__ import annotations

import functools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..store.cache import Lookup, TuningCache, entry_id, identity, resolve_dir
from ..runtime.collectives import Collectives
from ..runtime.compat import (Autotuner, compile_only, config_failure_reason, config_str, kernel_name, launch_cached, launch_config,
                     prune_configs, reset_before_final_launch, restores, tuning_key)
from ..errors import CollectiveTimeoutError, CtxTuneError, EmptyConfigSpaceError, NoValidPointError, RankMismatchError
from .exactly_once import paused
from ..tools.logs import RankLog, fmt_ms
from ..options import TuneOptions
from ..runtime.patch import original_run
from .progress import Progress, steps_left
from ..store.quarantine import Quarantine
from ..compile import precompile
from .decisions import Decisions, TunedKey, plain_point
from .search import Assignment, PointTunable, Search
from .services import StepServices
from .state import KeyState, Slot, SlotRecord
from ..runtime.timing import CudaEventTimer, CudaGraphTimer, HostTimer, make_timer
from .validate import StepChecks, Validator


HEAD_START_MAX_S = 0.02  # the longest the GPU waits before an end-to-end sample (run_step)


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


class Session:
    """The executor of a tuning call: runs each step's Assignment (search.py), routes launches, decides.

    `points` is a function-level space (autotune()); `pins` are kernel winners already known
    for the point that runs (a function-cache hit), installed as the launches meet them.
    """

    def __init__(self, function: str, opts: TuneOptions, points: PointTunable | None = None,
                 pins: dict[tuple[str, str], tuple[int, list[str]]] | None = None) -> None:
        self.function = function
        self.opts = opts
        self.search = Search(points)
        self.pins = pins or {}
        self.installed: list[tuple[Autotuner, tuple, Any]] = []  # pinned kernel winners (see pins)
        self.assignment = Assignment()
        self.final = False  # this step is meant to be the final run: known configs launch for real
        # A step timed end to end whose kernels are all settled runs on the warm path (call.py), with
        # the step's configs in Autotuner.cache: the session's own routing costs microseconds per
        # launch, which would make points with more launches look slower than they will be.
        self.lean = False
        self.misses: dict[int, Lookup] = {}  # id(state) -> its cache miss, stored once the state is decided
        self._slot_marks: dict[int, int] = {}
        self.new_states: list[KeyState] = []
        self.launched: set[int] = set()  # ids of the states launched in this step
        self.tuning_launches = 0
        self.on_point_decided: Callable[[Session, Any], None] = lambda session, decided: None  # function_tuner's store
        self.stats = CallStats(function)
        # Getters, not values: comm, log, cache and progress are built on first use (a warm call builds none).
        services = StepServices(
            function, opts, self.search, self.stats, self.misses, get_comm=lambda: self.comm, get_log=lambda: self.log,
            get_cache=lambda: self.cache, get_progress=lambda: self.progress, get_early_stop=lambda: self.early_stop,
            get_new_states=lambda: self.new_states, ensure_header=self.ensure_header, point_failed=self.point_failed,
            point_decided=lambda decided: self.on_point_decided(self, decided))
        self.decisions = Decisions(services)
        self.validator = (Validator(opts.atol, opts.rtol, opts.max_mismatch_ratio, opts.compare)
                          if opts.validate else None)
        self.checks = None if self.validator is None else StepChecks(services, self.validator)
        self._started = time.perf_counter()
        self._logged_header = False
        # Autograd runs a backward's launches on its own thread while the caller waits, and a
        # function may launch from threads it starts (resolver.carry): one launch at a time.
        self._lock = threading.RLock()
        self._host_s = 0.0  # the host side of the last execution (run_step): an end-to-end sample's head start
        # Online (tuner.py): each step is one real call of the function, never repeated, so every launch
        # runs as a tuned launch does (no restore_value/reset_to_zero), and compiles do not hold a call up.
        self.online = opts.online

    # Built on first use: a call whose keys are all in Autotuner.cache needs none of them, and a
    # tuned function called in a hot loop should cost little more than the function itself.
    @functools.cached_property
    def comm(self) -> Collectives:
        return Collectives(self.opts.is_dist, self.opts.group, self.opts.resolved_timeout())

    @functools.cached_property
    def timer(self) -> HostTimer | CudaEventTimer:
        return make_timer(self.opts.flush_l2, self.opts.cuda_graph)

    @functools.cached_property
    def log(self) -> RankLog:
        return RankLog(self.opts.resolved_log_dir(), self.comm.global_rank, self.opts.resolved_quiet())

    @functools.cached_property
    def cache(self) -> TuningCache | None:
        cache_dir = self.opts.resolved_cache_dir()
        return None if cache_dir is None else TuningCache(cache_dir, self.opts.resolved_retune(), self.comm,
                                                          self.opts.reduce, self.opts.stat)

    @functools.cached_property
    def quarantine(self) -> Quarantine | None:
        if not self.opts.resolved_quarantine():
            return None
        cache_dir = resolve_dir(self.opts.cache_dir)
        q = Quarantine(cache_dir.with_name(cache_dir.name + "-quarantine"), self.comm.global_rank, self.comm,
                       self.opts.resolved_slot_timeout())
        for r in q.recovered:
            self.ensure_header()
            self.log.write("quarantine-recovered", f"quarantine kernel={r.get('kernel')} key={r.get('key')} "
                           f"config#{r.get('index')} {{{r.get('config')}}}: {r['reason']}", **r)
        return q

    @functools.cached_property
    def early_stop(self) -> float | None:
        return self.opts.resolved_early_stop()

    @functools.cached_property
    def progress(self) -> Progress:
        return Progress.on_terminal(self.function, self.comm.global_rank, self.opts.resolved_quiet())

    def close(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None) -> None:
        if self.__dict__.get("quarantine") is not None:
            self.quarantine.close()
        if "progress" in self.__dict__:
            self.progress.clear()
        self.stats.wall_s = time.perf_counter() - self._started
        if self._logged_header:
            self.log.write("end", f"=== {self.function}: {self.stats.executions} executions, "
                           f"{self.stats.wall_s:.3f} s, {len(self.stats.tuned)} keys tuned"
                           + ("" if exc_type is None else f", stopped by {exc_type.__name__}"),
                           function=self.function, executions=self.stats.executions, wall_s=self.stats.wall_s,
                           error=None if exc_type is None else repr(exc))
        if "log" in self.__dict__:
            self.log.close()

    # ---- launches (handed over by call.Call) -------------------------------------------------

    def launch(self, at: Autotuner, args: tuple, kwargs: dict[str, Any]) -> Any:
        with self._lock, paused():  # routing and timing a launch are the tuner's work, not the function's writes
            return self._launch(at, args, kwargs)

    def _launch(self, at: Autotuner, args: tuple, kwargs: dict[str, Any]) -> Any:
        run = original_run()
        if len(at.configs) <= 1:
            return run(at, *args, **kwargs)
        key = tuning_key(at, args, kwargs)
        if kwargs.get("warmup"):
            # Compile-only: Triton's own run would "benchmark" launches that do nothing.
            configs = [at.cache[key]] if key in at.cache else prune_configs(at, args, kwargs)
            return compile_only(at, configs, args, kwargs)
        point = self.assignment.point
        state = self.search.kernel(point, at, key)
        if state is None:
            # Under a function-level space every key is tuned in the context of its point, so
            # neither Autotuner.cache nor the per-kernel cache (tuned without that context) answers.
            if key in at.cache and point is None:
                return self._known(at, at.cache[key], args, kwargs)
            configs = prune_configs(at, args, kwargs)
            if not configs:
                raise EmptyConfigSpaceError(kernel_name(at), key)
            if len(configs) == 1:
                at.cache[key] = configs[0]  # as Triton does: one config needs no measuring
                return run(at, *args, **kwargs)
            pinned = self._pinned(at, key, configs)
            if pinned is not None:
                return self._known(at, pinned, args, kwargs)
            in_space = self.search.points is not None
            lookup = self.cache.lookup(at, key, configs) if self.cache is not None and not in_space else None
            if lookup is not None and lookup.hit:
                self._cache_hit(at, key, configs, lookup)
                return self._known(at, at.cache[key], args, kwargs)
            if lookup is not None and lookup.stale is not None:  # rank 0: say why an entry of this key was not used
                self.ensure_header()
                line, fields = lookup.stale.describe(kernel_name(at), key)
                self.log.write("cache-stale", line, **fields)
                self.log.summary(f"{self.function}: {line}")
            state = self._new_state(at, key, configs, args, kwargs, lookup.id if lookup is not None else None)
            if lookup is not None:
                self.misses[id(state)] = lookup
        self.launched.add(id(state))
        if state.decided:
            best = state.configs[state.winner]  # type: ignore[index]
            if state.reset_pending and self.final:
                state.reset_pending = False
                reset_before_final_launch(at, best, args, kwargs)
            return self._known(at, best, args, kwargs)
        a = self.assignment
        if state.compiling is not None and not a.fixed:
            return self._while_compiling(state, args, kwargs)
        if state.settled or state.end_to_end or a.fixed:
            # Timed end to end, held after screening, or a validation step: every launch in this step
            # runs the step's config for this key, untimed.
            index = a.config_for(state)
            return self._untimed(state, state.step_config() if index in state.failures else index,
                                 SlotRecord(None, None), args, kwargs)
        self.tuning_launches += 1
        return self._run_slot(state, args, kwargs)

    def _while_compiling(self, state: KeyState, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A launch of a key met in this step: the first of this rank's configs to finish compiling runs.

        It stands in for the key's first slot when that is a warm-up (a loaded config needs no other).
        Which config it is may differ between ranks, so no timed slot is taken: those start in the next
        step, with every config compiled and loaded."""
        assert state.compiling is not None
        slot = state.peek()
        stand_in = slot is not None and not slot.timed and not state.end_to_end  # (end-to-end slots are steps)
        record = SlotRecord(state.take_slot() if stand_in else None, None)
        if record.slot is not None:
            state.records.append(record)
        return self._untimed(state, state.compiling.first_ready(), record, args, kwargs)

    def _untimed(self, state: KeyState, index: int | None, record: SlotRecord, args: tuple,
                 kwargs: dict[str, Any]) -> Any:
        """Run config `index` untimed; if it cannot run here, a config known to work."""
        if index is not None:
            config = state.configs[index]
            ok, out = self._launch_noted(state, index, lambda: self._known(state.autotuner, config, args, kwargs))
            if ok:
                state.works.add(index)
                record.ran = index
                return out
            record.failure = out
        return self._fallback(state, record, args, kwargs)

    def _known(self, at: Autotuner, config: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A launch whose config is settled: for real in the final run. In a tuning step it runs like a
        slot (restore_value and reset_to_zero applied), so re-executions never compound in-place effects."""
        if self.final or self.online or (self.assignment.timed and not restores(at)):
            # A step timed end to end measures what the function costs once tuned: the lean launch,
            # not the hooks (nothing to restore here), or a host-bound function would look slower
            # the more launches it makes.
            return launch_cached(at, config, args, kwargs)
        return launch_config(at, config, args, kwargs)

    def _pinned(self, at: Autotuner, key: tuple, configs: list) -> Any:
        """The winner a function-cache hit names for this kernel and key, installed in Autotuner.cache."""
        pin = self.pins.get((kernel_name(at), repr(key)))
        if pin is None or pin[1] != [config_str(c) for c in configs]:
            return None
        best = configs[pin[0]]
        at.cache[key] = best
        self.installed.append((at, key, best))
        return best

    def ensure_header(self) -> None:
        if not self._logged_header:
            self._logged_header = True
            device = torch.cuda.get_device_name() if self.timer.kind != "host" else "cpu"
            self.log.header(self.function, self.comm.world, device, self.timer.kind)

    def _cache_hit(self, at: Autotuner, key: tuple, configs: list, lookup: Lookup) -> None:
        best = configs[lookup.winner]
        at.cache[key] = best
        self.stats.cache_hits += 1
        self.ensure_header()
        entry = lookup.entry  # only the rank that read it (rank 0) has it; the others log the winner alone
        ms = entry["timings"][lookup.winner]["ms"] if entry else None
        date = entry["tuned"]["date"] if entry else "earlier"
        self.log.write("cache-hit", f"cache-hit kernel={kernel_name(at)} key={key!r} winner=config#{lookup.winner} "
                       f"{{{config_str(best)}}} {fmt_ms(ms)} from {lookup.path}",
                       kernel=kernel_name(at), key=list(key), winner=lookup.winner, winner_config=config_str(best),
                       configs=[config_str(c) for c in configs], path=str(lookup.path), id=lookup.id,
                       entry=entry)
        self.progress.clear()
        self.log.summary(f"{self.function}: {kernel_name(at)} key={key!r} -> {{{config_str(best)}}} {fmt_ms(ms)} "
                         f"(from the tuning cache, tuned {date})")

    def _new_state(self, at: Autotuner, key: tuple, configs: list, args: tuple, kwargs: dict[str, Any],
                   key_id: str | None) -> KeyState:
        self.ensure_header()
        state = KeyState(autotuner=at, key=key, configs=configs, n_warmup=self.opts.n_warmup,
                         n_repeat=self.opts.n_repeat, kernel=kernel_name(at), early_stop=self.early_stop,
                         point=self.assignment.point, end_to_end=self.opts.objective == "end_to_end")
        self.search.add(state)
        self.new_states.append(state)
        if self.quarantine is not None:
            state.key_id = key_id or entry_id(identity(at, key, configs, self.comm.world, self.opts.reduce,
                                                       self.opts.stat))
            # This rank's own records now, so that no config that killed a process here runs again; the
            # other ranks' at the step's end, after the ranks agree on the keys they met (a collective
            # here would pair with another rank's different one if they did not).
            for i, reason in self.quarantine.local(state.key_id, len(state.configs)).items():
                state.fail(i, reason)
        if self.opts.resolved_precompile():
            work = (state, args, kwargs, self.comm, self.opts.compile_threads or precompile.default_threads(),
                    self.opts.resolved_compile_timeout(), self.opts.resolved_compile_workers())
            # The configs compile behind the execution, which goes on with the first that is ready;
            # the step's end gathers them (_finish_precompiles).
            state.compiling = precompile.start(*work)
        return state

    def _precompiled(self, state: KeyState, done: precompile.Compiled) -> None:
        state.precompiled = True
        state.compiling = None
        for i, reason in sorted(done.failures.items()):
            state.fail(i, reason)
        meanwhile = f" (the execution ran config {done.ran_meanwhile} meanwhile)" if done.ran_meanwhile else ""
        self.log.write("precompile", f"precompile kernel={state.kernel} key={state.key!r} compiled "
                       f"{len(done.mine)}/{len(state.configs)} configs here in {done.seconds:.3f} s, "
                       f"{len(done.failures)} failed{meanwhile}", kernel=state.kernel, key=list(state.key),
                       mine=done.mine, seconds=done.seconds, failures={str(i): r for i, r in done.failures.items()},
                       by_workers=done.by_workers, workers=done.workers, ran_meanwhile=done.ran_meanwhile)

    def _finish_precompiles(self, void: bool) -> None:
        """The collective half of the background compiles, in the order every rank met the keys.

        A void step (some rank failed) met keys that no later step runs: their compiles are dropped.
        Online, a key's compiles are gathered at the first step's end where every rank has finished
        its share; until then its launches run whichever config is ready (_while_compiling).
        """
        if not self.online:
            for state in self.new_states:
                if state.compiling is not None:
                    if void:
                        state.compiling = None
                    else:
                        self._precompiled(state, state.compiling.finish(self.comm))
            return
        if void:
            for state in self.new_states:
                state.compiling = None
        compiling = [s for s in self.search.kernels.values() if s.compiling is not None]
        if not compiling:
            return
        mine = torch.tensor([int(s.compiling.done) for s in compiling], dtype=torch.int64)  # type: ignore[union-attr]
        everyone = self.comm.all_gather(mine, "online: which keys finished compiling on every rank")
        for state, done in zip(compiling, everyone.amin(0).tolist()):
            if done:
                self._precompiled(state, state.compiling.finish(self.comm))  # type: ignore[union-attr]
                state.skip_warmups()

    def _apply_quarantine(self, state: KeyState) -> None:
        """Every rank's quarantined configs of a key met in this step, on every rank (at the step's end)."""
        assert self.quarantine is not None
        skipped = self.quarantine.lookup(state.key_id, len(state.configs))
        for i, reason in sorted(skipped.items()):
            state.fail(i, reason)
        if skipped:
            self.log.write("quarantine", f"quarantine kernel={state.kernel} key={state.key!r} skips configs "
                           f"{sorted(skipped)}: they killed a process while they ran", kernel=state.kernel,
                           key=list(state.key), configs={str(i): r for i, r in skipped.items()})
            self.progress.clear()
            self.log.summary(f"{self.function}: {state.kernel} key={state.key!r}: skipping quarantined configs "
                             + "; ".join(f"#{i} ({r})" for i, r in sorted(skipped.items())))

    def _run_slot(self, state: KeyState, args: tuple, kwargs: dict[str, Any]) -> Any:
        slot = state.take_slot()
        record = SlotRecord(slot, None)
        state.records.append(record)
        if slot is not None and slot.config in state.failures:
            record.failure = "skipped: this config failed in an earlier slot"
        elif slot is not None:
            replay = slot.timed and isinstance(self.timer, CudaGraphTimer)
            token = self.timer.start(flush=True) if slot.timed and not replay else None
            config = state.configs[slot.config]

            def launch() -> tuple[Any, Any]:  # the end event is recorded before any synchronize
                out = self._run_config(state.autotuner, config, args, kwargs)
                return out, self.timer.stop(token) if token is not None else None

            ok, out = self._launch_noted(state, slot.config, launch)
            result, stop = out if ok else (None, None)
            if ok and replay:
                ok, out = self._try(state, slot.config, lambda: self.timer.measure(  # type: ignore[union-attr]
                    lambda a: launch_config(state.autotuner, config, a, kwargs), args))
            if not ok:
                record.failure = out
            else:
                state.works.add(slot.config)
                record.ran = slot.config
                if slot.timed:
                    record.sample = out if replay else stop
                    state.samples[slot.config].append(record.sample)
                return result
        return self._fallback(state, record, args, kwargs)

    def _try_launch(self, state: KeyState, index: int, args: tuple, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """Launch config `index`: (True, its return value), or (False, the reason) if the config cannot
        run here, which also marks it failed. Any other exception is the user's and propagates."""
        return self._launch_noted(state, index, lambda: self._run_config(state.autotuner, state.configs[index], args, kwargs))

    def _run_config(self, at: Autotuner, config: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A slot's launch: with Triton's benchmarking hooks, unless the call is online (it runs once)."""
        return launch_cached(at, config, args, kwargs) if self.online else launch_config(at, config, args, kwargs)

    def _launch_noted(self, state: KeyState, index: int, work: Callable[[], Any]) -> tuple[bool, Any]:
        """_try(work), under the quarantine's note and followed by its synchronize when it is config
        `index`'s first launch: a config that faults or hangs on these shapes does so there. Later
        launches go without, since a synchronize after each would keep the host from running ahead."""
        guard = self.quarantine if self.quarantine is not None and index not in state.proven else None
        if guard is not None:
            guard.begin(state.key_id, state.kernel, state.key, index, config_str(state.configs[index]))
        try:
            ok, out = self._try(state, index, work)
        except BaseException:
            if guard is not None:
                guard.clear()  # raised on the host: the user's error, not a config that kills
            raise
        if guard is not None:
            # A device fault surfaces here, as an exception from the synchronize; the record then
            # stays, and the next run skips the config.
            guard.end()
            if ok:
                state.proven.add(index)
        return ok, out

    def _try(self, state: KeyState, index: int, work: Callable[[], Any]) -> tuple[bool, Any]:
        try:
            return True, work()
        except Exception as e:
            reason = config_failure_reason(e)
            if reason is None:
                raise
            state.fail(index, reason)
            return False, reason

    def _fallback(self, state: KeyState, record: SlotRecord, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Keep the function running with a config known to work here; skip the launch if none is."""
        # A key met in this step has run no config yet: then any config that compiles keeps the
        # execution whole (the step's end still shares every failure).
        while (index := state.fallback(untried=state.compiling is not None)) is not None:
            ok, out = self._try_launch(state, index, args, kwargs)
            if ok:
                state.works.add(index)
                record.ran = index
                return out
        return None

    # ---- steps --------------------------------------------------------------------------------

    def begin_step(self, midway: bool = False) -> Assignment:
        """Plan the next step; `midway`: the execution in progress became the first step (call.py)."""
        self.final = self.search.finished and not midway
        self.tuning_launches = 0
        self.new_states = []
        self.launched = set()
        self._slot_marks = {id(s): s.next_slot for s in self.search.kernels.values() if not s.decided}
        self.assignment = self.search.assignment()
        return self.assignment

    def run_step(self, execute: Callable[[dict[str, Any]], Any]) -> tuple[bool, Any]:
        """Run one more step: (whether it was the final run, its result).

        `execute(kwargs)` runs the function with the point's keyword arguments. A step measured end
        to end is timed around the whole execution on the current stream. While a space is being
        searched, an exception from the function is that point's failure, not the call's.
        """
        a = self.begin_step()
        timed = a.measured is not None and a.timed
        runs = self.opts.resolved_e2e_runs(self.timer.kind) if timed else 1
        if timed:
            # The function's own collectives would charge one rank's late start to the others' time.
            self.comm.barrier("line the ranks up before an end-to-end step")
        pts = self.search.points
        installed = self._install_step_configs(a) if timed else []
        self.lean = bool(installed)
        samples: list[Callable[[], float]] = []
        began = time.perf_counter()
        run = 0
        try:
            for run in range(runs):
                token = None
                if timed:
                    # Right after the barrier the GPU is idle, and a sample would include the host's time
                    # to enqueue each launch, which a busy program hides: points with more launches would
                    # look slower than they run. So the GPU first waits about as long as an execution's
                    # host side. Later runs find the GPU still busy with the one before.
                    head_start = min(1.25 * self._host_s + 5e-5, HEAD_START_MAX_S) if run == 0 else 0.0
                    token = self.timer.start(flush=True, head_start_s=head_start)
                result = execute(a.kwargs)
                if token is not None:
                    samples.append(self.timer.stop(token))
        except Exception as e:
            if a.point is None or pts is None or pts.decided:
                raise
            return self.end_step(failure=f"{type(e).__name__}: {e}", runs=run + 1), None
        finally:
            self.lean = False
            for st in installed:  # an undecided key must never be left to Triton's cache
                if st.winner is None:
                    st.autotuner.cache.pop(st.key, None)
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

    def _install_step_configs(self, a: Assignment) -> list[KeyState]:
        """Put each key's config for this timed step into Autotuner.cache, for the warm path to launch.

        Not when a key restores or zeroes arguments (its launches need the hooks) or is still tuned
        per launch; then the session routes the step as usual. Keys of other points that share an
        Autotuner key are overwritten here and put back by the decision (_commit_point).
        """
        states = self.search.of_point(a.point)
        if any(restores(s.autotuner) or not (s.settled or s.end_to_end) for s in states):
            return []
        chosen = [(s, a.config_for(s)) for s in states]
        if any(index in s.failures for s, index in chosen):
            return []
        for s, index in chosen:
            s.autotuner.cache[s.key] = s.configs[index]
        return states

    def end_step(self, samples: list[Callable[[], float]] | None = None, failure: str | None = None,
                 output: Any = None, runs: int = 1) -> bool:
        """Close one step of `runs` executions; True when it ran every kernel with its final config."""
        self.stats.executions += runs
        a = self.assignment
        if failure is None and not self.online:  # online, a key waits for the calls that launch it
            for s in self.search.of_point(a.point):
                if not s.settled and not s.end_to_end and id(s) not in self.launched:
                    raise CtxTuneError(
                        f"kernel {s.kernel} key {s.key!r} was launched in an earlier execution of {self.function} "
                        "but not in the last one, so its tuning cannot finish. A tuned function must launch the "
                        "same kernels with the same keys every time it runs within one call; move data-dependent "
                        "launches out of it.")
        clean = self.tuning_launches == 0 and not self.new_states
        if failure is None and clean and self.search.finished:
            return True
        if self.stats.executions >= self.opts.max_executions and not self.online:
            raise CtxTuneError(
                f"{self.function} ran {self.stats.executions} times without finishing its tuning "
                f"(max_executions={self.opts.max_executions}); it probably launches new keys on every "
                "execution (a shape that changes each time). Make its shapes fixed within one call.")
        try:
            failures = self._check_agreement(failure)
        except CollectiveTimeoutError as e:
            self._name_suspects(e)
            raise
        if self.quarantine is not None and not failures:
            for state in self.new_states:
                self._apply_quarantine(state)
        self._finish_precompiles(void=bool(failures))
        self.timer.sync()
        if failures:
            self.point_failed(a, "; ".join(f"rank {r}: {m}" for r, m in sorted(failures.items())),
                               {str(r): m for r, m in failures.items()})
            return False
        if self.checks is not None and self.checks.point_invalid(a, output):
            return False
        if a.measured is not None and clean:
            self._take_step_sample(a, samples or [])
        if self.checks is not None:
            self.checks.after_step(a, output)
        if self.search.points is not None and a.point is not None:
            self.search.points.seen.add(a.point)
        self._log_slots()
        finishing = self.search.finishing()
        if finishing:
            self.progress.clear()  # the decisions print summary lines
            self.decisions.decide(finishing)
        if self.search.finished:
            for s in self.search.kernels.values():
                s.reset_pending = True  # the next execution is the final one
        left = steps_left((s.total_slots - s.next_slot, s.next_slot - self._slot_marks.get(id(s), 0))
                          for s in self.search.kernels.values() if not s.settled and not s.end_to_end)
        self.progress.update(self.stats.executions, self.stats.executions + left)
        return False

    def note_online_call(self, wall_s: float, decided_before: set[int]) -> None:
        """Log one call of an online session: what it cost and what it advanced (report.py sums them)."""
        keys = [{"kernel": s.kernel, "key": list(s.key), "slots": s.next_slot - self._slot_marks.get(id(s), 0)}
                for s in self.search.kernels.values() if id(s) in self.launched]
        decided = [{"kernel": s.kernel, "key": list(s.key)} for s in self.search.kernels.values()
                   if s.decided and id(s) not in decided_before]
        self.ensure_header()
        self.log.write("online-call", f"online call {self.stats.executions}: {wall_s * 1e3:.3f} ms, "
                       + ", ".join(f"{k['kernel']} key={tuple(k['key'])!r} {k['slots']} slots" for k in keys)
                       + (f"; decided {len(decided)} keys" if decided else ""),
                       function=self.function, call=self.stats.executions, wall_s=wall_s, keys=keys, decided=decided)

    def _name_suspects(self, e: CollectiveTimeoutError) -> None:
        """Ranks run the same slots in lockstep: a rank that never reached the step's end was most
        likely hung in one of the slots this rank ran in it (its own SlotHangError names which)."""
        # A key met in this step ran, on each rank, whichever config that rank compiled first: any of them.
        met = {id(st) for st in self.new_states}
        ran = [f"{st.kernel} key={st.key!r} config#{c} {{{config_str(st.configs[c])}}}"
               for st in self.search.kernels.values() for r in st.records if r.slot is not None
               for c in (range(len(st.configs)) if id(st) in met else (r.slot.config,))]
        if ran:
            e.args = (e.args[0] + " The step it waited at the end of ran these slots here; a rank hung in one of "
                      "them is the likely cause: " + "; ".join(dict.fromkeys(ran)),)

    def _take_step_sample(self, a: Assignment, samples: list[Callable[[], float]]) -> None:
        m = a.measured
        assert m is not None
        slot = m.take_slot()
        if slot is None:
            return
        ok = slot.config not in m.failures
        ms = [sample() for sample in samples] if ok and slot.timed else []
        if ok:
            m.works.add(slot.config)
            m.samples[slot.config] += [functools.partial(float, v) for v in ms]
        what = (f"point#{slot.config} {a.kwargs}" if isinstance(m, PointTunable)
                else f"kernel={m.kernel} key={m.key!r} config#{slot.config}")  # type: ignore[attr-defined]
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
        self.progress.clear()
        self.log.summary(f"{self.function}: point {a.kwargs} failed, skipped on every rank ({reason})")
        if len(pts.failures) == len(pts.configs):
            raise NoValidPointError(self.function, {repr(p): [pts.failures[i]] for i, p in enumerate(pts.configs)})

    def _check_agreement(self, failure: str | None) -> dict[int, str]:
        """Ranks agree on what the step tuned; returns every rank's failure of the step ({} when none failed)."""
        a = self.assignment
        mine = {"new": [s.describe() for s in self.new_states], "launches": self.tuning_launches,
                "measured": None if a.measured is None else [a.measured.describe(), a.config], "failed": failure}
        if not self.comm.active:
            return {} if failure is None else {0: failure}
        blob = json.dumps(mine, sort_keys=True).encode()
        flags, differing = self.comm.agree(blob, "agree on what to tune", lambda: blob, payload=(int(failure is not None),))
        if bool(flags.any()):
            # A step that failed on some rank is void on all of them: its launches need not match.
            views = [json.loads(b) for b in differing] if differing is not None else [mine] * self.comm.world
            return {r: v["failed"] for r, v in enumerate(views) if v["failed"] is not None}
        if differing is not None:
            raise RankMismatchError(_describe_mismatch([json.loads(b) for b in differing]))
        return {}

    def _log_slots(self) -> None:
        for state in self.search.kernels.values():
            for r in state.records:
                r.ms = r.sample() if r.sample is not None else None
                slot = r.slot or Slot(-1, -1, False)
                what = ("after schedule" if r.slot is None else
                        f"config#{slot.config} iter={slot.iteration} {'timed' if slot.timed else 'warmup'}")
                ran = "" if r.ran in (None, slot.config) else f" (ran config#{r.ran} instead)"
                if r.ran is None and r.failure is None:
                    ran = " (no working config yet: launch skipped)"
                result = f"FAILED {r.failure}" if r.failure else fmt_ms(r.ms)
                config = f" {{{config_str(state.configs[slot.config])}}}" if r.slot is not None else ""
                self.log.write("slot", f"slot step={self.stats.executions} kernel={state.kernel} key={state.key!r} "
                               f"{what}{config} {result}{ran}",
                               step=self.stats.executions, kernel=state.kernel, key=list(state.key),
                               config_index=slot.config if r.slot else None, iteration=slot.iteration,
                               timed=slot.timed, ms=r.ms, failure=r.failure, ran=r.ran)
            state.records.clear()

def _describe_mismatch(everyone: list[dict[str, Any]]) -> str:
    groups: dict[str, list[int]] = {}
    for rank, view in enumerate(everyone):
        groups.setdefault(json.dumps(view, sort_keys=True), []).append(rank)
    all_new = [set(v["new"]) for v in everyone]
    common = set.intersection(*all_new) if all_new else set()
    lines = []
    for text, ranks in groups.items():
        view = json.loads(text)
        differing = [d for d in view["new"] if d not in common] or ["(same keys, different launch counts)"]
        lines.append(f"  ranks {ranks}: {view['launches']} tuning launches; their own keys: " + " | ".join(differing))
    return "\n".join(lines)
