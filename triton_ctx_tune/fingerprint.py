"""A digest of a Python callable that is the same in every process running the same code.

A config's pre_hook runs inside the timed span (as in Triton's own _bench), so two autotuners
of one kernel with equal config parameters but different hooks measure different things and
must not share a cache entry. Python objects have no stable identity across processes, so the
digest is built from what defines the behaviour: bytecode, constants, names, defaults, and the
values captured in closures. Captured numbers and strings count by value; other captured
objects (tensors, modules, buffers) count by type only, since their repr can hold addresses
or whole contents.
"""
from __future__ import annotations

import functools
import hashlib
import types
from typing import Any

_PRIMITIVES = (type(None), bool, int, float, complex, str, bytes)
_MAX_DEPTH = 4
_MAX_ITEMS = 64


def callable_digest(fn: Any) -> str | None:
    """Hex SHA-256 of what `fn` does, or None for no callable."""
    if fn is None:
        return None
    return hashlib.sha256(repr(_describe(fn, 0)).encode()).hexdigest()


def _describe(obj: Any, depth: int) -> Any:
    if isinstance(obj, _PRIMITIVES):
        return obj
    if depth >= _MAX_DEPTH:
        return ("type", _qualname(type(obj)))
    if isinstance(obj, (list, tuple, set, frozenset, dict)) and len(obj) > _MAX_ITEMS:
        return ("type", _qualname(type(obj)), len(obj))  # a captured table: its size, not its contents
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(_describe(x, depth + 1) for x in obj))
    if isinstance(obj, (set, frozenset)):
        # Set order follows string hashing, which is randomized per process.
        return ("set", tuple(sorted(repr(_describe(x, depth + 1)) for x in obj)))
    if isinstance(obj, dict):
        return ("dict", tuple(sorted((repr(_describe(k, depth + 1)), repr(_describe(v, depth + 1)))
                                     for k, v in obj.items())))
    if isinstance(obj, types.CodeType):
        return ("code", obj.co_code, tuple(_describe(c, depth + 1) for c in obj.co_consts), obj.co_names)
    if isinstance(obj, types.MethodType):
        return ("method", _describe(obj.__func__, depth + 1), ("type", _qualname(type(obj.__self__))))
    if isinstance(obj, functools.partial):
        return ("partial", _describe(obj.func, depth + 1), _describe(obj.args, depth + 1),
                _describe(obj.keywords, depth + 1))
    if isinstance(obj, types.FunctionType):
        cells = tuple(_describe(_cell(c), depth + 1) for c in (obj.__closure__ or ()))
        return ("function", obj.__module__, obj.__qualname__, _describe(obj.__code__, depth + 1),
                _describe(obj.__defaults__, depth + 1), _describe(obj.__kwdefaults__, depth + 1), cells)
    if isinstance(obj, (types.BuiltinFunctionType, type)):
        return ("named", _qualname(obj))
    call = getattr(type(obj), "__call__", None)
    if isinstance(call, types.FunctionType):  # an instance of a class with __call__
        return ("instance", _qualname(type(obj)), _describe(call, depth + 1))
    return ("type", _qualname(type(obj)))


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return None


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"
