"""The services a tuning call's parts use: collectives, timer, log, caches, quarantine, progress line.

CallServices builds each on first use, because a call whose keys are all known must build none of
them. The executor (executor.py) gets a CallServices; the deciding (decisions.py) and validating
(validate.py) halves get a StepServices, which adds what the driver (session.py) owns, as getters.
Neither gets the Session, so imports run one way: session -> executor, decisions, validate -> services.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..runtime import streams
from ..runtime.collectives import Collectives
from ..runtime.timing import Timer, make_timer
from ..store.cache import TuningCache, resolve_dir
from ..store.quarantine import Quarantine
from ..tools.logs import RankLog, compile_line, compile_totals
from .progress import Progress

if TYPE_CHECKING:
    from ..options import TuneOptions
    from ..store.cache import Lookup
    from .search import Assignment, Search
    from .state import KeyState


class CallServices:
    """One call's services, each built on first use (a tuned function called in a hot loop should cost
    little more than the function itself)."""

    def __init__(self, function: str, opts: TuneOptions) -> None:
        self.function, self.opts = function, opts
        self.logged_header = False
        # Re-execution notes the streams the function works on: a key that overlaps their work is confirmed
        # end to end under objective="auto" (decisions.py). Online calls cannot time a step end to end.
        self._unwatch = streams.watch() if not opts.online and opts.objective == "auto" else (lambda: None)

    @staticmethod
    def overlapping() -> bool:
        """Whether another stream the function made current still has work queued (streams.py)."""
        return streams.busy_elsewhere()

    @functools.cached_property
    def comm(self) -> Collectives:
        comm = Collectives(self.opts.is_dist, self.opts.group, self.opts.resolved_timeout())
        comm.on_header = self._record_collective
        comm.function = self.function
        return comm

    def _record_collective(self, h: dict[str, Any]) -> None:
        self.ensure_header()
        self.log.write("collective", f"collective #{h['seq']} {h['op']} '{h['what']}' call={h['call']} "
                       f"step={h['step']} {h['shape']}" + (f" ({h['doing']})" if h["doing"] else ""),
                       seq=h["seq"], tuning_call=h["call"], step=h["step"], op=h["op"], what=h["what"],
                       doing=h["doing"], shape=h["shape"])

    @functools.cached_property
    def timer(self) -> Timer:
        return make_timer(self.opts.flush_l2, self.opts.cuda_graph)

    @functools.cached_property
    def log(self) -> RankLog:
        return RankLog(self.opts.resolved_log_dir(), self.comm.global_rank, self.opts.resolved_quiet())

    @functools.cached_property
    def cache(self) -> TuningCache | None:
        cache_dir = self.opts.resolved_cache_dir()
        if cache_dir is None:
            return None
        cache = TuningCache(cache_dir, self.opts.resolved_retune(), self.comm, self.opts.reduce, self.opts.stat,
                            self.opts.resolved_shipped())
        budget = self.opts.resolved_budget()
        cache.budget = None if budget is None else (budget.measure, budget.limit)
        return cache

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

    def ensure_header(self) -> None:
        if not self.logged_header:
            self.logged_header = True
            device = torch.cuda.get_device_name() if self.timer.kind != "host" else "cpu"
            self.log.header(self.function, self.comm.world, device, self.timer.kind, self.opts.flush_l2)

    def _log_compiles(self, stats: CallRecord) -> None:
        totals = compile_totals(stats.compiles, stats.first_slot_s)
        line = compile_line(totals)
        self.log.write("compile", f"=== {self.function}: {line}", function=self.function, **totals)
        self.log.summary(f"{self.function}: {line}")

    def close(self, stats: CallRecord, started: float, exc_type: type[BaseException] | None = None,
              exc: BaseException | None = None) -> None:
        """Release what was built, and log the call's end if anything was logged."""
        self._unwatch()
        quarantine: Quarantine | None = self.__dict__.get("quarantine")  # (only if it was built)
        if quarantine is not None:
            quarantine.close()
        if "progress" in self.__dict__:
            self.progress.clear()
        stats.wall_s = time.perf_counter() - started
        if self.logged_header and stats.compiles:
            self._log_compiles(stats)
        if self.logged_header:
            self.log.write("end", f"=== {self.function}: {stats.executions} executions, "
                           f"{stats.wall_s:.3f} s, {len(stats.tuned)} keys tuned"
                           + ("" if exc_type is None else f", stopped by {exc_type.__name__}"),
                           function=self.function, executions=stats.executions, wall_s=stats.wall_s,
                           error=None if exc_type is None else repr(exc))
        if "log" in self.__dict__:
            self.log.close()


class CallRecord(Protocol):
    """The part of a call's stats (session.CallStats) that decisions read and fill in."""
    executions: int
    wall_s: float
    cache_hits: int
    tuned: list[Any]  # decisions.TunedKey, one per key decided in the call
    frozen: list[tuple[str, tuple]]  # keys a frozen call ran untuned (executor._frozen)
    stored: list[str]  # tuning-cache entries written
    met: dict[tuple[str, tuple], dict[str, Any]]  # (kernel, key) of every key met -> its values by name
    point: dict[str, Any] | None
    compiles: list[dict[str, Any]]  # one per key precompiled (executor._precompiled)
    first_launch_at: float | None
    first_slot_s: float | None


@dataclass(frozen=True)
class StepServices:
    function: str
    opts: TuneOptions
    search: Search
    stats: CallRecord
    misses: dict[int, Lookup]  # id(state) -> its cache miss, stored once the state is decided
    # Getters of what Session builds lazily (or rebinds between steps: new_states).
    get_comm: Callable[[], Collectives]
    get_log: Callable[[], RankLog]
    get_cache: Callable[[], TuningCache | None]
    get_progress: Callable[[], Progress]
    get_early_stop: Callable[[], float | None]
    get_new_states: Callable[[], list[KeyState]]
    ensure_header: Callable[[], None]
    point_failed: Callable[[Assignment, str, dict[str, str]], None]  # fail a point on every rank
    point_decided: Callable[[dict[str, Any]], None]  # a function-level winner, for the function cache

    @property
    def comm(self) -> Collectives:
        return self.get_comm()

    @property
    def log(self) -> RankLog:
        return self.get_log()

    @property
    def cache(self) -> TuningCache | None:
        return self.get_cache()

    @property
    def progress(self) -> Progress:
        return self.get_progress()

    @property
    def early_stop(self) -> float | None:
        return self.get_early_stop()

    @property
    def new_states(self) -> list[KeyState]:
        return self.get_new_states()
