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
from typing import Any

import torch

from .compat import Autotuner, kernel_name, launch_cached, tuning_key
from .errors import TuneDuringCaptureError
from .options import TuneOptions
from .patch import original_run
from .session import CallStats, Session

_start_lock = threading.Lock()


class Call:
    __slots__ = ("function", "opts", "session", "closed", "started", "wall_s", "token", "previous")

    def __init__(self, function: str, opts: TuneOptions) -> None:
        self.function = function
        self.opts = opts
        self.session: Session | None = None
        self.closed = False
        self.started = time.perf_counter()
        self.wall_s = 0.0
        self.token: Any = None  # resolver.enter/leave keep their undo state here
        self.previous: Any = None

    def launch(self, at: Autotuner, args: tuple, kwargs: dict[str, Any]) -> Any:
        session = self.session
        if session is None or session.lean:  # lean: a step timed end to end runs as a tuned call will
            if len(at.configs) <= 1:
                return original_run()(at, *args, **kwargs)
            if not kwargs.get("warmup"):  # Triton passes warmup=False on every normal launch
                key = tuning_key(at, args, kwargs)
                config = at.cache.get(key)
                if config is not None:
                    return launch_cached(at, config, args, kwargs)
                session = session or self.start_session(at, key)
            else:
                session = session or self.start_session(at, None)
        return session.launch(at, args, kwargs)

    def start_session(self, at: Autotuner, key: tuple | None) -> Session:
        """Turn this call into a tuning call; the execution in progress is its first step."""
        with _start_lock:
            if self.session is None:
                if key is not None and _stream_capturing():
                    raise TuneDuringCaptureError(self.function, kernel_name(at), key)
                session = Session(self.function, self.opts)
                session.begin_step(midway=True)
                self.session = session
        return self.session

    def close(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None) -> None:
        self.closed = True
        self.wall_s = time.perf_counter() - self.started
        if self.session is not None:
            self.session.close(exc_type, exc)

    @property
    def stats(self) -> CallStats:
        if self.session is not None:
            return self.session.stats
        return CallStats(self.function, executions=1, wall_s=self.wall_s)


def _stream_capturing() -> bool:
    # is_initialized() first: asking whether a stream captures must not initialise CUDA.
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
