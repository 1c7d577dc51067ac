"""The decorator: re-execute a side-effecting function once per config step, then once with the winners."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Generic, TypeVar, overload

from . import patch
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
                result = self.fn(*args, **kwargs)
                if session.end_step():
                    break
        self.last_call = session.stats
        return result


@overload
def contextual_autotune(is_dist: Callable[..., R]) -> ContextualAutotuner[R]: ...


@overload
def contextual_autotune(is_dist: bool = False, n_repeat: int = 5, n_warmup: int = 3, *, group: Any = None,
                        reduce: str = "max", stat: str = "median", flush_l2: bool = True, log_dir: Any = None,
                        quiet: bool | None = None, timeout_s: float | None = None,
                        max_executions: int = 10_000, cache: bool | None = None,
                        cache_dir: Any = None) -> Callable[[Callable[..., R]], ContextualAutotuner[R]]: ...


def contextual_autotune(is_dist: Any = False, n_repeat: int = 5, n_warmup: int = 3, *, group: Any = None,
                        reduce: str = "max", stat: str = "median", flush_l2: bool = True, log_dir: Any = None,
                        quiet: bool | None = None, timeout_s: float | None = None,
                        max_executions: int = 10_000, cache: bool | None = None, cache_dir: Any = None) -> Any:
    """Tune every @triton.autotune kernel launched inside the decorated function, as one unit.

    Same signature as Triton-distributed's contextual_autotune (is_dist, n_repeat, n_warmup),
    plus keyword-only options: group (process group, default the world), reduce ("max" or
    "mean" over ranks), stat ("median", "mean" or "min" over a config's timed slots), flush_l2,
    log_dir (False: no log files), quiet, timeout_s (for the tuner's collectives), max_executions,
    cache (None: on unless TRITON_CTX_TUNE_CACHE=0) and cache_dir (None: TRITON_CTX_TUNE_CACHE_DIR or
    ~/.cache/triton_ctx_tune) for the persistent tuning cache, which rank 0 reads and writes so a
    rerun of the same job tunes nothing; TRITON_CTX_TUNE_RETUNE=1 tunes again and overwrites it.
    Also usable bare: ``@contextual_autotune``.
    """
    if callable(is_dist):
        return ContextualAutotuner(is_dist, TuneOptions())
    opts = TuneOptions(is_dist=is_dist, n_repeat=n_repeat, n_warmup=n_warmup, group=group, reduce=reduce,
                       stat=stat, flush_l2=flush_l2, log_dir=log_dir, quiet=quiet, timeout_s=timeout_s,
                       max_executions=max_executions, cache=cache, cache_dir=cache_dir)
    return lambda fn: ContextualAutotuner(fn, opts)
