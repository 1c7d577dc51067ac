"""Kernels whose compilation misbehaves for one config (BLOCK 64), for the compile-worker tests.

A tl.constexpr_function (Triton 3.5+) runs in Python while the kernel compiles: here it sleeps
or crashes the compiling process, as a compiler that hangs or segfaults on that config would.
These kernels are compiled only in worker processes (tests/workers_parent.py), never in pytest.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tests.kernels import block_configs

HAS_CONSTEXPR_FUNCTION = hasattr(triton, "constexpr_function")

if HAS_CONSTEXPR_FUNCTION:
    @triton.constexpr_function
    def _hang_at_64(block):
        if block == 64:
            # Triton hashes what a constexpr_function references; a call through builtins is not followed.
            getattr(__import__("time"), "sleep")(3600)  # noqa: B009 (through builtins); only the worker's kill ends it
        return block

    @triton.constexpr_function
    def _crash_at_64(block):
        if block == 64:
            os_ = __import__("os")
            os_.kill(os_.getpid(), 11)  # SIGSEGV
        return block

    @triton.autotune(configs=block_configs([16, 32, 64]), key=["n"])
    @triton.jit
    def hanging_add_one_(x_ptr, n, BLOCK: tl.constexpr):
        B: tl.constexpr = _hang_at_64(BLOCK)
        offs = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    # Two of its six configs hang (BLOCK 64, on 1 and on 2 warps): as many stragglers as two workers.
    @triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)],
                     key=["n"])
    @triton.jit
    def hanging_twice_add_one_(x_ptr, n, BLOCK: tl.constexpr):
        B: tl.constexpr = _hang_at_64(BLOCK)
        offs = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    @triton.autotune(configs=block_configs([16, 32, 64]), key=["n"])
    @triton.jit
    def crashing_add_one_(x_ptr, n, BLOCK: tl.constexpr):
        B: tl.constexpr = _crash_at_64(BLOCK)
        offs = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)
