"""Exactly once: a tuning call leaves the program's state as one plain call of the function would.

The re-execution driver runs the tuned function many times in one call. Without care, every
execution's writes to state that existed before the call would compound: `.grad` accumulates N
times, an optimizer steps N times, BatchNorm counts N batches, `x.add_(1)` adds N. A `StateGuard`
watches a call's executions with a TorchDispatchMode, which sees every aten op (on autograd's
threads too: the engine copies the caller's thread-local state, dispatch modes included, into the
threads that run a backward pass):

- Before an op writes into a storage the call did not create (its schema marks the argument
  `a!`, or a small table of ops that write without saying so), the storage is copied, once.
- A backward pass records the leaves its graph accumulates into, with the `.grad` they held
  (None or a tensor), found from its roots' AccumulateGrad nodes.
- An optimizer's step records its per-parameter state dict (global step pre-hook).
- The RNGs (torch's CPU and CUDA generators, `random`, numpy's) are read when the call starts.

Before every later execution, all of that is put back; the final run then applies the function's
effects once, for real, and draws the random numbers one plain call would. A write the guard
cannot undo (an op that changes a tensor's metadata, such as `set_` or `resize_`), or copies over
the byte budget, stop the call before its second execution with StateNotRestorableError, every
rank alike, after the state is put back as it was before the call.

Not seen, and so not undone: Python state (a counter in a closure, an LR scheduler's epoch, a
module attribute rebound to a new tensor) and the in-place writes of Triton kernels, which their
Autotuner's `restore_value`/`reset_to_zero` cover as in Triton.
"""
from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from ..errors import StateNotRestorableError
from ..runtime.shared_patch import SharedPatch

# Ops whose schema does not mark what they write (native_batch_norm updates running_mean/var in
# training without an `a!`): the positions of the arguments they write.
_UNDECLARED_WRITES: dict[str, tuple[int, ...]] = {"aten::native_batch_norm": (3, 4),
                                                  "aten::cudnn_batch_norm": (3, 4),
                                                  "aten::miopen_batch_norm": (3, 4)}
# Writes that change what a tensor is (its storage or shape), which copying bytes back cannot undo.
_METADATA_WRITES = frozenset({"aten::set_", "aten::resize_", "aten::resize_as_", "aten::as_strided_",
                              "aten::squeeze_", "aten::unsqueeze_", "aten::transpose_", "aten::t_",
                              "aten::swapdims_", "aten::swapaxes_", "aten::detach_"})
# Returns that alias an argument in the schema but are new tensors to the program.
_FRESH_ALIASES = frozenset({"aten::lift_fresh"})


@dataclass(frozen=True)
class _OpInfo:
    name: str
    writes: tuple[tuple[int, str], ...]  # (position, name) of each argument the op writes
    fresh: tuple[int, ...]  # positions of the returns that are new storages
    returns: int
    metadata: bool


_op_info: dict[Any, _OpInfo] = {}


def _info(func: Any) -> _OpInfo:
    info = _op_info.get(func)
    if info is None:
        schema = func._schema
        writes = [(i, a.name) for i, a in enumerate(schema.arguments)
                  if a.alias_info is not None and a.alias_info.is_write]
        writes += [(i, schema.arguments[i].name) for i in _UNDECLARED_WRITES.get(schema.name, ())
                   if i < len(schema.arguments)]
        fresh = tuple(i for i, r in enumerate(schema.returns)
                      if r.alias_info is None or schema.name in _FRESH_ALIASES)
        info = _op_info[func] = _OpInfo(str(func), tuple(writes), fresh, len(schema.returns),
                                        schema.name in _METADATA_WRITES)
    return info


def _argument(args: tuple, kwargs: dict[str, Any], position: int, name: str) -> Any:
    return args[position] if position < len(args) else kwargs.get(name)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # sparse, nested, some subclasses: no plain storage
        return None


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def describe_tensor(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)} on {t.device}"


@dataclass
class _Copy:
    """A storage as it was before the call's first write into it."""
    storage: Any
    saved: Any
    nbytes: int
    what: str


@dataclass
class _RngState:
    cpu: torch.Tensor
    cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any

    @classmethod
    def read(cls) -> _RngState:
        import numpy as np

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(torch.get_rng_state(), cuda, random.getstate(), np.random.get_state())

    def restore(self) -> None:
        import numpy as np

        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


