"""The scoped patch of triton.runtime.autotuner.Autotuner.run.

`install()` swaps in a dispatcher and returns its undo; `autotuner_patch()` is the same as a
context manager. Installs are counted, so nested and concurrent tuning calls share one patch
and the last one out puts Triton's own method back. The dispatcher hands a launch to the
tuning session of the *current context* (a ContextVar), so a thread that is not tuning, or
code outside any tuning call, runs Triton's original method unchanged.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Protocol

from .compat import Autotuner


class LaunchHandler(Protocol):
    def launch(self, at: Autotuner, args: tuple, kwargs: dict[str, Any]) -> Any: ...


current_handler: ContextVar[LaunchHandler | None] = ContextVar("triton_ctx_tune_session", default=None)

_lock = threading.Lock()
_installs = 0
_original: Callable[..., Any] | None = None


def original_run() -> Callable[..., Any]:
    """Triton's Autotuner.run as it was before the patch (the live method when unpatched)."""
    return _original if _original is not None else Autotuner.run


def _dispatching_run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
    handler = current_handler.get()
    if handler is None:
        return original_run()(self, *args, **kwargs)
    return handler.launch(self, args, kwargs)


def is_installed() -> bool:
    return Autotuner.__dict__.get("run") is _dispatching_run


def install() -> Callable[[], None]:
    """Patch Autotuner.run (or count one more user of the patch); returns the undo, idempotent."""
    global _installs, _original
    with _lock:
        if _installs == 0:
            _original = Autotuner.__dict__["run"]
            Autotuner.run = _dispatching_run  # type: ignore[method-assign]
        _installs += 1
    done = False

    def undo() -> None:
        global _installs, _original
        nonlocal done
        with _lock:
            if done:
                return
            done = True
            _installs -= 1
            if _installs == 0:
                if is_installed():
                    Autotuner.run = _original  # type: ignore[method-assign]
                else:
                    warnings.warn("triton_ctx_tune: Autotuner.run was replaced by someone else while tuning; "
                                  "leaving their version in place.", RuntimeWarning, stacklevel=2)
                _original = None

    return undo


@contextlib.contextmanager
def autotuner_patch() -> Iterator[None]:
    """Keep Autotuner.run patched for the duration of the block; restored on every exit path."""
    undo = install()
    try:
        yield
    finally:
        undo()
