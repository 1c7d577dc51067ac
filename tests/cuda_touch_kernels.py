"""A kernel module that touches CUDA when imported, as flash-linear-attention's fla/utils/hardware.py does
(torch.cuda.get_device_name(0) at import). Imported anywhere but the process that CUDA_TOUCH_PARENT names,
it raises, as such a module does in a process that cannot (or must not) initialise the GPU: a compile worker
that imported it could compile nothing. tests/workers_parent.py's cuda_import scenario."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tests.kernels import block_configs

if os.environ.get("CUDA_TOUCH_PARENT") != str(os.getpid()):
    raise RuntimeError("cuda_touch_kernels: initialised CUDA at import in a process that must not")
try:
    GPU_NAME = torch.cuda.get_device_name(0)
except (RuntimeError, AssertionError):  # a CPU build of torch
    GPU_NAME = "none"


@triton.autotune(configs=block_configs([16, 32, 64]), key=["n"])
@triton.jit
def touchy_add_one_(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)
