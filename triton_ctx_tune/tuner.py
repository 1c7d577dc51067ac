"""The decorator: re-execute a side-effecting function once per config step, then once with the winners."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Generic, TypeVar, overload

from . import patch
from .compat import explain_error
from .errors import InvalidOptionError
from .options import TuneOptions
from .session import CallStats, Session

R = TypeVar("R")


class ContextualAutotuner(Generic[R]):
    """A tuned function. Calling it tunes every (kernel, key) it meets, then returns the best-config result."""

    def __init__(self, fn: Callable[..., R], opts: TuneOptions) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.opts = opts
        self.last_call: CallStats | None = None

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else functools.partial(self, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if patch.current_handler.get() is not None:
            # Inside another tuning call: this function is part of that call's function,
            # so its launches join that call's schedule instead of looping on their own.
            return self.fn(*args, **kwargs)
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        with contextlib.ExitStack() as stack:
            stack.callback(patch.install())
            session = stack.enter_context(Session(name, self.opts))
            while True:
                session.begin_step()
                try:
                    result = self.fn(*args, **kwargs)
                except Exception as e:
                    explain_error(e)
                    raise
                if session.end_step():
                    break
        self.last_call = session.stats
        return result


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
    early_stop, precompile, compile_threads. Also usable bare: ``@contextual_autotune``.
    """
    if callable(is_dist):
        return ContextualAutotuner(is_dist, TuneOptions())
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(TuneOptions)})
    if unknown:
        valid = ", ".join(f.name for f in dataclasses.fields(TuneOptions) if f.name not in ("is_dist", "n_repeat",
                                                                                            "n_warmup"))
        raise InvalidOptionError(unknown[0], options[unknown[0]], f"one of the known options: {valid}")
    opts = TuneOptions(is_dist=is_dist, n_repeat=n_repeat, n_warmup=n_warmup, **options)
    return lambda fn: ContextualAutotuner(fn, opts)
