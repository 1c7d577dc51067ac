"""Triton kernels of an MLP block (a tiled GEMM and an in-place GELU), shared by the examples and benchmarks.

Both kernels carry a plain @triton.autotune. The in-place GELU is the kind of kernel Triton's own
autotuner cannot time safely (each benchmark run would apply GELU again to the same buffer);
under contextual_autotune every timed launch sees the function's real inputs instead.

The config spaces are picked at import time, because the decorators need them then:
TRITON_CTX_TUNE_EXAMPLE_SIZE=small|large, else "small" under TRITON_INTERPRET=1 and "large" otherwise.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off", "no")


EXAMPLE_SIZE = os.environ.get("TRITON_CTX_TUNE_EXAMPLE_SIZE") or ("small" if _interpreting() else "large")
if EXAMPLE_SIZE not in ("small", "large"):
    raise ValueError(f"TRITON_CTX_TUNE_EXAMPLE_SIZE={EXAMPLE_SIZE!r}: expected 'small' or 'large'")

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): Hopper-sized bf16 tiles, three per tile shape.
_LARGE_MATMUL = [
    (64, 64, 32, 4, 4), (64, 64, 64, 4, 4), (64, 64, 64, 3, 8),
    (64, 128, 32, 4, 4), (64, 128, 64, 4, 4), (64, 128, 64, 3, 8),
    (128, 64, 32, 4, 4), (128, 64, 64, 4, 4), (128, 64, 64, 3, 8),
    (128, 128, 32, 4, 4), (128, 128, 64, 3, 4), (128, 128, 64, 4, 8),
    (128, 256, 32, 3, 8), (128, 256, 64, 3, 8), (128, 256, 64, 4, 8),
    (256, 128, 32, 3, 8), (256, 128, 64, 3, 8), (256, 128, 64, 4, 8),
]
# The interpreter runs one program at a time on the host: few, small tiles keep tuning quick.
_SMALL_MATMUL = [(16, 16, 16, 1, 4), (16, 32, 32, 1, 4), (32, 16, 32, 1, 4), (32, 32, 16, 1, 4)]


def matmul_configs(size: str = EXAMPLE_SIZE) -> list[triton.Config]:
    table = {"small": _SMALL_MATMUL, "large": _LARGE_MATMUL}[size]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=s, num_warps=w)
            for bm, bn, bk, s, w in table]


def gelu_configs(size: str = EXAMPLE_SIZE) -> list[triton.Config]:
    table = {"small": [(256, 4), (512, 4), (1024, 4)],
             "large": [(256, 4), (512, 4), (1024, 4), (1024, 8), (2048, 4), (2048, 8), (4096, 4), (4096, 8)]}[size]
    return [triton.Config({"BLOCK": block}, num_warps=w) for block, w in table]


@triton.jit
def matmul_tile(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's BLOCK_M x BLOCK_N tile of a @ b in fp32, with the tile's row and column offsets."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped ordering: GROUP_M row-blocks share the same columns of b while they are in L2.
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Wrapping rows and columns keeps the loads in bounds without masks; the caller masks its store.
    rows = offs_m % M
    cols = offs_n % N
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc, offs_m, offs_n


@triton.autotune(configs=matmul_configs(), key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """c = a @ b with fp32 accumulation; c's dtype is the output dtype."""
    acc, offs_m, offs_n = matmul_tile(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.autotune(configs=gelu_configs(), key=["n_elements"])
@triton.jit
def gelu_inplace_kernel(x_ptr, n_elements, BLOCK: tl.constexpr):
    """x = gelu_tanh(x), in place, computed in fp32."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # 0.5 * (1 + tanh(u)) == sigmoid(2u), and tl has sigmoid on every backend (tanh it lacks).
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # sqrt(2/pi) * (x + 0.044715 x^3)
    # Clamped so exp stays finite (the interpreter warns on overflow); in fp32 sigmoid(+-40) is already 1 or 0.
    y = x * tl.sigmoid(tl.clamp(2.0 * u, -40.0, 40.0))
    tl.store(x_ptr + offs, y.to(x_ptr.dtype.element_ty), mask=mask)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = a @ b (2-D, any strides); returns out."""
    M, K = a.shape
    K2, N = b.shape
    if K != K2 or tuple(out.shape) != (M, N):
        raise ValueError(f"matmul shapes do not fit: a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}")

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    matmul_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        out.stride(0), out.stride(1))
    return out


def gelu_(x: torch.Tensor) -> torch.Tensor:
    """Tanh-approximated GELU of x, in place (x must be contiguous); returns x."""
    if not x.is_contiguous():
        raise ValueError("gelu_ works on the flat storage of x, so x must be contiguous")
    n = x.numel()

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(n, meta["BLOCK"]),)

    gelu_inplace_kernel[grid](x, n)
    return x


def torch_reference(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(x @ w1) @ w2 in float32, the full (unsharded) MLP."""
    h = torch.nn.functional.gelu(x.float() @ w1.float(), approximate="tanh")
    return h @ w2.float()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative norm error ||got - want|| / ||want||, in float32."""
    want = want.float()
    return float((got.float() - want).norm()) / max(float(want.norm()), 1e-30)
