"""Client: flash-linear-attention's fused LayerNorm (with residual) and RMSNorm, data parallel, one training step.

Each rank normalises its own tokens: h = layer_norm(x + residual; w1, b1), y = rms_norm(h; w2), then
backpropagates a scalar loss and sums the replicated parameters' gradients over ranks (data parallelism's
gradient all_reduce). FLA's norm kernels are autotuned in forward and backward; at hidden size > 512 they
are the row kernels, and the two norms give each kernel two keys (with residual, and RMS): 2 keys of
layer_norm_fwd_kernel_row forward, 2 of layer_norm_bwd_kernel_row backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from common import ClientSpec, Context, Workload, zero_grads
from references import norms_step_reference

SHAPES = {False: {"tokens_per_rank": 8192, "D": 4096}, True: {"tokens_per_rank": 256, "D": 1024}}
EPS = 1e-5
TOLERANCE = 1e-2


def build(ctx: Context) -> Workload:
    from fla.modules.norm.layernorm import layer_norm, rms_norm

    shape = SHAPES[ctx.small]
    N, D = shape["tokens_per_rank"], shape["D"]
    gen, dev = ctx.generator(), ctx.device

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=dev)

    x_all, res_all = randn(ctx.world * N, D).bfloat16(), randn(ctx.world * N, D).bfloat16()
    w1, b1, w2 = ((1 + 0.1 * randn(D)).bfloat16(), (0.1 * randn(D)).bfloat16(), (1 + 0.1 * randn(D)).bfloat16())
    probe_all = randn(ctx.world * N, D)

    rows = slice(ctx.rank * N, (ctx.rank + 1) * N)
    x, residual = (t[rows].contiguous().requires_grad_() for t in (x_all, res_all))
    probe = probe_all[rows].contiguous()
    for p in (w1, b1, w2):
        p.requires_grad_()

    y_ref, g_ref = norms_step_reference(x_all, res_all, w1, b1, w2, probe_all, EPS)
    ref_grads = {"x": g_ref["x"][rows].clone(), "residual": g_ref["residual"][rows].clone(),
                 "w1": g_ref["w1"], "b1": g_ref["b1"], "w2": g_ref["w2"]}
    ref_out = y_ref[rows].clone()
    del g_ref, y_ref, x_all, res_all, probe_all

    def fla_norms_step() -> torch.Tensor:
        zero_grads(x, residual, w1, b1, w2)
        h = layer_norm(x, w1, b1, residual=residual, eps=EPS)  # fused residual add + LayerNorm
        y = rms_norm(h, w2, None, eps=EPS)
        (y.float() * probe).sum().backward()
        for p in (w1, b1, w2):
            dist.all_reduce(p.grad)  # the replicated parameters' gradients: summed over ranks
        return y.detach()

    return Workload(step=fla_norms_step,
                    grads=lambda: {"x": x.grad, "residual": residual.grad, "w1": w1.grad, "b1": b1.grad, "w2": w2.grad},
                    ref_grads=ref_grads, ref_out=ref_out, tolerance=TOLERANCE,
                    shapes={"tokens_per_rank": N, "D": D, "dtype": "bfloat16", "eps": EPS},
                    params=[x, residual, w1, b1, w2])


SPEC = ClientSpec(
    name="fla_norms", requirement="fla-core==0.6.0", import_name="fla.modules.norm.layernorm", modules=("fla",),
    needs_cuda=True, build=build,
    summary="FLA layer_norm(x + residual) -> rms_norm -> backward -> all_reduce of parameter gradients")
