"""What each launch of a step runs: the executor half of a tuning call (the driver is session.py).

Given the step's Assignment (search.py), a launch of an autotuned kernel is routed here: a key
already known (Autotuner.cache, a pin from the function cache, the persistent cache) runs its
config; a new key gets its KeyState and starts compiling in the background (compile/precompile.py);
a key being tuned takes its next slot, timed; while its configs compile, or when a config fails, a
config that works stands in. The executor records what ran (SlotRecords) and which keys the step met;
the driver reads that at the step's end, where the ranks agree and decide.
"""
from __future__ import annotations

import ast
import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..compile import precompile
from ..errors import CollectiveTimeoutError, EmptyConfigSpaceError
from ..runtime.buckets import key_by_name, nearest
from ..runtime.compat import (
    Autotuner,
    compile_only,
    config_failure_reason,
    config_str,
    kernel_name,
    launch_cached,
    launch_config,
    prune_configs,
    reset_before_final_launch,
    restores,
)
from ..runtime.libraries import cache_winners, can_forget, launch_refused, refused, tuning_key
from ..runtime.patch import original_run
from ..runtime.timing import CudaGraphTimer, HostLead
from ..store.cache import Lookup, entry_id, identity
from ..tools.logs import compile_totals, fmt_ms, fmt_parallelism
from .budget import EARLY_RUNG, FIRST_RUNG_WITH_WORKERS, BudgetSearch, Prior, tile_weight
from .exactly_once import paused
from .search import Assignment, Search
from .state import KeyState, Slot, SlotRecord

if TYPE_CHECKING:
    from ..options import TuneOptions
    from .services import CallRecord, CallServices


