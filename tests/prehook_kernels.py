"""Kernels whose configs set a host TensorDescriptor's block_shape in their pre_hook, as Triton's
persistent-matmul tutorial does, for test_prehook.py and its multi-rank worker.

On a GPU the block shape is part of the kernel's signature: compiled without the hook, a config is
built for another descriptor type, or not at all. The interpreter compiles nothing, so a heuristic
stands in for that specialization: heuristics run at every compile-only launch (precompile) and at
every launch, after the config's pre_hook, and this one fails as the compile would when the
descriptor was built for another block.
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompileTimeAssertionFailure

from tests.kernels import SLOW_MS, spend
from triton_ctx_tune import contextual_autotune

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older than any supported Triton; test_prehook.py skips by name
    TensorDescriptor = None  # type: ignore[assignment,misc]

BLOCKS = (16, 32, 64)
COST_MS = {16: SLOW_MS, 32: 0.0, 64: 2 * SLOW_MS}  # BLOCK 32 wins


def descriptor(x: Any, block: int = 8) -> Any:
    """A 1-D host descriptor of x, built for a block no config uses (the hook sets the config's)."""
    return TensorDescriptor.from_tensor(x, [block])


def _set_block(nargs: dict[str, Any]) -> None:
    nargs["x_desc"].block_shape = [nargs["BLOCK"]]
    spend(COST_MS[nargs["BLOCK"]])


def _signature(nargs: dict[str, Any]) -> int:
    shape = list(nargs["x_desc"].block_shape)
    if shape != [nargs["BLOCK"]]:
        raise CompileTimeAssertionFailure(None, None, f"descriptor block_shape {shape} is not [BLOCK] = "
                                                      f"[{nargs['BLOCK']}]")
    return 0


def _precompile_only_rejects_32(nargs: dict[str, Any]) -> int:
    """Fails BLOCK 32's compile-only launches alone: a config that only precompile rejects."""
    _signature(nargs)
    if nargs.get("warmup") and nargs["BLOCK"] == 32:
        raise CompileTimeAssertionFailure(None, None, "rejected by precompile alone (a stand-in mismatch)")
    return 0


def _always_fails(nargs: dict[str, Any]) -> int:
    raise CompileTimeAssertionFailure(None, None, "needs more shared memory than this GPU has")


def _doubled(x_desc, y_ptr, n, BLOCK: tl.constexpr, CHECKED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = x_desc.load([tl.program_id(0) * BLOCK])
    tl.store(y_ptr + offs, x * 2, mask=offs < n)


def _kernel(check: Any) -> Any:
    configs = [triton.Config({"BLOCK": b}, num_warps=4, pre_hook=_set_block) for b in BLOCKS]
    return triton.autotune(configs=configs, key=["n"])(triton.heuristics({"CHECKED": check})(triton.jit(_doubled)))


desc_double = _kernel(_signature)
desc_double_rejected = _kernel(_precompile_only_rejects_32)
desc_double_failing = _kernel(_always_fails)


def launch(kernel: Any, x: Any, y: Any) -> None:
    n = x.numel()
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](descriptor(x), y, n)


def doubling_op(kernel: Any, **opts: Any) -> tuple[Any, list[int]]:
    """y = 2 * x by one launch of `kernel`, under contextual_autotune(**opts) with short steps; the list counts
    the function's executions."""
    executions = [0]

    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, cache=False, **opts)
    def op(x: torch.Tensor) -> torch.Tensor:
        executions[0] += 1
        y = torch.empty_like(x)
        launch(kernel, x, y)
        return y
    return op, executions
