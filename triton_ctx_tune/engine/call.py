"""One call of a tuned function: nearly free while every key it meets is tuned, a Session once one is not.

A call starts *warm*: each launch computes its key once, finds the winner in Triton's own
`Autotuner.cache` and launches it directly. The first launch of a key that is not tuned yet
turns the call into a tuning call on the spot: a Session is created, the execution in progress
becomes its first step, and the tuner re-executes the function until every key is decided. So
an untuned key met during a warm call is still tuned by the call, never by Triton alone.

Launches reach a call from several threads (the caller's, autograd's; resolver.py), so
starting the session is locked and the session serialises its launches.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..errors import EmptyConfigSpaceError, TuneDuringCaptureError
from ..options import TuneOptions
from ..runtime import collector
from ..runtime.compat import (
    Autotuner,
    config_failure_reason,
    declared_writes,
    kernel_name,
    launch_cached,
    prune_configs,
    restores,
)
from ..runtime.libraries import after_tuning, cached_config, launch_refused, refused, tuning_key
from ..runtime.patch import original_run
from .exactly_once import StateGuard, paused
from .session import CallStats, Session

_start_lock = threading.Lock()


class Call:
    __slots__ = ("function", "opts", "session", "closed", "started", "wall_s", "token", "previous", "guard",
                 "late_guard", "defer", "deferred", "collecting")

    def __init__(self, function: str, opts: TuneOptions) -> None:
        self.function = function
        self.opts = opts
        self.session: Session | None = None
        self.closed = False
        self.started = time.perf_counter()
        self.wall_s = 0.0
        self.token: Any = None  # resolver.enter/leave keep their undo state here
        self.previous: Any = None
        self.guard: StateGuard | None = None  # exactly_once.py: this call's executions are watched
        self.late_guard = False  # watched from its second execution only (it became a tuning call midway)
        # An unwatched call of a function that changes older state cannot become a tuning call midway
        # (its first execution could not be undone): an untuned key runs its first config, and the
        # next call, watched from its start, tunes it.
        self.defer = False
        self.deferred: list[tuple[str, tuple]] = []
        self.collecting: Callable[[], None] | None = None  # collector.hold's undo, while this call tunes

    def attach(self, session: Session) -> None:
        """Make this a tuning call of `session` (new, or an online one going on): until the call ends, Python's
        garbage collector runs between its steps only (runtime/collector.py)."""
        self.session = session
        if self.collecting is None:
            self.collecting = collector.hold()

    def launch(self, at: Autotuner, args: tuple, kwargs: dict[str, Any]) -> Any:
        if self.guard is not None and restores(at):  # (a watched call only: warm calls pay nothing)
            self.guard.before_kernel(kernel_name(at), declared_writes(at, args, kwargs))
        session = self.session
        if session is None or session.lean:  # lean: a step timed end to end runs as a tuned call will
            if len(at.configs) <= 1:
                return original_run()(at, *args, **kwargs)
            if not kwargs.get("warmup"):  # Triton passes warmup=False on every normal launch
                if refused(at):
                    return launch_refused(at, args, kwargs)
                key = tuning_key(at, args, kwargs)
                config = cached_config(at, key)
                if config is None and self.opts.bucketing is not None:
                    config = self.bucket_winner(at, key)
                if config is not None:
                    if session is None and self.guard is None:
                        return launch_cached(at, config, args, kwargs)
                    with paused():  # a kernel's writes are not the guard's to see (the interpreter's copies are)
                        return launch_cached(at, config, args, kwargs)
                if self.defer and session is None:
                    return self.run_deferred(at, key, args, kwargs)
                session = session or self.start_session(at, key)
            else:
                session = session or self.start_session(at, None)
        return session.launch(at, args, kwargs)

    def bucket_winner(self, at: Autotuner, key: tuple) -> Any:
        """The winner of the tuned bucket `key` falls into, remembered under `key` too: the next launch
        of this shape then hits Autotuner.cache at once, as Triton's own run would."""
        assert self.opts.bucketing is not None
        config = at.cache.get(self.opts.bucketing.kernel_key(at, key))
        if config is not None:
            at.cache[key] = config
        return config

    def run_deferred(self, at: Autotuner, key: tuple, args: tuple, kwargs: dict[str, Any]) -> Any:
        """An untuned key in a call that may not re-execute: its first config that runs here runs, untuned, once."""
        if (kernel_name(at), key) not in self.deferred:
            self.deferred.append((kernel_name(at), key))
        configs = prune_configs(at, args, kwargs)
        if not configs:
            raise EmptyConfigSpaceError(kernel_name(at), key)
        for config in configs[:-1]:
            try:
                return launch_cached(at, config, args, kwargs)
            except Exception as e:
                if config_failure_reason(e) is None:
                    raise
                # A config that cannot run here (on this rank) is no error of the function: the next one runs.
        return launch_cached(at, configs[-1], args, kwargs)

    def start_session(self, at: Autotuner, key: tuple | None) -> Session:
        """Turn this call into a tuning call; the execution in progress is its first step."""
        with _start_lock:
            current = self.session
            if current is None:
                if key is not None and _stream_capturing():
                    raise TuneDuringCaptureError(self.function, kernel_name(at), key)
                current = Session(self.function, self.opts)
                current.begin_step(midway=True)
                self.attach(current)
        return current

    def close(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
              keep_session: bool = False) -> None:
        """End the call; its session too, unless it goes on in the next call (online tuning)."""
        self.closed = True
        self.wall_s = time.perf_counter() - self.started
        try:
            if self.session is not None and not keep_session:
                self.session.close(exc_type, exc)
                after_tuning()
        finally:
            if self.collecting is not None:
                self.collecting()

    @property
    def stats(self) -> CallStats:
        if self.session is not None:
            return self.session.stats
        return CallStats(self.function, executions=1, wall_s=self.wall_s, deferred=list(self.deferred))


def _stream_capturing() -> bool:
    # is_initialized() first: asking whether a stream captures must not initialise CUDA.
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