@dataclass
class StateGuard:
    """What a call's executions changed in state older than the call, and how to put it back.

    `limit_mb`: the most the copies may hold, in MiB (None: no limit); above it the call stops
    before its second execution (StateNotRestorableError), since each execution would otherwise compound.
    """
    limit_mb: float | None
    copies: dict[int, _Copy] = field(default_factory=dict)
    created: set[int] = field(default_factory=set)  # storages made during the call: nothing to undo
    grads: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)
    optimizers: dict[int, tuple[Any, dict[Any, dict[str, Any]]]] = field(default_factory=dict)
    cannot_undo: list[str] = field(default_factory=list)
    # Kernels that declare in-place writes (restore_value, reset_to_zero): their own hooks undo them between
    # executions, but a later call must know the function changes older state (it then defers a new key
    # rather than turn an unwatched execution, whose writes stay, into a tuning call).
    declared: list[str] = field(default_factory=list)
    rng: _RngState = field(default_factory=_RngState.read)
    bytes: int = 0
    executions: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- what the executions change (called by _Watch, on whichever thread runs the op) ----

    def before_write(self, info: _OpInfo, args: tuple, kwargs: dict[str, Any]) -> None:
        for position, name in info.writes:
            for t in _tensors(_argument(args, kwargs, position, name)):
                self._copy(t, info, name)

    def _copy(self, t: torch.Tensor, info: _OpInfo, name: str) -> None:
        key = _storage_key(t)
        with self._lock:
            if key is not None and (key in self.created or key in self.copies):
                return
            if key is None or info.metadata:
                self.cannot_undo.append(f"{describe_tensor(t)} changed by {info.name} (argument {name})")
                return
            storage = t.untyped_storage()
            if storage.device.type == "meta":
                return
            nbytes = storage.nbytes()
            self.copies[key] = _Copy(storage, storage.clone(), nbytes,
                                     f"{describe_tensor(t)} written by {info.name}")
            self.bytes += nbytes

    def made(self, out: Any, info: _OpInfo) -> None:
        outs = out if info.returns > 1 else (out,)
        with self._lock:
            for i in info.fresh:
                if i < len(outs):
                    for t in _tensors(outs[i]):
                        key = _storage_key(t)
                        if key is not None:
                            self.created.add(key)

    def before_kernel(self, kernel: str, writes: list[tuple[str, torch.Tensor]]) -> None:
        """A kernel that writes in place by its own declaration (restore_value, reset_to_zero) is about to
        launch. Its hooks undo it only in a benchmarked launch: a launch on the warm path, before the call
        became a tuning call, writes for good, so the guard keeps a copy to rewind it like any other write."""
        what = f"the in-place arguments of {kernel} (restore_value / reset_to_zero)"
        with self._lock:
            if what not in self.declared:
                self.declared.append(what)
        info = _OpInfo(kernel, (), (), 1, False)
        with _unwatched():
            for name, t in writes:
                self._copy(t, info, name)

    def before_backward(self, roots: Any, inputs: Any) -> None:
        """Record the leaves a backward pass will accumulate into, with the .grad each holds now."""
        leaves = list(_tensors(inputs)) if inputs is not None else _graph_leaves(list(_tensors(roots)))
        with self._lock:
            for leaf in leaves:
                key = _storage_key(leaf)
                if id(leaf) not in self.grads and key not in self.created:
                    self.grads[id(leaf)] = (leaf, leaf.grad)

    def before_step(self, optimizer: Any) -> None:
        with self._lock:
            if id(optimizer) not in self.optimizers:
                self.optimizers[id(optimizer)] = (optimizer, {p: dict(s) for p, s in optimizer.state.items()})

    def summary(self) -> str:
        parts = [c.what for c in self.copies.values()] + self.cannot_undo + self.declared
        parts += [f".grad of {describe_tensor(leaf)}" for leaf, _ in self.grads.values()]
        parts += [f"the state of {type(opt).__name__}" for opt, _ in self.optimizers.values()]
        return "; ".join(dict.fromkeys(parts[:12])) + (f"; and {len(parts) - 12} more" if len(parts) > 12 else "")

    @property
    def changed_state(self) -> bool:
        """Whether the executions wrote into state older than the call (what later calls need to know)."""
        return bool(self.copies or self.grads or self.optimizers or self.cannot_undo or self.declared)

    # ---- between executions (the caller's thread, nothing running) ----

    def problem(self) -> str | None:
        """Why the state cannot be put back before the next execution, or None."""
        if self.cannot_undo:
            return "it made writes that copying bytes back cannot undo: " + "; ".join(dict.fromkeys(self.cannot_undo))
        if self.limit_mb is not None and self.bytes > self.limit_mb * 2**20:
            biggest = sorted(self.copies.values(), key=lambda c: -c.nbytes)[:8]
            return (f"undoing its writes needs {_size(self.bytes)} of copies, over snapshot_limit_mb="
                    f"{self.limit_mb:g}; the largest: " + "; ".join(f"{c.what} ({_size(c.nbytes)})" for c in biggest))
        return None

    def rewind(self) -> None:
        """Put everything back as it was before the call."""
        with _unwatched():
            for c in self.copies.values():
                c.storage.copy_(c.saved)
            for leaf, grad in self.grads.values():
                leaf.grad = grad
            for optimizer, state in self.optimizers.values():
                optimizer.state.clear()
                optimizer.state.update({p: dict(s) for p, s in state.items()})
            self.rng.restore()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """One execution, watched (copies made before its writes)."""
        self.executions += 1
        undo = _backward.install()
        try:
            with _Watch(self):
                yield
        finally:
            undo()

    def release(self) -> None:
        """Drop the copies (the call is over)."""
        self.declared.clear()
        self.copies.clear()
        self.grads.clear()
        self.optimizers.clear()


