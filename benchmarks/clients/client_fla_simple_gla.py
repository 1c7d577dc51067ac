"""Client: flash-linear-attention's chunk_simple_gla with g_gamma, tensor parallel, one training step.

Each rank holds HEADS_PER_RANK heads of q, k, v (its shard of one [B, T, H, K] tensor, H = heads per
rank x world), runs FLA's chunked simple GLA with a per-head decay (g_gamma, [heads]), projects its heads'
outputs with its row shard of the output projection ([heads*V, hidden] of [H*V, hidden], hidden = H*V),
sums the partial outputs over ranks with a differentiable all_reduce, and backpropagates a scalar loss.
Autotuned keys: 2 forward (chunk_fwd_kernel_h, chunk_fwd_kernel_o) and 4 backward (chunk_fwd_kernel_h
again with float32 states, chunk_bwd_kernel_dh, chunk_bwd_kernel_dqkwg, chunk_bwd_kernel_dv).
"""
from __future__ import annotations

import torch
import torch.distributed.nn.functional as dist_nn

from common import ClientSpec, Context, Workload, zero_grads
from references import retnet_log_decays, simple_gla_step_reference

B = 1
# T tokens, heads per rank, K = V head dim; the training step, and a tiny one for --small.
SHAPES = {False: {"T": 4096, "heads_per_rank": 16, "K": 128}, True: {"T": 256, "heads_per_rank": 2, "K": 64}}
TOLERANCE = 1e-2


def head_shard(rank: int, heads_per_rank: int) -> slice:
    """This rank's heads in the H dimension of the full q, k, v and g_gamma."""
    return slice(rank * heads_per_rank, (rank + 1) * heads_per_rank)


def row_shard(rank: int, heads_per_rank: int, v_dim: int) -> slice:
    """This rank's rows of the full [H*V, hidden] projection: o flattens (head, v) head-major, so the rows
    of the rank's heads are contiguous."""
    return slice(rank * heads_per_rank * v_dim, (rank + 1) * heads_per_rank * v_dim)


def build(ctx: Context) -> Workload:
    from fla.ops.simple_gla import chunk_simple_gla

    shape = SHAPES[ctx.small]
    T, hr, K = shape["T"], shape["heads_per_rank"], shape["K"]
    V, H = K, shape["heads_per_rank"] * ctx.world
    hidden = H * V
    gen, dev = ctx.generator(), ctx.device

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=dev)

    # Every rank draws all ranks' data from one seed, keeps its shard, and computes the reference on all of it.
    q_all, k_all, v_all = (randn(B, T, H, K).bfloat16() for _ in range(3))
    g_gamma_all = retnet_log_decays(H, dev)  # float32 [H]
    w_all = (randn(H * V, hidden) / (H * V) ** 0.5).bfloat16()
    probe = randn(B * T, hidden)  # loss = sum(y * probe): dL/dy = probe, a dense, well-scaled gradient

    heads, rows = head_shard(ctx.rank, hr), row_shard(ctx.rank, hr, V)
    q, k, v = (t[:, :, heads].contiguous().requires_grad_() for t in (q_all, k_all, v_all))
    g_gamma = g_gamma_all[heads].contiguous()
    w_o = w_all[rows].contiguous().requires_grad_()

    y_ref, g_ref = simple_gla_step_reference(q_all, k_all, v_all, g_gamma_all, w_all, probe)
    ref_grads = {"q": g_ref["q"][:, :, heads].clone(), "k": g_ref["k"][:, :, heads].clone(),
                 "v": g_ref["v"][:, :, heads].clone(), "w_o": g_ref["w_o"][rows].clone()}
    del g_ref, q_all, k_all, v_all, w_all
    world = ctx.world

    def fla_simple_gla_step() -> torch.Tensor:
        zero_grads(q, k, v, w_o)
        o, _ = chunk_simple_gla(q, k, v, g_gamma=g_gamma)  # [B, T, heads, V]; no final state asked for
        y = dist_nn.all_reduce(o.reshape(B * T, hr * V) @ w_o)  # row-parallel projection, summed over ranks
        # Each rank's loss is 1/world of the total: all_reduce's backward sums the ranks' gradients of y.
        loss = (y.float() * probe).sum() / world
        loss.backward()
        return y.detach()

    return Workload(step=fla_simple_gla_step, grads=lambda: {"q": q.grad, "k": k.grad, "v": v.grad, "w_o": w_o.grad},
                    ref_grads=ref_grads, ref_out=y_ref, tolerance=TOLERANCE,
                    shapes={"B": B, "T": T, "heads_per_rank": hr, "H": H, "K": K, "V": V, "hidden": hidden,
                            "dtype": "bfloat16", "g_gamma": "RetNet-style, decay 1-1/32 .. 1-1/512 over all heads"},
                    params=[q, k, v, w_o])


SPEC = ClientSpec(
    name="fla_simple_gla", requirement="fla-core==0.6.0", import_name="fla.ops.simple_gla", modules=("fla",),
    needs_cuda=True, build=build,
    summary="FLA chunk_simple_gla(g_gamma) -> row-parallel projection -> differentiable all_reduce -> backward")
