"""Keep the package from holding the user's process group past destroy_process_group().

torch.distributed.nn.functional binds `group=group.WORLD` as a default argument of ten functions
when it is first imported: None before init_process_group, the live default group after it.
torch._dynamo imports it (through FSDP), and the tuner imports torch._dynamo when it decorates a
function (torch.compiler.disable, for the graph break). A function decorated after
init_process_group therefore left ten references to the default group that destroy_process_group
does not drop, so a gloo group was never destroyed: its worker threads ran on into interpreter
finalization. A worker that releases a finished collective's tensors then needs the GIL;
Python 3.11 ends a thread that asks for it during finalization with pthread_exit, whose unwinding
through the work's C++ destructor (noexcept) calls std::terminate: "terminate called without an
active exception", exit -6 (9 of 60 runs of tests/exit_worker.py on two gloo ranks; a core showed
the abort in c10d::ProcessGroupGloo::runLoop -> ~AsyncAllreduceWork -> TensorImpl::decref_pyobject
-> gil_scoped_acquire -> take_gil -> pthread_exit).

So the package imports torch.distributed.nn itself, at its own import, which a program normally
does before init_process_group: the defaults are None then, and torch._dynamo's later import finds
the module loaded. Imported after init_process_group, the defaults this import bound to the live
group are set back to None, which these functions read as the default group at each call: the same
behaviour, with no reference held.
"""
from __future__ import annotations

import importlib
import sys
import types

_MODULE = "torch.distributed.nn.functional"


def import_distributed_nn() -> None:
    """Import torch.distributed.nn now, leaving no live process group in its functions' defaults."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not dist.is_available() or _MODULE in sys.modules:
        return  # loaded already: whoever loaded it owns what it bound
    world = dist.group.WORLD if dist.is_initialized() else None
    try:
        importlib.import_module("torch.distributed.nn")
        module = sys.modules[_MODULE]
    except (ImportError, KeyError):
        return
    if world is not None:
        unbind_group(module, world)


def unbind_group(module: types.ModuleType, pg: object) -> int:
    """Set `module`'s function defaults that are `pg` to None; returns how many were."""
    count = 0
    for fn in vars(module).values():
        if not isinstance(fn, types.FunctionType) or fn.__module__ != module.__name__:
            continue
        if fn.__defaults__ and any(d is pg for d in fn.__defaults__):
            count += sum(d is pg for d in fn.__defaults__)
            fn.__defaults__ = tuple(None if d is pg else d for d in fn.__defaults__)
        if fn.__kwdefaults__ and any(d is pg for d in fn.__kwdefaults__.values()):
            count += sum(d is pg for d in fn.__kwdefaults__.values())
            fn.__kwdefaults__ = {k: None if d is pg else d for k, d in fn.__kwdefaults__.items()}
    return count