def stop_unless_restorable(guard: StateGuard, share: Callable[[dict[int, str]], dict[int, str]],
                           function: str, late: bool = False) -> None:
    """Before the second watched execution: every rank learns whether any rank cannot undo its first.

    If one cannot, every rank puts its state back and raises the same error. `share` is
    Collectives.share_failures over one slot (a no-op without a process group). `late`: the call was
    not watched from its start (it became a tuning call midway, in a function seen not to change
    older state), so any write into older state means its first, unwatched execution made it too."""
    mine = guard.problem()
    if mine is None and late and guard.changed_state:
        mine = ("it became a tuning call midway through an unwatched execution, and its next execution "
                "changed state older than the call (" + guard.summary() + "), which the unwatched one did too: "
                "that execution's effects stay, once; call it again to tune")
    shared = share({0: mine} if mine is not None else {})
    if shared:
        guard.rewind()
        guard.release()
        raise StateNotRestorableError(function, shared[0])


def _graph_leaves(roots: list[torch.Tensor]) -> list[torch.Tensor]:
    leaves = [t for t in roots if t.grad_fn is None and t.requires_grad]
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    # The visited nodes stay referenced: next_functions hands out new wrappers, and a freed one's id
    # would be reused by the next (seen on CUDA with torch 2.11: the walk then found no leaf).
    seen = {id(fn): fn for fn in stack}
    while stack:
        for nxt, _ in stack.pop().next_functions:
            if nxt is None or id(nxt) in seen:
                continue
            seen[id(nxt)] = nxt
            variable = getattr(nxt, "variable", None)  # an AccumulateGrad node
            if variable is not None:
                leaves.append(variable)
            else:
                stack.append(nxt)
    return leaves


class _Watch(TorchDispatchMode):
    """The dispatch mode of a watched execution: copies before writes, notes new storages."""

    def __init__(self, guard: StateGuard) -> None:
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(_paused, "depth", 0):
            return func(*args, **kwargs)
        info = _info(func)
        if info.writes:
            self.guard.before_write(info, args, kwargs)
        out = func(*args, **kwargs)
        if info.fresh:
            self.guard.made(out, info)
        return out


_paused = threading.local()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The tuner's own work inside an execution (routing a launch, timing it) is not the function's."""
    _paused.depth = getattr(_paused, "depth", 0) + 1
    try:
        yield
    finally:
        _paused.depth -= 1


@contextlib.contextmanager
def _unwatched() -> Iterator[None]:
    with paused():
        yield


def _watching_guard() -> StateGuard | None:
    """The guard watching this thread (autograd's threads inherit the caller's dispatch modes)."""
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, _Watch):
            return mode.guard
    return None


def _watched_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
    """torch.autograd.backward while any execution is watched: a watched thread's backward first lets its
    guard find the leaves whose .grad it will write; any other thread's passes straight through."""
    guard = _watching_guard()
    if guard is not None:
        inputs = kwargs.get("inputs", args[4] if len(args) > 4 else None)
        guard.before_backward(tensors, inputs)
    return _backward.original(tensors, *args, **kwargs)


_step_hook: list[Any] = []  # the optimizer step pre-hook's handle, while the backward patch is held


def _add_step_hook() -> None:
    _step_hook.append(register_optimizer_step_pre_hook(_before_step))


def _remove_step_hook() -> None:
    while _step_hook:
        _step_hook.pop().remove()


def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    guard = _watching_guard()
    if guard is not None:
        guard.before_step(optimizer)
    return None


# torch.autograd.backward and an optimizer step pre-hook, installed while any execution is watched; concurrent
# and nested watches share one install, the last undo removes both.
_backward = SharedPatch(torch.autograd, "backward", _watched_backward, on_install=_add_step_hook,
                        on_release=_remove_step_hook)
