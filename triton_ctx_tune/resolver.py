"""Which tuning call an autotuned launch belongs to: the one home of launch attribution.

A launch belongs to the tuning call whose work caused it, whichever thread runs it. Two
carriers say so, both set by `attribute(call)` when a call starts and undone when it ends:

1. A ContextVar: the caller's own thread, and any context copied from it
   (`contextvars.copy_context().run`, asyncio tasks).
2. PyTorch's thread-local Python objects (`torch._C._stash_obj_in_tls`). The autograd engine
   copies the caller's `at::ThreadLocalState`, which holds them, into the thread that runs a
   backward pass, so `loss.backward()` and `torch.autograd.grad` called inside a tuned function,
   gradient hooks and `torch.utils.checkpoint` recomputation all resolve to the call, while a
   backward started by any other thread does not. (A ContextVar does not reach those threads
   on torch < 2.13, and a TorchFunctionMode is not on their stack.)

Threads a call starts itself carry neither; wrap their target with `carry(fn)`.
`current()` is on every autotuned launch's path, so it is two lookups and nothing else.
"""
from __future__ import annotations

import ctypes
import functools
import sys
import warnings
from contextvars import ContextVar
from typing import Any, Callable, Optional, Protocol, TypeVar

import torch

from .compat import kernel_name, tuning_key
from .errors import UnattributedLaunchWarning

T = TypeVar("T")

_TLS_KEY = "triton_ctx_tune.call"


class TuningCall(Protocol):
    """What a launch is handed to (call.Call)."""

    closed: bool

    def launch(self, at: Any, args: tuple, kwargs: dict[str, Any]) -> Any: ...


_current: ContextVar[Optional[TuningCall]] = ContextVar("triton_ctx_tune_call", default=None)
_get = torch._C._get_obj_in_tls
_has = torch._C._is_key_in_tls
_remove: Callable[[str], None] | None = getattr(torch._C, "_remove_obj_from_tls", None)


def _steals_reference() -> bool:
    """Whether this torch's _stash_obj_in_tls keeps the object without taking a reference of its own.

    Some releases wrap the object in a SafePyObject without an incref, yet release one when the
    entry is replaced, so a stashed object would be freed while still in use. Measured once here.
    """
    probe = object()
    before = sys.getrefcount(probe)
    torch._C._stash_obj_in_tls("triton_ctx_tune.probe", probe)
    steals = sys.getrefcount(probe) == before
    if steals:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(probe))  # the reference the entry will release
    if _remove is not None:
        _remove("triton_ctx_tune.probe")
    else:
        _stash_raw("triton_ctx_tune.probe", None, steals)
    return steals


def _stash_raw(key: str, obj: Any, steals: bool) -> None:
    if steals:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    torch._C._stash_obj_in_tls(key, obj)


_STEALS = _steals_reference()


def _stash(key: str, obj: Any) -> None:
    _stash_raw(key, obj, _STEALS)


def _erase(key: str) -> None:
    # Erasing leaves nothing whose destructor needs the GIL at thread exit; torch releases without
    # the eraser get None, which current() reads as "no call".
    if _remove is not None:
        _remove(key)
    else:
        _stash(key, None)


open_calls: set[int] = set()  # ids of the calls open in this process; set.add/discard are atomic
_warned: set[tuple[int, tuple]] = set()


def current() -> TuningCall | None:
    """The open tuning call that caused the running code, or None (Triton's own run applies)."""
    call = _current.get()
    if call is None and _has(_TLS_KEY):
        call = _get(_TLS_KEY)
    if call is None or call.closed:
        return None
    return call


def attribute(call: TuningCall) -> Callable[[], None]:
    """Make `call` the owner of what this thread launches (and of what autograd runs for it); returns the undo."""
    token = _current.set(call)
    previous = _get(_TLS_KEY) if _has(_TLS_KEY) else None
    _stash(_TLS_KEY, call)
    open_calls.add(id(call))

    def undo() -> None:
        open_calls.discard(id(call))
        _current.reset(token)
        if previous is None:
            _erase(_TLS_KEY)
        else:
            _stash(_TLS_KEY, previous)

    return undo


def carry(fn: Callable[..., T]) -> Callable[..., T]:
    """Wrap `fn` so that, run in any thread, its launches belong to the tuning call current *here*.

    For threads a tuned function starts itself (a communication thread, a thread pool): PyTorch
    does not carry thread-local state into them. Outside a tuning call it returns `fn` unchanged.
    """
    call = current()
    if call is None:
        return fn

    @functools.wraps(fn)
    def attributed(*args: Any, **kwargs: Any) -> T:
        # Only the torch carrier, as in autograd's own threads: the same path a backward takes.
        previous = _get(_TLS_KEY) if _has(_TLS_KEY) else None
        _stash(_TLS_KEY, call)
        try:
            return fn(*args, **kwargs)
        finally:
            if previous is None:
                _erase(_TLS_KEY)
            else:
                _stash(_TLS_KEY, previous)

    return attributed


def note_unattributed(at: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """A launch no call claims, made while some call is open: warn once if Triton is about to tune it alone.

    It may be unrelated work of another thread, which must run untouched, so this warns instead of
    raising; `warnings.simplefilter("error", UnattributedLaunchWarning)` makes it fatal.
    """
    if len(at.configs) <= 1 or kwargs.get("warmup"):
        return
    key = tuning_key(at, args, kwargs)
    if key in at.cache or (id(at), key) in _warned:
        return
    _warned.add((id(at), key))
    warnings.warn(UnattributedLaunchWarning(kernel_name(at), key), stacklevel=3)
