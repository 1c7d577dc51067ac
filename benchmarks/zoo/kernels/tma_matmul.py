"""A persistent matmul on host-side TensorDescriptors, in the style of Triton's persistent-matmul tutorial.

Two @triton.autotune kernels over one tile loop: `tma_matmul_kernel` writes C = A @ B^T, and
`tma_matmul_acc_kernel` works in place, C += A @ B^T, so every timed run of a config would add A @ B^T once
more: it declares C with `restore_value=["C"]` (the descriptor itself cannot be cloned, so the tensor under
it is an argument too; the epilogue reads the old C through it). Host descriptors are made once per call with
a placeholder block shape; each config's `pre_hook` sets the descriptors' `block_shape` from its BLOCK_*
values, since the kernel's loads must use the tile the descriptor was encoded with. That is the pattern the
zoo checks: a config pre_hook that must run before the config is compiled and launched.

The config space is picked at import time (the decorators need it then): a few small tiles under
TRITON_INTERPRET=1, Hopper-sized tiles otherwise. Import it with benchmarks/ on sys.path (benchlib).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from benchlib import host_do_bench, interpreting

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
_GPU_TILES = [(128, 128, 64, 3, 8), (128, 128, 64, 4, 4), (128, 256, 64, 3, 8), (128, 64, 64, 4, 4),
              (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)]
# The interpreter runs one program at a time on the host: few, small tiles keep tuning quick.
_INTERPRETER_TILES = [(16, 16, 16, 1, 4), (32, 32, 16, 1, 4), (16, 32, 32, 1, 4)]
INTERPRETER_SMS = 4  # persistent programs under the interpreter (there are no SMs to count)


def set_block_shapes(nargs: dict) -> None:
    """Config pre_hook: the descriptors' tiles are the config's (B is N x K, read as B^T like the tutorial)."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk]
    nargs["c_desc"].block_shape = [bm, bn]


def matmul_configs() -> list[triton.Config]:
    tiles = _INTERPRETER_TILES if interpreting() else _GPU_TILES
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=s, num_warps=w,
                          pre_hook=set_block_shapes)
            for bm, bn, bk, s, w in tiles]


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # Grouped ordering: GROUP_M row-blocks share the same columns of B while they are in L2.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _persistent_tiles(a_desc, b_desc, c_desc, C, M, N, K, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                      ACCUMULATE: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M
        offs_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([offs_m, ki * BLOCK_K])
            b = b_desc.load([offs_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if ACCUMULATE:
            rows = offs_m + tl.arange(0, BLOCK_M)
            cols = offs_n + tl.arange(0, BLOCK_N)
            mask = (rows[:, None] < M) & (cols[None, :] < N)
            acc += tl.load(C + rows[:, None] * stride_cm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        c_desc.store([offs_m, offs_n], acc.to(c_desc.dtype))


# Triton's do_bench needs a GPU: under the interpreter a host-clock stand-in times plain Autotuner.run's configs.
_DO_BENCH = host_do_bench if interpreting() else None


@triton.autotune(configs=matmul_configs(), key=["M", "N", "K"], do_bench=_DO_BENCH)
@triton.jit
def tma_matmul_kernel(a_desc, b_desc, c_desc, C, M, N, K, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    _persistent_tiles(a_desc, b_desc, c_desc, C, M, N, K, stride_cm, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_SMS,
                      ACCUMULATE=False)


@triton.autotune(configs=matmul_configs(), key=["M", "N", "K"], restore_value=["C"], do_bench=_DO_BENCH)
@triton.jit
def tma_matmul_acc_kernel(a_desc, b_desc, c_desc, C, M, N, K, stride_cm, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    _persistent_tiles(a_desc, b_desc, c_desc, C, M, N, K, stride_cm, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_SMS,
                      ACCUMULATE=True)


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _launch(kernel: triton.runtime.Autotuner, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    M, K = a.shape
    N = b.shape[0]
    # Placeholder tiles: every config's pre_hook replaces them before its compile and launch.
    placeholder = [8, 8]
    a_desc = TensorDescriptor.from_tensor(a, placeholder)
    b_desc = TensorDescriptor.from_tensor(b, placeholder)
    c_desc = TensorDescriptor.from_tensor(c, placeholder)
    sms = _num_sms(a.device)

    def grid(meta: dict) -> tuple[int]:
        return (min(sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)

    kernel[grid](a_desc, b_desc, c_desc, c, M, N, K, c.stride(0), NUM_SMS=sms)


def tma_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A @ B^T for row-major A (M x K) and B (N x K)."""
    c = torch.empty(a.shape[0], b.shape[0], dtype=a.dtype, device=a.device)
    _launch(tma_matmul_kernel, a, b, c)
    return c


def tma_matmul_acc_(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C += A @ B^T in place; returns C."""
    _launch(tma_matmul_acc_kernel, a, b, c)
    return c
