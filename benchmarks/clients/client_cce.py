"""Client: Apple's Cut Cross-Entropy (cut-cross-entropy 25.1.1), the LM-head loss, data parallel, one training step.

Each rank computes the mean cross-entropy of its tokens' logits e @ c^T without materialising them, then
backpropagates and averages the classifier's gradient over ranks (DDP's all_reduce). With CCE_AUTOTUNE=1
(set by run_clients.py) its three kernels are @triton.autotune'd, pruned by the library's own
prune_configs_by (shared-memory check, then a performance model's top 10 or 5), and work in place:
forward, the log-sum-exp kernel accumulates into LSE under locks (restore_value=["LSE"]) and the
target-logit kernel atomically adds into its output (reset_to_zero); backward accumulates dE and dC
under locks (reset_to_zero=["dE", "dC"]). filter_eps=None turns off CCE's gradient filtering (an
approximation that also runs a torch.compile'd sort), so the gradients are exact and no Inductor
compile enters the timings.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from common import ClientSpec, Context, Workload, zero_grads
from references import cross_entropy_step_reference

SHAPES = {False: {"tokens_per_rank": 4096, "D": 2048, "V": 32768}, True: {"tokens_per_rank": 256, "D": 256, "V": 2048}}
# CCE 25.1.1 accumulates dE and dC in bf16 (locked read-add-write per vocabulary/token block), so its own
# rounding is a few 1e-3; the check's job is to catch a tuner that corrupts in-place results (errors ~1).
TOLERANCE = 2e-2


def build(ctx: Context) -> Workload:
    from cut_cross_entropy import linear_cross_entropy

    shape = SHAPES[ctx.small]
    N, D, V = shape["tokens_per_rank"], shape["D"], shape["V"]
    gen, dev = ctx.generator(), ctx.device
    e_all = torch.randn(ctx.world * N, D, generator=gen, device=dev).bfloat16()
    c_all = (torch.randn(V, D, generator=gen, device=dev) / D ** 0.5).bfloat16()  # logits ~ N(0, 1)
    targets_all = torch.randint(0, V, (ctx.world * N,), generator=gen, device=dev)

    rows = slice(ctx.rank * N, (ctx.rank + 1) * N)
    e = e_all[rows].contiguous().requires_grad_()
    c = c_all.clone().requires_grad_()
    targets = targets_all[rows].contiguous()

    losses, de, dc = cross_entropy_step_reference(list(e_all.split(N)), c_all, list(targets_all.split(N)))
    ref_grads = {"e": de[ctx.rank], "c": dc}
    ref_out = losses[ctx.rank]
    del de, e_all, targets_all
    world = ctx.world

    def cce_step() -> torch.Tensor:
        zero_grads(e, c)
        loss = linear_cross_entropy(e, c, targets, filter_eps=None)  # mean over this rank's tokens
        loss.backward()
        dist.all_reduce(c.grad)  # DDP: the replicated classifier's gradient, averaged over ranks
        c.grad.div_(world)
        return loss.detach()

    return Workload(step=cce_step, grads=lambda: {"e": e.grad, "c": c.grad}, ref_grads=ref_grads, ref_out=ref_out,
                    tolerance=TOLERANCE, shapes={"tokens_per_rank": N, "D": D, "V": V, "dtype": "bfloat16",
                                                 "filter_eps": None},
                    params=[e, c])


SPEC = ClientSpec(
    name="cce", requirement="cut-cross-entropy==25.1.1", import_name="cut_cross_entropy",
    modules=("cut_cross_entropy",), needs_cuda=True, build=build,
    summary="CCE linear_cross_entropy (CCE_AUTOTUNE=1) -> backward -> all_reduce of the classifier gradient")
