"""Digests of code that are the same in every process running the same code.

kernel_code describes a @triton.jit kernel as the cache keys it: see its docstring.

callable_digest is for plain Python callables.

A config's pre_hook runs inside the timed span (as in Triton's own _bench), so two autotuners
of one kernel with equal config parameters but different hooks measure different things and
must not share a cache entry. Python objects have no stable identity across processes, so the
digest is built from what defines the behaviour: bytecode, constants, names, defaults, and the
values captured in closures. Captured numbers and strings count by value; other captured
objects (tensors, modules, buffers) count by type only, since their repr can hold addresses
or whole contents.
"""
from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..runtime.compat import aggregate_members, constexpr_value, is_triton_builtin, jit_info

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
    call = getattr(type(obj), "__call__", None)  # noqa: B004 (not a callable() test: the class's __call__, described)
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


# ---- kernel code ------------------------------------------------------------------------------

_MAX_FUNCTIONS = 256  # a kernel calling more JIT functions than this is hashed by the first ones


def kernel_code(root: Any, heuristics: Mapping[str, Callable[..., Any]] | None = None) -> dict[str, Any]:
    """What a @triton.jit kernel compiles, as text that is the same in every process.

    "functions": the kernel, then every @triton.jit function it calls, transitively, in the order
    they are met: name, SHA-256 of the source (from `def`, as Triton compiles it) and the jit()
    options that change the code. "globals": the values of the other globals they read (a
    tl.constexpr, a number, a plain helper's digest), keyed "function:name". "heuristics":
    digests of heuristics() between the autotuner and the kernel, which choose constexprs.

    The references are found the way Triton's DependenciesFinder finds them for
    JITFunction.cache_key (names and attribute chains through modules, closures before
    globals), so a change that makes Triton compile new code changes this too; unlike
    cache_key, moving a function to another line does not.
    """
    walker = _CodeWalker()
    walker.function(root)
    return {"functions": walker.functions, "globals": walker.globals,
            "heuristics": {k: callable_digest(v) for k, v in sorted((heuristics or {}).items())}}


class _CodeWalker:
    def __init__(self) -> None:
        self.functions: list[dict[str, Any]] = []
        self.globals: dict[str, str] = {}
        self._seen: dict[int, str] = {}

    def function(self, obj: Any) -> None:
        info = jit_info(obj)
        if info is None or id(info.fn) in self._seen or len(self.functions) >= _MAX_FUNCTIONS:
            return
        name = info.fn.__qualname__
        taken = {f["name"] for f in self.functions}
        if name in taken:  # two helpers of one name in different modules
            name = next(f"{name}#{i}" for i in range(2, len(taken) + 3) if f"{name}#{i}" not in taken)
        self._seen[id(info.fn)] = name
        self.functions.append({"name": name, "sha256": hashlib.sha256(info.source.encode()).hexdigest(),
                               "options": info.options})
        for label, value in _references(info.fn, info.source):
            self.value(f"{name}:{label}", value)

    def value(self, label: str, value: Any) -> None:
        if jit_info(value) is not None:
            self.function(value)
            return
        is_constexpr, inner = constexpr_value(value)
        if is_constexpr:
            self.globals[label] = f"constexpr {_stable_repr(inner)}"
            return
        aggregate = aggregate_members(value)
        if aggregate is not None:
            annotations, members = aggregate
            self.globals[label] = f"aggregate {annotations}"
            for name, member in members:
                self.value(f"{label}.{name}", member)
            return
        if isinstance(value, types.ModuleType) or is_triton_builtin(value):
            return
        self.globals[label] = _stable_repr(value)


def _stable_repr(value: Any) -> str:
    """A repr that holds no address: by value for plain data, by digest for code, else by type."""
    if isinstance(value, (type(None), bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list)) and len(value) <= _MAX_ITEMS:
        return f"{type(value).__name__}({', '.join(_stable_repr(v) for v in value)})"
    if callable(value) and not isinstance(value, type):
        return f"callable {callable_digest(value)}"
    if type(value).__module__.startswith("triton."):  # tl.float16 and other language values print by name
        return f"{_qualname(type(value))} {value}"
    return f"type {_qualname(value if isinstance(value, type) else type(value))}"


def _references(fn: Callable[..., Any], source: str) -> Iterator[tuple[str, Any]]:
    """(dotted name, value) for each global or closure name the function body reads; modules are
    looked through (helpers.add is the value of add in module helpers), locals are skipped."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return
    node = tree.body[0]
    args = node.args
    local = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
    # Defaults and annotations are evaluated once, at definition time (Triton skips them too).
    body = [n for stmt in node.body for n in ast.walk(stmt)]
    local |= {n.id for n in body if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    closure = dict(zip(fn.__code__.co_freevars, (_cell(c) for c in fn.__closure__ or ())))
    scope = getattr(fn, "__globals__", {})

    def lookup(name: str) -> tuple[bool, Any]:
        if name in local:
            return False, None
        if name in closure:
            return True, closure[name]
        if name in scope:
            return True, scope[name]
        return False, None  # a builtin, or a name that does not exist (Triton reports that)

    seen: set[str] = set()
    for n in body:
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            found, value = lookup(n.id)
            if found and not isinstance(value, types.ModuleType) and n.id not in seen and \
                    not (n.id in vars(builtins) and value is vars(builtins)[n.id]):
                seen.add(n.id)
                yield n.id, value
        elif isinstance(n, ast.Attribute):
            chain: list[str] = []
            base: ast.expr = n
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if not isinstance(base, ast.Name):
                continue
            found, value = lookup(base.id)
            dotted = base.id
            for attr in chain:
                if not isinstance(value, types.ModuleType) or is_triton_builtin(value):
                    break
                value = getattr(value, attr, None)
                dotted += f".{attr}"
                if not isinstance(value, types.ModuleType) and found and dotted not in seen:
                    seen.add(dotted)
                    yield dotted, value
