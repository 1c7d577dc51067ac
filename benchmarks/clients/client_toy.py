"""Client `toy`: an elementwise product with autotuned forward and backward kernels, to smoke-test the harness.

Not a real client and not part of the results: it runs anywhere, including 2 CPU ranks through the Triton
interpreter (./launch on a machine without GPUs), so the arms, the key bookkeeping and the reports can be
checked without FLA or CUDA. Step: y = all_reduce(x * s) (differentiable), loss = sum(y * probe) / world,
backward, then the replicated s's gradient summed over ranks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import triton
import triton.language as tl

from benchlib import host_do_bench, interpreting
from common import ClientSpec, Context, Workload, zero_grads

SHAPES = {False: {"n": 1 << 20}, True: {"n": 1000}}
_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024) for w in (2, 4)]


def _autotune():  # Triton's do_bench needs a GPU: under the interpreter a host-clock stand-in times the configs
    return triton.autotune(configs=_CONFIGS, key=["n"], do_bench=host_do_bench if interpreting() else None)


@_autotune()
@triton.jit
def toy_mul_fwd_kernel(x_ptr, s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * tl.load(s_ptr + offs, mask=mask), mask=mask)


@_autotune()
@triton.jit
def toy_mul_bwd_kernel(dy_ptr, x_ptr, s_ptr, dx_ptr, ds_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask)
    tl.store(dx_ptr + offs, dy * tl.load(s_ptr + offs, mask=mask), mask=mask)
    tl.store(ds_ptr + offs, dy * tl.load(x_ptr + offs, mask=mask), mask=mask)


def _grid(n: int):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


class ToyMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        y = torch.empty_like(x)
        toy_mul_fwd_kernel[_grid(x.numel())](x, s, y, x.numel())
        ctx.save_for_backward(x, s)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x, s = ctx.saved_tensors
        dy = dy.contiguous()
        dx, ds = torch.empty_like(x), torch.empty_like(s)
        toy_mul_bwd_kernel[_grid(x.numel())](dy, x, s, dx, ds, x.numel())
        return dx, ds


def build(ctx: Context) -> Workload:
    n = SHAPES[ctx.small]["n"]
    gen, dev = ctx.generator(), ctx.device
    x_all = torch.randn(ctx.world, n, generator=gen, device=dev)
    s = torch.randn(n, generator=gen, device=dev).requires_grad_()
    probe = torch.randn(n, generator=gen, device=dev)
    x = x_all[ctx.rank].clone().requires_grad_()

    # Reference: y = sum_r x_r * s and the gradients of sum(y * probe), in float64.
    x64, s64 = x_all.double().requires_grad_(), s.detach().double().requires_grad_()
    y_ref = (x64 * s64).sum(0)
    (y_ref * probe.double()).sum().backward()
    ref_grads = {"x": x64.grad[ctx.rank].float(), "s": s64.grad.float()}
    world = ctx.world

    def toy_step() -> torch.Tensor:
        zero_grads(x, s)
        y = dist_nn.all_reduce(ToyMul.apply(x, s))
        ((y * probe).sum() / world).backward()
        dist.all_reduce(s.grad)
        return y.detach()

    return Workload(step=toy_step, grads=lambda: {"x": x.grad, "s": s.grad}, ref_grads=ref_grads,
                    ref_out=y_ref.detach().float(), tolerance=1e-5, shapes={"n": n, "dtype": "float32"}, params=[x, s])


SPEC = ClientSpec(name="toy", requirement="none (part of this repository)", import_name="triton",
                  modules=(__name__,), needs_cuda=False, build=build,
                  summary="harness smoke test: autotuned x*s forward and backward, CPU (interpreter) or GPU")
