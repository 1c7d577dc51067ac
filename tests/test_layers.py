"""The package's folders are its layers: imports between them run the one way each folder's __init__.py says,
and no modules import each other in a circle (TYPE_CHECKING and function-local imports included)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "triton_ctx_tune"
ROOT = PACKAGE.name

# Which group a module belongs to, and which groups each group may import (its own included where listed).
GROUPS = {"runtime": "runtime", "store": "store", "compile": "compile", "engine": "engine",
          "tools.logs": "logs", "tools.report": "readers", "tools.cli": "readers", "tools": "readers",
          "errors": "errors", "options": "options", "tuner": "public", "function_tuner": "public", "serving": "public",
          "": "top", "__main__": "top"}
BELOW_OPTIONS = {"compile", "store", "logs", "runtime", "errors"}
ALLOWED = {
    "errors": set(),
    "runtime": {"runtime", "errors"},
    "store": {"store", "runtime", "errors"},
    "compile": {"compile", "runtime", "errors"},
    "logs": {"runtime"},
    "readers": {"readers", "logs", "store", "errors"},  # report and cli read the stores and logs
    "options": BELOW_OPTIONS,
    "engine": {"engine", "options"} | BELOW_OPTIONS,
    "public": {"public", "engine", "options"} | BELOW_OPTIONS,
    "top": {"top", "public", "engine", "options", "readers"} | BELOW_OPTIONS,
}
# The one edge that runs upward: precompile's signatures name the engine's KeyState.
EXCEPTIONS = {("triton_ctx_tune.compile.precompile", "triton_ctx_tune.engine.state")}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Every import of one of the package's modules, by module; imports of the root package (__version__) left out."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in mods and t not in (name, ROOT)}
    return edges


def _group(module: str) -> str:
    inner = module[len(ROOT) + 1:] if module != ROOT else ""
    for prefix in (inner, inner.rsplit(".", 1)[0], inner.split(".")[0]):
        if prefix in GROUPS:
            return GROUPS[prefix]
    raise AssertionError(f"{module} is in no layer: add its folder or module to GROUPS")


def test_the_tree_is_the_layers():
    assert {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")} >= {
        "engine/call.py", "engine/session.py", "engine/executor.py", "engine/decisions.py", "store/cache.py",
                                                                                  "runtime/compat.py",
        "compile/compile_workers.py", "tools/logs.py"}
    for folder in ("engine", "runtime", "compile", "store", "tools"):
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
        assert doc and "import" in doc, f"{folder}/__init__.py must say what the layer holds and may import"


def test_imports_run_one_way_between_layers():
    edges = _edges(_modules())
    wrong = sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets
                   if _group(b) not in ALLOWED[_group(a)] and (a, b) not in EXCEPTIONS)
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)
    stale = sorted(f"{a} -> {b}" for a, b in EXCEPTIONS if b not in edges.get(a, ()))
    assert not stale, f"exceptions that no longer happen (remove them): {stale}"


def test_no_import_circles():
    edges = _edges(_modules())

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()]:
                if not start.startswith(nxt + ".") and nxt not in seen:  # a module's own package runs first anyway
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circled = sorted(m for m in edges if m in reach(m))
    assert not circled, f"modules in an import circle: {circled}"


def test_no_module_imports_more_than_a_third_of_the_package():
    """Of the package's files (folders' __init__.py included), each imports at most a third. A folder's
    __init__.py holds only its docstring, so `from ..compile import precompile` counts precompile alone."""
    mods = _modules()
    folders = {m for m, path in mods.items() if path.name == "__init__.py"}
    edges = {m: t - folders for m, t in _edges(mods).items()}
    assert all(not ast.parse(mods[f].read_text()).body[1:] for f in folders - {ROOT}), "a folder's __init__ grew code"
    limit = len(mods) // 3
    heavy = {m: len(t) for m, t in edges.items() if len(t) > limit}
    assert not heavy, f"modules importing more than {limit} of the package's {len(mods)}: {heavy}"
    # The hub this replaced: session.py imported 17 of 29 before the executor/driver split.
    assert len(edges["triton_ctx_tune.engine.session"]) <= limit
