"""The decorator: re-execute a side-effecting function once per config step, then once with the winners."""
from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import torch

from .compile import compile_workers
from .engine.call import Call
from .engine.exactly_once import StateGuard, stop_unless_restorable
from .engine.session import CallStats, Session
from .errors import call_hook
from .options import TuneOptions
from .runtime import patch, resolver
from .runtime.collectives import require_process_group
from .runtime.compat import explain_error, prime_soon

if TYPE_CHECKING:
    from .serving import AheadRow

R = TypeVar("R")


class ContextualAutotuner(Generic[R]):
    """A tuned function. Calling it tunes every (kernel, key) it meets, then returns the best-config result."""

    def __init__(self, fn: Callable[..., R], opts: TuneOptions) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.opts = opts
        self.name: str = getattr(fn, "__qualname__", repr(fn))
        self._last: Call | None = None
        if opts.resolved_compile_workers() > 0 and not opts.resolved_freeze():
            compile_workers.prestart()  # long before the first call: its workers then fork in milliseconds
            prime_soon(driver=True)  # (the hash started at import; the driver's helper module now)
        # Exactly once (exactly_once.py): a call is watched from its start while this function's effect
        # on older state is unknown (its first calls) or a key waits for a watched call (deferred).
        # Watching costs every aten op a trip through Python, so warm calls are not watched.
        self._watch_next = True
        self._changes_state: bool | None = None  # what the last watched call saw
        self._online: Session | None = None  # online=True: the session that goes on in the next call
        # torch.compile: Dynamo cannot trace the tuner (ContextVars, re-execution), and tracing the
        # function itself would hand its kernels to Inductor, whose autotuner benchmarks on live
        # data. So the whole call is one graph break, run eagerly.
        self._eager_call = torch.compiler.disable(self._call, recursive=True)

    @property
    def last_call(self) -> CallStats | None:
        """What the last call did: executions, keys tuned, cache hits, wall time."""
        return None if self._last is None else self._last.stats

    def tune_ahead(self, sizes: Iterable[int] | None = None, inputs_for: Callable[[int], Any] | None = None, *,
                   example: Sequence[Any] | None = None, resize: dict[int, int] | None = None,
                   dim: str | None = None, up_to: int | None = None, spread: bool = False,
                   timed_runs: int = 3) -> list[AheadRow]:
        """Tune every size a server will meet before it serves (serving.py): one call per size.

        sizes: the sizes of the dynamic dimension, or None with dim= and up_to= for every bucket of
        dim (buckets=) up to up_to. inputs_for(size) builds the call's arguments (a tuple, a dict of
        keywords, or both as a pair); or example=(args...) with resize={position: dim} resizes the
        example's tensors. dim= also checks that each size's call met that size in a kernel's key.
        spread=True: a function without collectives (is_dist=False) on a job of several ranks; each
        rank tunes a share of the sizes and every rank ends with every winner. Each size's warm call
        is then timed `timed_runs` times; with flops=/bytes= its throughput is shown. Runs with
        freeze off whatever freeze says: this is where tuning is meant to happen.
        """
        from . import serving

        frozen, self.opts = self.opts, dataclasses.replace(self.opts, freeze=False)
        try:
            return serving.tune_ahead(self, sizes, inputs_for, example, resize, dim, up_to, spread, timed_runs)
        finally:
            self.opts = frozen

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else functools.partial(self, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if torch.compiler.is_compiling():
            return self._eager_call(*args, **kwargs)
        return self._call(*args, **kwargs)

    def _call(self, *args: Any, **kwargs: Any) -> R:
        if resolver.current() is not None:
            # Inside another tuning call: this function is part of that call's function,
            # so its launches join that call's schedule instead of looping on their own.
            return self.fn(*args, **kwargs)
        if self.opts.is_dist:  # (the warm path of a single-process function pays one attribute read)
            require_process_group(True, self.name)
        if not patch.resident or patch.cover_changed():  # (cover_changed: a library imported since)
            patch.make_resident()
        call = Call(self.name, self.opts)
        self._last = call
        return self._drive(call, args, kwargs)

    def _drive(self, call: Call, args: tuple, kwargs: dict[str, Any], point: dict[str, Any] | None = None) -> R:
        """Run one call to its end: the one place a call is entered and left, on every exit path.

        The function runs with `point`'s keyword arguments (autotune() without a space), or with each
        step's (a call made with a session: autotune()'s space, every execution a step). A call
        without a session starts warm and becomes a tuning call at its first untuned key.
        """
        if self.opts.online:
            return self._drive_online(call, args, kwargs)
        if self.opts.exactly_once and (self._watch_next or self._changes_state):  # (warm calls: two reads)
            self._arm(call)
        resolver.enter(call)
        # try/except rather than an ExitStack, and no closure until a call tunes: this is the
        # warm path, paid on every call.
        try:
            session = call.session
            if session is None:
                if call.guard is None:
                    result = self.fn(*args, **kwargs) if point is None else self.fn(*args, **{**point, **kwargs})
                else:
                    with call.guard.watching():
                        result = self.fn(*args, **kwargs) if point is None else self.fn(*args, **{**point, **kwargs})
                session = call.session
                if session is not None:  # a key was not tuned: the call became a tuning call
                    _user_reference(call, args, kwargs)
                    if not session.end_step(output=result):
                        result = session.finish(self._executor(call, args, kwargs, point))
            else:
                _user_reference(call, args, kwargs)
                result = session.finish(self._executor(call, args, kwargs, point))
        except BaseException as e:
            if isinstance(e, Exception):
                explain_error(e)  # adds a note naming the fix for known environment problems
            if call.guard is not None:
                call.guard.rewind()  # a call that fails leaves the state as it found it
                call.guard.release()
            resolver.leave(call)
            call.close(type(e), e)
            raise
        resolver.leave(call)
        call.close()
        if call.guard is not None or call.deferred:
            self._disarm(call)
        return result

    def _drive_online(self, call: Call, args: tuple, kwargs: dict[str, Any]) -> R:
        """online=True: the function runs once; a tuning session in progress takes this call as its next step.

        Every rank runs the same calls, so every rank's session takes the same steps; a call whose
        keys are all decided ends the session, and later calls are warm."""
        session = self._online
        if session is not None:
            session.begin_step(midway=True)
            session.before_execution()
            call.attach(session)
        resolver.enter(call)
        try:
            result = self.fn(*args, **kwargs)
            session = call.session  # a key not tuned yet starts a session midway (call.py)
            if session is not None:
                decided = {id(s) for s in session.search.kernels.values() if s.decided}
                session.end_step(output=result)
                session.note_online_call(time.perf_counter() - call.started, decided)
                self._online = None if session.search.finished else session
        except BaseException as e:
            if isinstance(e, Exception):
                explain_error(e)
            self._online = None  # the keys not decided yet start again in a later call
            resolver.leave(call)
            call.close(type(e), e)
            raise
        resolver.leave(call)
        call.close(keep_session=self._online is not None)
        return result

    def _arm(self, call: Call) -> None:
        """Watch this call from its start, or let it defer new keys to the next call (which is watched)."""
        if self._watch_next:
            call.guard = StateGuard(self.opts.resolved_snapshot_limit())
        elif self._changes_state:
            call.defer = True

    def _disarm(self, call: Call) -> None:
        guard = call.guard
        if guard is not None:
            if guard.executions and not call.late_guard:
                self._changes_state = guard.changed_state
                self._watch_next = False
            guard.release()
        if call.deferred:
            self._watch_next = True

    def _executor(self, call: Call, args: tuple, kwargs: dict[str, Any],
                  point: dict[str, Any] | None) -> Callable[[dict[str, Any]], R]:
        """One execution of the function for a step, with that step's point (if any) as keywords.

        With exactly_once, every execution after the call's first starts from the state the call
        found (exactly_once.StateGuard), and only the final run's effects stay."""
        fixed = point or {}
        if not self.opts.exactly_once:
            return lambda step_point: self.fn(*args, **{**fixed, **step_point, **kwargs})
        if call.guard is None:
            call.guard = StateGuard(self.opts.resolved_snapshot_limit())
            # A call that became a tuning call midway, unwatched, in a function seen not to change older
            # state: watch the rest, and stop (below) if that was wrong.
            call.late_guard = call.session is not None and call.session.stats.executions > 0
        guard = call.guard
        session = call.session
        assert session is not None

        def share(mine: dict[int, str]) -> dict[int, str]:
            return session.comm.share_failures(mine, 1, "exactly once: can every rank undo its execution")

        def execute(step_point: dict[str, Any]) -> R:
            # Whether a rank's execution changed state is its own fact: a late-watched call asks the ranks
            # before every execution, so that the collective never depends on it (docs/schedule.md).
            if guard.executions == 1 or call.late_guard:
                stop_unless_restorable(guard, share, self.name, late=call.late_guard)
            if guard.executions:
                guard.rewind()
            if session.final:
                return self.fn(*args, **{**fixed, **step_point, **kwargs})  # applied once, for real
            with guard.watching():
                return self.fn(*args, **{**fixed, **step_point, **kwargs})

        return execute


def _user_reference(call: Call, args: tuple, kwargs: dict[str, Any]) -> None:
    """validate=True with reference=: what the configs' results are checked against."""
    session = call.session
    if session is not None and session.validator is not None and call.opts.reference is not None:
        session.validator.set_reference(call_hook(
            "reference", "make reference(*args, **kwargs) take the tuned function's arguments and return the "
            "expected result", call.opts.reference, *args, **kwargs), session.function, "the result of reference=")


@overload
def contextual_autotune(is_dist: Callable[..., R]) -> ContextualAutotuner[R]: ...


@overload
def contextual_autotune(is_dist: bool = False, n_repeat: int = 5, n_warmup: int = 3,
                        **options: Any) -> Callable[[Callable[..., R]], ContextualAutotuner[R]]: ...


def contextual_autotune(is_dist: Any = False, n_repeat: int = 5, n_warmup: int = 3, **options: Any) -> Any:
    """Tune every @triton.autotune kernel launched inside the decorated function, as one unit.

    Same positional signature as Triton-distributed's contextual_autotune (is_dist, n_repeat,
    n_warmup); the keyword-only options are the fields of TuneOptions (options.py): group,
    reduce, stat, flush_l2, log_dir, quiet, timeout_s, max_executions, cache, cache_dir,
    early_stop, precompile, compile_threads, compile_workers, compile_timeout_s, cuda_graph, quarantine,
    slot_timeout_s, objective, e2e_runs, validate, reference, compare, atol, rtol, max_mismatch_ratio,
    exactly_once, snapshot_limit_mb. Also usable bare: ``@contextual_autotune``.
    """
    if callable(is_dist):
        return ContextualAutotuner(is_dist, TuneOptions())
    opts = TuneOptions.from_kwargs(is_dist=is_dist, n_repeat=n_repeat, n_warmup=n_warmup, **options)
    return lambda fn: ContextualAutotuner(fn, opts)
