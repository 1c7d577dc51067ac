"""Checks on the source itself, for code that CI reads but cannot run (the GPU-marked tests, the benchmarks)."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("triton_ctx_tune", "tests", "benchmarks", "examples")


def _is_overload(node: ast.AST) -> bool:
    return any(getattr(d, "id", getattr(d, "attr", None)) == "overload" for d in getattr(node, "decorator_list", []))


def top_level_redefinitions(source: str) -> list[str]:
    """Names that a module's top level defines more than once with `def` or `class` (typing overloads aside)."""
    defined = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    names = Counter(node.name for node in ast.parse(source).body
                    if isinstance(node, defined) and not _is_overload(node))
    return sorted(name for name, count in names.items() if count > 1)


def test_the_check_finds_a_kernel_defined_twice():
    source = ("import triton\n\n@triton.jit\ndef _scale(x):\n    pass\n\ndef test_a():\n    triton.jit(_scale)\n\n"
              "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef _scale(x, y):\n    pass\n")
    assert top_level_redefinitions(source) == ["_scale"]
    assert top_level_redefinitions("from typing import overload\n@overload\ndef f(x: int) -> int: ...\n"
                                   "@overload\ndef f(x: str) -> str: ...\ndef f(x): return x\n") == []


def test_no_module_defines_a_top_level_name_twice():
    """The later definition silently replaces the earlier one for every use in the module, including uses above it
    (tests/test_gpu.py once had two kernels named _scale: four GPU tests decorated the wrong one, and CI, which
    skips them, could not tell)."""
    found = {str(path.relative_to(ROOT)): names for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             if (names := top_level_redefinitions(path.read_text()))}
    assert found == {}
