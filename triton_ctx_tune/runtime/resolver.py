"""Which tuning call an autotuned launch belongs to: the one home of launch attribution.

A launch belongs to the tuning call whose work caused it, whichever thread runs it. Two
carriers say so, both set by `enter(call)` when a call starts and cleared by `leave(call)`:

1. A ContextVar: the caller's own thread, and any context copied from it
   (`contextvars.copy_context().run`, asyncio tasks).
2. A per-thread *owner* object kept in PyTorch's thread-local Python objects
   (`torch._C._stash_obj_in_tls`), whose `call` field names the thread's open call. The autograd
   engine copies the caller's `at::ThreadLocalState`, which holds that object, into the thread
   that runs a backward pass. So `loss.backward()` and `torch.autograd.grad` called inside a tuned
   function, gradient hooks and `torch.utils.checkpoint` recomputation all resolve to the call,
   while a backward started by any other thread reads that thread's own owner (or none). (A
   ContextVar does not reach those threads on torch < 2.13, and a TorchFunctionMode is not on
   their stack.) The owner is stashed once per thread and then only its field changes, so a call
   pays two attribute writes here, not a trip through PyTorch's thread-local map.

Threads a call starts itself carry neither; wrap their target with `carry(fn)`.
`current()` is on every autotuned launch's path, so it is two lookups and nothing else.
"""
from __future__ import annotations

import ctypes
import functools
import sys
import threading
import warnings
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any, Protocol, TypeVar

import torch

from ..errors import InvalidOptionError, UnattributedLaunchWarning
from .compat import kernel_name
from .libraries import tuning_key

T = TypeVar("T")

_TLS_KEY = "triton_ctx_tune.owner"


class TuningCall(Protocol):
    """What a launch is handed to (call.Call); `enter` keeps its undo state on it."""

    closed: bool
    token: Token | None
    previous: Any

    def launch(self, at: Any, args: tuple, kwargs: dict[str, Any]) -> Any: ...


class _Owner:
    """The open tuning call of one thread, as seen by that thread and by autograd's threads working for it."""

    __slots__ = ("call",)

    def __init__(self) -> None:
        self.call: TuningCall | None = None


_current: ContextVar[TuningCall | None] = ContextVar("triton_ctx_tune_call", default=None)
_get = torch._C._get_obj_in_tls
_has = torch._C._is_key_in_tls
_local = threading.local()  # this thread's _Owner, without a trip through PyTorch's map
_owners: list[_Owner] = []  # every stashed owner stays alive for the life of the process


def _stashing_steals_a_reference() -> bool:
    """Whether this torch's _stash_obj_in_tls keeps an object without a reference of its own.

    torch 2.11 wraps it in a SafePyObject without an incref, yet releases one when the entry is
    replaced or its thread ends (a stashed object was freed while in use). Measured once here.
    """
    probe = _Owner()
    _owners.append(probe)
    before = sys.getrefcount(probe)
    torch._C._stash_obj_in_tls("triton_ctx_tune.probe", probe)
    steals = sys.getrefcount(probe) == before
    if steals:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(probe))  # the reference the entry holds
    return steals


_STEALS = _stashing_steals_a_reference()


class _EraseAtThreadEnd:
    """Dropped with the thread's threading.local, while that thread still holds the GIL.

    Erases the thread's entry then, so that no SafePyObject is left for C++'s thread-exit
    destructors, which would need the GIL (torch's own "context" entry is erased for that reason).
    """

    def __del__(self) -> None:
        remove = getattr(torch._C, "_remove_obj_from_tls", None)
        if remove is not None and threading.current_thread() is not threading.main_thread():
            remove(_TLS_KEY)


def _owner() -> _Owner:
    owner = getattr(_local, "owner", None)
    if owner is None:
        owner = _local.owner = _Owner()
        _local.eraser = _EraseAtThreadEnd()
        _owners.append(owner)
        if _STEALS:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(owner))
        torch._C._stash_obj_in_tls(_TLS_KEY, owner)
    return owner


open_calls: set[int] = set()  # ids of the calls open in this process; set.add/discard are atomic
_warned: set[tuple[int, tuple]] = set()


def current() -> TuningCall | None:
    """The open tuning call that caused the running code, or None (Triton's own run applies)."""
    call = _current.get()
    if call is None and _has(_TLS_KEY):
        call = _get(_TLS_KEY).call
    if call is None or call.closed:
        return None
    return call


def enter(call: TuningCall) -> None:
    """Make `call` the owner of what this thread launches, and of what autograd runs for it."""
    owner = _owner()
    call.previous = owner.call
    owner.call = call
    call.token = _current.set(call)
    open_calls.add(id(call))


def leave(call: TuningCall) -> None:
    """Undo `enter(call)`, on the thread that entered it."""
    open_calls.discard(id(call))
    if call.token is not None:
        _current.reset(call.token)
        call.token = None
    _owner().call = call.previous


def carry(fn: Callable[..., T]) -> Callable[..., T]:
    """Wrap `fn` so that, run in any thread, its launches belong to the tuning call current *here*.

    For threads a tuned function starts itself (a communication thread, a thread pool): PyTorch
    does not carry thread-local state into them. Outside a tuning call it returns `fn` unchanged.
    """
    if not callable(fn):  # checked outside calls too: the mistake must not wait for the first tuning call
        raise InvalidOptionError("carry(fn)", fn, "the callable a thread will run, e.g. "
                                 "threading.Thread(target=carry(work))")
    call = current()
    if call is None:
        return fn

    @functools.wraps(fn)
    def attributed(*args: Any, **kwargs: Any) -> T:
        # Only the owner, as in autograd's own threads: the same path a backward takes.
        owner = _owner()
        previous, owner.call = owner.call, call
        try:
            return fn(*args, **kwargs)
        finally:
            owner.call = previous

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
