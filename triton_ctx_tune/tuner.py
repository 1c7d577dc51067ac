"""The decorator: re-execute a side-effecting function once per config step, then once with the winners."""
from __future__ import annotations

import functools
from typing import Any, Callable, Generic, TypeVar, overload

import torch

from . import patch, resolver
from .collectives import require_process_group
from .call import Call
from .compat import explain_error
from .errors import call_hook
from .options import TuneOptions
from .session import CallStats

R = TypeVar("R")


class ContextualAutotuner(Generic[R]):
    """A tuned function. Calling it tunes every (kernel, key) it meets, then returns the best-config result."""

    def __init__(self, fn: Callable[..., R], opts: TuneOptions) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.opts = opts
        self.name: str = getattr(fn, "__qualname__", repr(fn))
        self._last: Call | None = None
        # torch.compile: Dynamo cannot trace the tuner (ContextVars, re-execution), and tracing the
        # function itself would hand its kernels to Inductor, whose autotuner benchmarks on live
        # data. So the whole call is one graph break, run eagerly.
        self._eager_call = torch.compiler.disable(self._call, recursive=True)

    @property
    def last_call(self) -> CallStats | None:
        """What the last call did: executions, keys tuned, cache hits, wall time."""
        return None if self._last is None else self._last.stats

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
        if not patch.resident:
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
        resolver.enter(call)
        # try/except rather than an ExitStack, and no closure until a call tunes: this is the
        # warm path, paid on every call.
        try:
            session = call.session
            if session is None:
                result = self.fn(*args, **kwargs) if point is None else self.fn(*args, **{**point, **kwargs})
                session = call.session
                if session is not None:  # a key was not tuned: the call became a tuning call
                    _user_reference(call, args, kwargs)
                    if not session.end_step(output=result):
                        result = session.finish(self._executor(args, kwargs, point))
            else:
                _user_reference(call, args, kwargs)
                result = session.finish(self._executor(args, kwargs, point))
        except BaseException as e:
            if isinstance(e, Exception):
                explain_error(e)  # adds a note naming the fix for known environment problems
            resolver.leave(call)
            call.close(type(e), e)
            raise
        resolver.leave(call)
        call.close()
        return result

    def _executor(self, args: tuple, kwargs: dict[str, Any], point: dict[str, Any] | None) -> Callable[[dict[str, Any]], R]:
        """One execution of the function for a step, with that step's point (if any) as keywords."""
        fixed = point or {}
        return lambda step_point: self.fn(*args, **{**fixed, **step_point, **kwargs})


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
    slot_timeout_s, objective, e2e_runs, validate, reference, compare, atol, rtol, max_mismatch_ratio. Also usable bare: ``@contextual_autotune``.
    """
    if callable(is_dist):
        return ContextualAutotuner(is_dist, TuneOptions())
    opts = TuneOptions.from_kwargs(is_dist=is_dist, n_repeat=n_repeat, n_warmup=n_warmup, **options)
    return lambda fn: ContextualAutotuner(fn, opts)