class Executor:
    """Routes one call's launches, step by step: begin(assignment) starts a step, launch() runs each of
    its launches, and the step's records (launched, new_states, tuning_launches, each state's
    records) are there for the driver at its end.

    `pins` are kernel winners already known for the point that runs (a function-cache hit),
    installed in Autotuner.cache as the launches meet them (`installed`).
    """

    def __init__(self, services: CallServices, opts: TuneOptions, search: Search, stats: CallRecord,
                 pins: dict[tuple[str, str], tuple[int, list[str]]] | None = None) -> None:
        self.services, self.opts, self.search, self.stats = services, opts, search, stats
        self.pins = pins or {}
        self.installed: list[tuple[Autotuner, tuple, Any]] = []  # pinned kernel winners (see pins)
        self.misses: dict[int, Lookup] = {}  # id(state) -> its cache miss, stored once the state is decided
        self.assignment = Assignment()
        self.final = False  # this step is meant to be the final run: known configs launch for real
        # A step timed end to end whose kernels are all settled runs on the warm path (call.py), with
        # the step's configs in Autotuner.cache: routing costs microseconds per launch, which would
        # make points with more launches look slower than they will be.
        self.lean = False
        # Online (tuner.py): each step is one real call of the function, never repeated, so every launch
        # runs as a tuned launch does (no restore_value/reset_to_zero), and compiles do not hold a call up.
        self.online = opts.online
        self.new_states: list[KeyState] = []
        self.launched: set[int] = set()  # ids of the states launched in this step
        self.tuning_launches = 0
        # id(state) -> (compile thread, timeout) of each budgeted key whose new rung compiles in this step: its
        # launches run a config that works, untimed, and the step's end joins the threads (join_prefetches).
        self.prefetching: dict[int, tuple[threading.Thread, float]] = {}
        # Autograd runs a backward's launches on its own thread while the caller waits, and a
        # function may launch from threads it starts (resolver.carry): one launch at a time.
        self._lock = threading.RLock()
        self._lead = HostLead()  # how long the GPU waits before a timed launch (runtime/timing.py)

    def begin(self, assignment: Assignment, final: bool) -> None:
        """Start a step: what it runs (`assignment`), and whether it is meant to be the final run."""
        self.assignment, self.final = assignment, final
        self.tuning_launches = 0
        self.new_states = []
        self.launched = set()

    def launch(self, at: Autotuner, args: tuple, kwargs: dict[str, Any]) -> Any:
        with self._lock, paused():  # routing and timing a launch are the tuner's work, not the function's writes
            return self._launch(at, args, kwargs)

    def _launch(self, at: Autotuner, args: tuple, kwargs: dict[str, Any]) -> Any:
        run = original_run()
        if len(at.configs) <= 1:
            return run(at, *args, **kwargs)
        key = tuning_key(at, args, kwargs)
        if self.opts.bucketing is not None:  # a key is tuned, cached and decided as its bucket
            key = self.opts.bucketing.kernel_key(at, key)
        if kwargs.get("warmup"):
            # Compile-only: Triton's own run would "benchmark" launches that do nothing.
            configs = [at.cache[key]] if key in at.cache else prune_configs(at, args, kwargs)
            return compile_only(at, configs, args, kwargs, strict=False)
        if refused(at):
            return launch_refused(at, args, kwargs)
        point = self.assignment.point
        state = self.search.kernel(point, at, key)
        if state is None:
            # Under a function-level space every key is tuned in the context of its point, so
            # neither Autotuner.cache nor the per-kernel cache (tuned without that context) answers.
            if key in at.cache and point is None:
                return self._known(at, at.cache[key], args, kwargs)
            self.stats.met[(kernel_name(at), key)] = key_by_name(at, key)
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
            lookup = (self.services.cache.lookup(at, key, configs)
                      if self.services.cache is not None and not in_space else None)
            if lookup is not None and lookup.hit:
                self._cache_hit(at, key, configs, lookup)
                return self._known(at, at.cache[key], args, kwargs)
            if lookup is not None and lookup.stale is not None:  # rank 0: say why an entry of this key was not used
                self.services.ensure_header()
                line, fields = lookup.stale.describe(kernel_name(at), key)
                self.services.log.write("cache-stale", line, **fields)
                self.services.log.summary(f"{self.services.function}: {line}")
            if self.opts.resolved_freeze():
                return self._known(at, self._frozen(at, key, configs, lookup), args, kwargs)
            state = self._new_state(at, key, configs, args, kwargs, lookup)
            if lookup is not None:
                self.misses[id(state)] = lookup
        self.launched.add(id(state))
        if state.winner is not None:  # decided
            best = state.configs[state.winner]
            if state.reset_pending and self.final:
                state.reset_pending = False
                reset_before_final_launch(at, best, args, kwargs)
            return self._known(at, best, args, kwargs)
        a = self.assignment
        if state.compiling is not None and not a.fixed and state.next_slot >= state.early_until:
            # (below early_until: a slot of a config every rank has compiled, taken as after the gather)
            return self._while_compiling(state, args, kwargs)
        if state.settled or state.end_to_end or a.fixed:
            # Timed end to end, held after screening, or a validation step: every launch in this step
            # runs the step's config for this key, untimed.
            index = a.config_for(state)
            return self._untimed(state, state.step_config() if index in state.failures else index,
                                 SlotRecord(None, None), args, kwargs)
        if id(state) in self.prefetching or (state.prefetch and self._compile_rung(state, args, kwargs)):
            # This step compiles the key's new rung: its launches run a config that works, untimed.
            return self._untimed(state, state.fallback(untried=True), SlotRecord(None, None), args, kwargs)
        self.tuning_launches += 1
        return self._run_slot(state, args, kwargs)

    def _compile_rung(self, state: KeyState, args: tuple, kwargs: dict[str, Any]) -> bool:
        """A budgeted search's new rung (state.prefetch): start compiling its configs side by side; whether this
        step compiles it. The rung's slots start at the next step: a slot that went ahead would compile its
        config here, under the GIL, while a worker compiles it too (a seconds budget on 1152 GEMM configs
        explored 16 configs in 5.6 s that way). Not waited for here: the other keys' new rungs start compiling
        at their launches in this step too, and the step's end waits for them all (join_prefetches). Waited
        for at each key's launch, three GEMM keys' rungs compiled one after another: 2.9 s of a 7.1 s budget.
        Every rank compiles the same rungs in the same step: the rungs are agreed state."""
        todo, state.prefetch, search = state.prefetch, [], state.budget
        assert search is not None
        if not self.opts.resolved_precompile():
            return False
        threads = self.opts.compile_threads or precompile.default_threads()
        timeout_s = self.opts.resolved_compile_timeout()
        compiling = precompile.prefetch(state, todo, args, kwargs, threads, timeout_s,
                                        self.opts.resolved_compile_workers(), search.note_compiles)
        if compiling is None:  # (nothing to compile, or the interpreter: the slots compile at their launch)
            return False
        self.prefetching[id(state)] = (compiling, timeout_s)
        return True

    def join_prefetches(self) -> None:
        """The step's end: wait for the new rungs' compiles started in it."""
        for thread, timeout_s in self.prefetching.values():
            thread.join(None if math.isinf(timeout_s) else timeout_s)
        self.prefetching = {}

    def _while_compiling(self, state: KeyState, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A launch of a key met in this step: the first of this rank's configs to finish compiling runs.

        It stands in for the key's first slot when that is a warm-up (a loaded config needs no other).
        Which config it is may differ between ranks, so no timed slot is taken: those start once the compiles
        are gathered, or, for configs every rank has compiled, as soon as a step's end agrees on them
        (KeyState.ready_first, below early_until)."""
        assert state.compiling is not None
        slot = state.peek()
        # A key that times early (re-executing) stands in only in the step that met it: later, a warm-up's own
        # config may be timed early, and its warm-up must be its own launch.
        met_now = any(s is state for s in self.new_states)
        times_early = state.times_early(self.services.comm.world)
        stand_in = (slot is not None and slot.warmup and not state.end_to_end
                    and (met_now or self.online or not times_early))
        index = state.compiling.first_ready()
        if stand_in and met_now and times_early and not self.online and index is not None:
            # Its own group leads the plan, so the warm-up it stands in for is its own. Taken as the first group's (the
            # list's first config), it left that config's timed slot next, and a step's end can time early only the
            # configs compiled by then: with the cheapest compiled first, the MLP op's GEMM config 0 was among the
            # last, and its first step's end waited out the 0.25 s grace (RESULTS.md section 51).
            state.ready_first({index})
        record = SlotRecord(state.take_slot() if stand_in else None, None)
        if record.slot is not None:
            state.records.append(record)
        return self._untimed(state, index, record, args, kwargs)

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

    def _cache_hit(self, at: Autotuner, key: tuple, configs: list, lookup: Lookup) -> None:
        best = configs[lookup.winner]
        at.cache[key] = best
        self.stats.cache_hits += 1
        self.services.ensure_header()
        entry = lookup.entry  # only the rank that read it (rank 0) has it; the others log the winner alone
        ms = entry["timings"][lookup.winner]["ms"] if entry else None
        date = entry["tuned"]["date"] if entry else "earlier"
        self.services.log.write("cache-hit",
                                f"cache-hit kernel={kernel_name(at)} key={key!r} winner=config#{lookup.winner} "
                       f"{{{config_str(best)}}} {fmt_ms(ms)} from {lookup.where}",
                       kernel=kernel_name(at), key=list(key), winner=lookup.winner, winner_config=config_str(best),
                       configs=[config_str(c) for c in configs], path=str(lookup.path), id=lookup.id,
                       entry=entry, source=lookup.source)
        self.services.progress.clear()
        self.services.log.summary(f"{self.services.function}: {kernel_name(at)} key={key!r} -> {{{config_str(best)}}} "
                                  f"{fmt_ms(ms)} (from the tuning cache, tuned {date})")

    def _frozen(self, at: Autotuner, key: tuple, configs: list, lookup: Lookup | None) -> Any:
        """freeze: a key with no tuned result runs the winner of the nearest tuned key of its kernel, else
        the first config, and is never tuned. Rank 0 chooses (it alone reads the cache) for every rank."""
        winners = {k: config_str(c) for k, c in cache_winners(at) if isinstance(k, tuple)}
        if lookup is not None and self.services.cache is not None:
            for text, config in self.services.cache.neighbours(lookup.identity).items():
                with contextlib.suppress(ValueError, SyntaxError):
                    winners.setdefault(ast.literal_eval(text), config)
        names = [config_str(c) for c in configs]
        dims = self.opts.bucketing.dimensions(at) if self.opts.bucketing is not None else None
        near = nearest(key, (k for k, c in winners.items() if c in names), dims)
        borrowed = names.index(winners[near]) if near is not None else None
        chosen = self.services.comm.broadcast_from_root(torch.tensor([0 if borrowed is None else borrowed],
                                                                     dtype=torch.int64),
                                                        "freeze: the config a key with no tuned result runs")
        index = int(chosen[0])
        near_text = repr(near) if borrowed is not None and index == borrowed else None
        best = configs[index]
        at.cache[key] = best  # once per key and process: the miss is logged once
        self.stats.frozen.append((kernel_name(at), key))
        source = (f"the winner of the nearest tuned key {near_text}" if near_text else
                  "the first config (no tuned key near it)")
        fix = ("tune it: run a call with this shape with freeze off (TRITON_CTX_TUNE_FREEZE=0), or add the shape "
               "to tune_ahead's sizes")
        self.services.ensure_header()
        line = (f"freeze-miss kernel={kernel_name(at)} key={key!r}: no tuned result; runs {source}: "
                f"config#{index} {{{config_str(best)}}}. To {fix}")
        self.services.log.write("freeze-miss", line, kernel=kernel_name(at), key=list(key), config_index=index,
                                config=config_str(best), nearest=near_text, fix=fix)
        self.services.log.summary(f"{self.services.function}: {line}")
        return best

    def _new_state(self, at: Autotuner, key: tuple, configs: list, args: tuple, kwargs: dict[str, Any],
                   lookup: Lookup | None) -> KeyState:
        self.services.ensure_header()
        key_id = lookup.id if lookup is not None else None
        plan = lookup.incremental if lookup is not None else None  # the same on every rank (the lookup's broadcast)
        end_to_end = self.opts.objective == "end_to_end"
        comm = self.services.comm
        # Split screening needs launches timed alone (a whole step's time would mix the ranks' configs
        # through their collectives) and no function-level space (its points hold kernels' survivors).
        split = (self.opts.resolved_split_screening() and comm.active and not end_to_end
                 and self.assignment.point is None)
        search = self._budget_search(at, configs, lookup)
        split = split and search is None  # a budgeted search's rungs are timed in lockstep
        if search is not None:
            plan = None  # a budgeted search plans its own rungs: no incremental re-tuning (every rank alike)
        state = KeyState(autotuner=at, key=key, configs=configs, n_warmup=self.opts.n_warmup,
                         n_repeat=self.opts.n_repeat, kernel=kernel_name(at), early_stop=self.services.early_stop,
                         point=self.assignment.point, end_to_end=end_to_end,
                         carried=plan.untimed if plan is not None else set(),
                         anchors=set(plan.anchors) if plan is not None else set(), incremental=plan,
                         share=(comm.rank, comm.world) if split else None, budget=search)
        for i, reason in plan.carried_failures.items() if plan is not None else ():
            state.fail(i, reason)
        if search is not None and search.measure == "seconds":
            # Seconds-budgeted keys of one kernel met in the same step tune in the same executions: their seconds
            # count from the first one's launch, not each from its own. Each first waits for the one before to run
            # (on 2 H200s the GEMM space's third shape was met 1.0 s after the first; its budget ran on while the
            # others' were spent and their rungs waited for its compiles: 13% of the sweep, not 10%).
            for other in self.new_states:
                if (other.budget is not None and other.budget.measure == "seconds"
                        and other.config_ids == state.config_ids):
                    state.started = min(state.started, other.started)
        self.search.add(state)
        self.new_states.append(state)
        if self.services.quarantine is not None:
            state.key_id = key_id or entry_id(identity(at, key, configs, self.services.comm.world, self.opts.reduce,
                                                       self.opts.stat))
            # This rank's own records now, so that no config that killed a process here runs again; the
            # other ranks' at the step's end, after the ranks agree on the keys they met (a collective
            # here would pair with another rank's different one if they did not).
            for i, reason in self.services.quarantine.local(state.key_id, len(state.configs)).items():
                state.fail(i, reason)
        if self.stats.first_launch_at is None:
            self.stats.first_launch_at = time.perf_counter()
        if self.opts.resolved_precompile():
            work = (state, args, kwargs, self.services.comm, self.opts.compile_threads or precompile.default_threads(),
                    self.opts.resolved_compile_timeout(), self.opts.resolved_compile_workers())
            # The configs compile behind the execution, which goes on with the first that is ready;
            # the step's end gathers them (_finish_precompiles).
            state.compiling = precompile.start(*work, stragglers=math.inf if state.budget is None
                                               else state.budget.stragglers)
        return state

    def _budget_search(self, at: Autotuner, configs: list, lookup: Lookup | None) -> BudgetSearch | None:
        """A budgeted search for a key whose space the budget does not cover (options.Budget), else None.
        Everything it reads is the same on every rank: the options, the config list, the lookup's broadcast."""
        budget = self.opts.resolved_budget()
        if budget is None:
            return None
        limit = budget.limit
        points = self.search.points
        if points is not None:
            # A function space's budget bounds the call (Session._over_budget): each point's keys get a share, at
            # least what a search needs to compare two configs.
            share = limit / len(points.configs)
            least = 4 if budget.measure == "executions" else 2
            limit = share if budget.measure == "seconds" else max(int(share), least)
        n = len(configs)
        if (budget.measure == "compiles" and n <= limit) or (
                budget.measure == "executions" and n * (self.opts.n_warmup + self.opts.n_repeat) <= limit):
            return None  # the budget covers every config: tuned as without one
        prior = None if lookup is None or lookup.prior is None else Prior(*lookup.prior)
        # A rung's configs compile side by side in the workers: its width. `parallel` is this rank's own count
        # (only rank 0's next_rung reads it); the first rung's width must be the same on every rank.
        workers = self.opts.resolved_compile_workers() if self.opts.resolved_precompile() else 0
        return BudgetSearch(configs, budget.measure, limit, self.opts.n_repeat,
                            model_ranked=model_ranked(at, configs), prior=prior, parallel=max(workers, 1),
                            first_width=FIRST_RUNG_WITH_WORKERS if workers else EARLY_RUNG,
                            weight=tile_weight)

    def _precompiled(self, state: KeyState, done: precompile.Compiled) -> None:
        state.precompiled = True
        state.compiling = None
        for i, reason in sorted({**done.failures, **done.same_binary}.items()):
            state.fail(i, reason)  # (a config the same binary as another is timed as that one: out of the slots)
        state.unplan([*done.failures, *done.same_binary])  # agreed at this step's end (precompile._share)
        state.rejected.update(done.rejected)
        if state.budget is not None:
            state.budget.note_compiles(done.compile_s)  # what its next rung's compiles will cost
        meanwhile = f" (the execution ran config {done.ran_meanwhile} meanwhile)" if done.ran_meanwhile else ""
        counts = done.counts()
        record = {"counts": counts, "compile_s": sum(done.compile_s.values()), "cpu_s": sum(done.cpu_s.values()),
                  "started": done.started,
                  "ended": done.ended, "pool": int(done.workers.get("ready", 0)) if done.workers else 0,
                  "shared_ptxas": done.shared_ptxas, "kernel": state.kernel,
                  "longest_s": max((b - a for a, b in done.spans.values()), default=0.0)}
        self.stats.compiles.append(record)
        key = compile_totals([record], None)  # this key's line: the call's compile line, of one key
        compile_s, wall_s, parallelism, cpu_s = key["compile_s"], key["wall_s"], key["parallelism"], key["cpu_s"]
        par = fmt_parallelism(parallelism)
        rejected = (f", {len(done.rejected)} rejected (their launch compiles them again)" if done.rejected else "")
        skipped = f", {len(done.skipped)} left to their launch" if done.skipped else ""
        same = (f", {len(done.same_binary)} the same binary as another config (timed as that one)"
                if done.same_binary else "")
        self.services.log.write("precompile", f"precompile kernel={state.kernel} key={state.key!r} compiled "
                       f"{len(done.mine)}/{len(state.configs)} configs here in {done.seconds:.3f} s, "
                       f"{len(done.failures)} failed{rejected}{skipped}{same}{meanwhile}; "
                       f"{counts['workers']} by workers, "
                       f"{counts['here']} in-process, {counts['ranks']} by other ranks, {counts['cache']} from cache, "
                       f"{compile_s:.1f} s of compiles in "
                       f"{wall_s:.1f} s (parallelism {par})", kernel=state.kernel,
                       key=list(state.key), mine=done.mine, seconds=done.seconds,
                       failures={str(i): r for i, r in done.failures.items()},
                       rejected={str(i): r for i, r in done.rejected.items()},
                       skipped={str(i): r for i, r in done.skipped.items()},
                       by_workers=done.by_workers, workers=done.workers, ran_meanwhile=done.ran_meanwhile,
                       places={str(i): p for i, p in sorted(done.places.items())}, counts=counts,
                       compile_s=compile_s, wall_s=wall_s, parallelism=parallelism, cpu_s=cpu_s,
                       cores_busy=key["cores_busy"],
                       undescribed={str(i): r for i, r in sorted(done.undescribed.items())}, stolen=done.stolen,
                       phases={k: round(v, 4) for k, v in done.phases.items()},
                       spans={str(i): [round(a - done.started, 3), round(b - done.started, 3)]
                              for i, (a, b) in sorted(done.spans.items())}, shared_ptxas=done.shared_ptxas,
                       same_binary={str(i): r for i, r in sorted(done.same_binary.items())},
                       met_s=None if self.stats.first_launch_at is None else done.started - self.stats.first_launch_at)

    def finish_compiles(self, void: bool, everywhere: list[KeyState] | None = None, defers: bool = False,
                        early: bool = False) -> None:
        """The collective half of the background compiles, in the order every rank met the keys.

        A void step (some rank failed) met keys that no later step runs: their compiles are dropped.
        Online, and re-executing with `defers`, a key's compiles are gathered at the first step's end where every
        rank has finished its share (`everywhere`, agreed with the step: schedule.py); until then its launches
        run whichever config is ready (_while_compiling). Re-executing, once no other key is left to time, the
        step's end waits for them all instead: another execution would only wait too; unless `early`, some key
        still compiling has slots of configs every rank has compiled (agreed, schedule.StepEnd.early).
        """
        if void:
            for state in self.new_states:
                state.compiling = None
            return
        if self.online:
            todo = everywhere or []
        elif defers:
            todo = list(everywhere or [])
            if not todo and not early and not any(not s.settled and s.compiling is None
                                                  for s in self.search.kernels.values()):
                todo = [s for s in self.search.kernels.values() if s.compiling is not None]
        else:
            todo = self.new_states
        for state in todo:
            if state.compiling is not None:
                self._precompiled(state, state.compiling.finish(self.services.comm))
                if self.online:
                    state.skip_warmups()

    def apply_quarantine(self, state: KeyState) -> None:
        """Every rank's quarantined configs of a key met in this step, on every rank (at the step's end)."""
        assert self.services.quarantine is not None
        skipped = self.services.quarantine.lookup(state.key_id, len(state.configs))
        for i, reason in sorted(skipped.items()):
            state.fail(i, reason)
        if skipped:
            self.services.log.write("quarantine", f"quarantine kernel={state.kernel} key={state.key!r} skips configs "
                           f"{sorted(skipped)}: they killed a process while they ran", kernel=state.kernel,
                           key=list(state.key), configs={str(i): r for i, r in skipped.items()})
            self.services.progress.clear()
            self.services.log.summary(f"{self.services.function}: {state.kernel} key={state.key!r}: skipping "
                                      "quarantined configs "
                                      + "; ".join(f"#{i} ({r})" for i, r in sorted(skipped.items())))

    def _run_slot(self, state: KeyState, args: tuple, kwargs: dict[str, Any]) -> Any:
        slot = state.take_slot()
        record = SlotRecord(slot, None)
        state.records.append(record)
        if slot is not None and slot.config in state.failures:
            record.failure = "skipped: this config failed in an earlier slot"
        # (a timed slot's config never launched on this rank launches untimed first; if that fails, the fallback)
        elif slot is not None and (not slot.timed or slot.config in state.works or self.online
                                   or self._first_launch_here(state, slot.config, record, args, kwargs)):
            if slot.timed and not state.overlapped:  # no stream is ever noted without CUDA: then always False
                state.overlapped = self.services.overlapping()
            timer = self.services.timer
            graph = timer if slot.timed and isinstance(timer, CudaGraphTimer) else None  # it times replays
            token = None
            if slot.timed and graph is None:
                record.lead_s = self._lead.take(time.perf_counter())
                token = timer.start("launch", head_start_s=record.lead_s)
            config = state.configs[slot.config]
            steady = slot.config in state.works  # a config's first launch here loads its binary: not a lead's measure

            def launch() -> tuple[Any, Callable[[], float] | None]:  # the end event is recorded before any synchronize
                began = time.perf_counter()
                out = self._run_config(state.autotuner, config, args, kwargs)
                stop = timer.stop(token) if token is not None else None
                if steady:
                    self._lead.note(time.perf_counter() - began)
                return out, stop

            ok, out = self._launch_noted(state, slot.config, launch)
            result, stop = out if ok else (None, None)
            if ok and graph is not None:
                ok, out = self._try(state, slot.config, lambda: graph.measure(
                    lambda a: launch_config(state.autotuner, config, a, kwargs), args))
            if not ok:
                record.failure = out
            else:
                state.works.add(slot.config)
                record.ran = slot.config
                if slot.timed:
                    if self.stats.first_slot_s is None and self.stats.first_launch_at is not None:
                        self.stats.first_slot_s = time.perf_counter() - self.stats.first_launch_at
                    sample = out if graph is not None else stop
                    assert sample is not None  # timed and not replayed: launch() stopped the span it started
                    record.sample = sample
                    state.samples[slot.config].append(sample)
                return result
        return self._fallback(state, record, args, kwargs)

    def _first_launch_here(self, state: KeyState, index: int, record: SlotRecord, args: tuple,
                           kwargs: dict[str, Any]) -> bool:
        """Launch config `index` untimed before its first timed slot on this rank: its warm-up slot may have run
        another config (a stand-in runs whichever config this rank compiled first, and the other ranks' share is
        only loaded here), and a first launch pays one-off host work (the quarantine's note, Triton's first
        launch) while the GPU waits, which the span would count (all-gather + GEMM: a config 1.9x slower on the
        one rank that had not run it, screened out, the best one; issue 35). Not online: a slot is a real call."""
        ok, out = self._try_launch(state, index, args, kwargs)
        if ok:
            state.works.add(index)
        else:
            record.failure = out
        return ok

    def _try_launch(self, state: KeyState, index: int, args: tuple, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """Launch config `index`: (True, its return value), or (False, the reason) if the config cannot
        run here, which also marks it failed. Any other exception is the user's and propagates."""
        return self._launch_noted(state, index, lambda: self._run_config(state.autotuner, state.configs[index], args,
                                                                         kwargs))

    def _run_config(self, at: Autotuner, config: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A slot's launch: with Triton's benchmarking hooks, unless the call is online (it runs once)."""
        return launch_cached(at, config, args, kwargs) if self.online else launch_config(at, config, args, kwargs)

    def _launch_noted(self, state: KeyState, index: int, work: Callable[[], Any]) -> tuple[bool, Any]:
        """_try(work), under the quarantine's note and followed by its synchronize when it is config
        `index`'s first launch: a config that faults or hangs on these shapes does so there. Later
        launches go without, since a synchronize after each would keep the host from running ahead."""
        guard = self.services.quarantine if self.services.quarantine is not None and index not in state.proven else None
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
            out = work()
        except Exception as e:
            reason = config_failure_reason(e)
            if reason is None:
                raise
            if index in state.rejected:
                reason += " (precompile rejected it too)"
            state.fail(index, reason)
            return False, reason
        if index in state.rejected and index not in state.disagreed:
            state.disagreed.add(index)
            self.services.log.write(
                "precompile-disagreed", f"precompile-disagreed kernel={state.kernel} key={state.key!r} config "
                f"#{index} compiled and ran at its launch, but precompile rejected it: "
                f"{state.rejected[index][:200]}", kernel=state.kernel, key=list(state.key), config_index=index,
                config=config_str(state.configs[index]), precompile_reason=state.rejected[index])
        return True, out

    def _fallback(self, state: KeyState, record: SlotRecord, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Keep the function running with a config known to work here; skip the launch if none is."""
        # A key met in this step has run no config yet: then any config that compiles keeps the
        # execution whole (the step's end still shares every failure). Online, every launch is the program's
        # own and must run: any config not known to fail is tried (the soak found skipped launches).
        while (index := state.fallback(untried=state.compiling is not None or self.online)) is not None:
            ok, out = self._try_launch(state, index, args, kwargs)
            if ok:
                state.works.add(index)
                record.ran = index
                return out
        return None

    # ---- what the driver reads at a step's end ----

    def install_step_configs(self, a: Assignment) -> list[KeyState]:
        """Put each key's config for this timed step into Autotuner.cache, for the warm path to launch.

        Not when a key restores or zeroes arguments (its launches need the hooks) or is still tuned
        per launch; then the session routes the step as usual. Keys of other points that share an
        Autotuner key are overwritten here and put back by the decision (_commit_point).
        """
        states = self.search.of_point(a.point)
        if any(restores(s.autotuner) or not (s.settled or s.end_to_end) or not can_forget(s.autotuner)
               for s in states):  # (a cache that cannot forget, e.g. a library's sqlite one, never holds a trial)
            return []
        chosen = [(s, a.config_for(s)) for s in states]
        if any(index in s.failures for s, index in chosen):
            return []
        for s, index in chosen:
            s.autotuner.cache[s.key] = s.configs[index]
        return states

    def name_suspects(self, e: CollectiveTimeoutError) -> None:
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

    def log_slots(self, step: int) -> None:
        """Log the slots this step ran (each state's records), then forget them."""
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
                self.services.log.write("slot", f"slot step={step} kernel={state.kernel} key={state.key!r} "
                               f"{what}{config} {result}{ran}",
                               step=step, kernel=state.kernel, key=list(state.key),
                               config_index=slot.config if r.slot else None, iteration=slot.iteration,
                               timed=slot.timed, ms=r.ms, failure=r.failure, ran=r.ran,
                               lead_ms=None if r.lead_s is None else round(r.lead_s * 1e3, 4))
            state.records.clear()


def model_ranked(at: Autotuner, configs: list) -> bool:
    """Whether Triton's own pruning sorted `configs` by the kernel's perf_model: it does when a perf_model and
    a top_k below the config count cut the list (prune_configs_by), best estimate first."""
    return getattr(at, "perf_model", None) is not None and len(configs) < len(at.configs)
