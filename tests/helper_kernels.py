"""Helpers laid out as flash-linear-attention's fla/ops/utils/op.py lays them out: one-line @triton.jit defs
inside an if/else, after a helper with a default constexpr argument. A compile worker rebuilds each helper from
its source at its own lines (tests/workers_parent.py's helpers scenario)."""
from __future__ import annotations

import os

import triton
import triton.language as tl

from tests.kernels import block_configs


@triton.jit
def unflatten(X: tl.constexpr, Y: tl.constexpr = None):
    pid = tl.program_id(0)
    if Y is None:
        return pid % X, pid // X
    else:
        return pid % X, (pid // X) % Y, pid // (X * Y)


if os.environ.get("HELPER_KERNELS_FAST", "0") == "1":
    @triton.jit
    def twice(x): return x * 2  # noqa: E704 (FLA's layout, on purpose)
else:
    @triton.jit
    def twice(x): return x + x  # noqa: E704


@triton.autotune(configs=block_configs([16, 32]), key=["n"])
@triton.jit
def helpers_double_(x_ptr, n, BLOCK: tl.constexpr):
    i, _ = unflatten(1)
    offs = i * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, twice(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)
