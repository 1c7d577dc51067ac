"""The patch of triton.runtime.autotuner.Autotuner.run.

`install()` swaps in a dispatcher and returns its undo; `autotuner_patch()` is the same as a
context manager. Installs are counted, so nested and concurrent users share one patch and the
last one out puts Triton's own method back.

The dispatcher asks the resolver which tuning call caused the launch and hands the launch to
it; with no such call it runs Triton's original method unchanged. Tuned functions keep the
patch *resident* from their first call on (`make_resident()`), because installing and removing
it on every call (a lock and two class writes) would cost a warm call more than everything else
together; outside tuning calls the dispatcher only adds two lookups per launch. `release()`
gives the resident hold back.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import libraries, resolver
from .compat import Autotuner
from .shared_patch import SharedPatch

_lock = threading.Lock()  # the resident hold's
_resident_undo: Callable[[], None] | None = None
resident = False  # read on every call of a tuned function: a plain module global is the cheapest check


def original_run() -> Callable[..., Any]:
    """Triton's Autotuner.run as it was before the patch (the live method when unpatched)."""
    return _patch.original if _patch.original is not None else Autotuner.run


def _dispatcher(original: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """A run that hands each launch to the tuning call it belongs to, and otherwise runs `original()`: Triton's
    Autotuner.run, or the own run of a subclass that overrides it (libraries.py: the call tunes or refuses it)."""
    def run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
        call = resolver.current()
        if call is not None:
            return call.launch(self, args, kwargs)
        if resolver.open_calls:
            resolver.note_unattributed(self, args, kwargs)
        return original()(self, *args, **kwargs)
    return run


_dispatching_run = _dispatcher(original_run)


def _launcher_dispatcher(original: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """For a launcher that caches compiled kernels above its autotuner: while a call tunes, every launch goes
    down to the autotuner (whose config the call decides) and nothing is cached; a warm call uses its cache."""
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = resolver.current()
        if call is not None:
            libraries.note_launcher(self)
            if call.session is not None:
                return self.fn.run(*args, **kwargs)
        return original()(self, *args, **kwargs)
    return run


# The classes whose run the patch replaces besides Autotuner's (libraries.py says which and why): the
# subclass's patch and its undo, held while Autotuner.run is patched.
_covered: dict[type, tuple[SharedPatch, Callable[[], None]]] = {}
_seen_subclasses = -1  # how many direct subclasses Autotuner had at the last cover(): a cheap change test


def cover() -> None:
    """Patch the run of every Autotuner subclass that defines its own and of every known caching launcher
    defined since the last cover (a library imported later is covered at the next tuning call)."""
    global _seen_subclasses
    if not _patch.installed():
        return
    _seen_subclasses = len(Autotuner.__subclasses__())
    found = [(cls, _dispatcher) for cls in libraries.overriding_subclasses()]
    found += [(cls, _launcher_dispatcher) for cls in libraries.caching_launchers()]
    for cls, make in found:
        if cls not in _covered:
            patch = SharedPatch(cls, "run", make(functools.partial(_covered_original, cls)))
            _covered[cls] = (patch, patch.install())


def _covered_original(cls: type) -> Callable[..., Any]:
    """The run a covered class had before the patch."""
    return _covered[cls][0].original


def cover_changed() -> bool:
    """Whether Autotuner has gained a direct subclass since the last cover() (checked on every tuned call)."""
    return len(Autotuner.__subclasses__()) != _seen_subclasses


def _uncover() -> None:
    global _seen_subclasses
    while _covered:
        _, (_, undo) = _covered.popitem()
        undo()
    _seen_subclasses = -1


_patch = SharedPatch(Autotuner, "run", _dispatching_run, on_release=_uncover)


def installs() -> int:
    """How many holders the patch has (the resident one included)."""
    return _patch.installs


def is_installed() -> bool:
    return _patch.installed()


def install() -> Callable[[], None]:
    """Patch Autotuner.run (or count one more user of the patch) and the subclasses that override it;
    returns the undo, idempotent."""
    undo = _patch.install()
    cover()
    return undo


def make_resident() -> None:
    """Hold the patch for the rest of the process (first call of any tuned function)."""
    global _resident_undo, resident
    with _lock:
        if resident:
            cover()
            return
    undo = install()
    with _lock:
        if resident:  # another thread won the race: give our hold back
            extra = undo
        else:
            _resident_undo, resident, extra = undo, True, None
    if extra is not None:
        extra()


def release() -> None:
    """Give back the resident hold: Triton's own run returns once no other install is held."""
    global _resident_undo, resident
    with _lock:
        undo, _resident_undo, resident = _resident_undo, None, False
    if undo is not None:
        undo()


@contextlib.contextmanager
def autotuner_patch() -> Iterator[None]:
    """Keep Autotuner.run patched for the duration of the block; restored on every exit path."""
    undo = install()
    try:
        yield
    finally:
        undo()
