"""Float32 references of what the clients compute, in plain PyTorch (no Triton), runnable on CPU.

Every client checks its gradients against autograd through these. `--self-check` tests the simple GLA
references against each other (a quadratic "parallel" form and a recurrent one) and, where fla is
installed, against FLA's own naive recurrent implementation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# ---- simple GLA with a per-head data-independent decay (g_gamma) -----------------------------------
#
# Layout [B, T, H, K] for q and k, [B, T, H, V] for v (FLA 0.6.0's only layout), g_gamma [H] a log decay.
# o_t = scale * sum_{s <= t} exp(sum_{r=s+1..t} g_gamma) (q_t . k_s) v_s = scale * sum_{s <= t} exp((t-s) g_gamma) ...,
# with FLA's default scale K ** -0.5.

def simple_gla_parallel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_gamma: torch.Tensor,
                        scale: float | None = None) -> torch.Tensor:
    """The quadratic form: a causal [H, T, T] decay matrix times the q.k scores, times v."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    t = torch.arange(T, device=q.device)
    lag = (t[:, None] - t[None, :]).to(q.dtype)  # [T, T]: t - s
    # Mask before exp: exp((t-s) * g) for s > t would overflow to inf, and inf * 0 is nan.
    log_decay = torch.where(lag >= 0, lag * g_gamma.to(q.dtype)[:, None, None], float("-inf"))  # [H, T, T]
    scores = torch.einsum("bthk,bshk->bhts", q, k) * scale
    return torch.einsum("bhts,bshv->bthv", scores * log_decay.exp(), v)


def simple_gla_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_gamma: torch.Tensor,
                         scale: float | None = None) -> torch.Tensor:
    """The state form: S_t = exp(g_gamma) S_{t-1} + k_t^T v_t, o_t = scale * q_t S_t (one step per token)."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    gate = g_gamma.to(q.dtype).exp()[None, :, None, None]  # [1, H, 1, 1]
    state = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for i in range(T):
        state = state * gate + k[:, i, :, :, None] * v[:, i, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, i], state) * scale)
    return torch.stack(out, dim=1)


def retnet_log_decays(heads: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """RetNet-style per-head log decays: decay 1 - 1/32 (short memory) to 1 - 1/512 (long) across heads."""
    lo, hi = torch.tensor(1 / 32).log(), torch.tensor(1 / 512).log()
    return torch.log1p(-torch.exp(torch.linspace(float(lo), float(hi), heads))).to(device)


def simple_gla_step_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_gamma: torch.Tensor,
                              w_o: torch.Tensor, probe: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The whole FLA step on every rank's data at once: (y, gradients of sum(y * probe)) in float32.

    q, k, v hold all heads of all ranks, w_o the full [H*V, hidden] projection. The distributed step's
    objective is the same: each rank's loss is sum(y * probe) / world and the differentiable all_reduce
    sums the gradient of y over ranks in backward, so the ranks' losses add up to sum(y * probe).
    """
    leaves = {n: t.detach().float().requires_grad_() for n, t in (("q", q), ("k", k), ("v", v), ("w_o", w_o))}
    o = simple_gla_parallel(leaves["q"], leaves["k"], leaves["v"], g_gamma.float())
    B, T, H, V = o.shape
    y = o.reshape(B * T, H * V) @ leaves["w_o"]
    (y * probe.float()).sum().backward()
    return y.detach(), {n: t.grad for n, t in leaves.items()}


# ---- layer norm with a residual, then RMS norm (FLA's fused norms) ----------------------------------

def norms_reference(x: torch.Tensor, residual: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                    eps: float) -> torch.Tensor:
    """rms_norm(layer_norm(x + residual; w1, b1); w2), no bias on the RMS norm, over the last dimension."""
    h = F.layer_norm(x + residual, (x.shape[-1],), w1, b1, eps)
    return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * w2


def norms_step_reference(x: torch.Tensor, residual: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                         probe: torch.Tensor, eps: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Every rank's tokens at once: (y, gradients of sum(y * probe)) in float32.

    With the parameters' gradients summed over ranks (the step all_reduces them), the ranks' losses add up
    to this one objective over all tokens.
    """
    leaves = {n: t.detach().float().requires_grad_() for n, t in
              (("x", x), ("residual", residual), ("w1", w1), ("b1", b1), ("w2", w2))}
    y = norms_reference(leaves["x"], leaves["residual"], leaves["w1"], leaves["b1"], leaves["w2"], eps)
    (y * probe.float()).sum().backward()
    return y.detach(), {n: t.grad for n, t in leaves.items()}


# ---- linear cross-entropy (CCE) ---------------------------------------------------------------------

def cross_entropy_step_reference(e_per_rank: list[torch.Tensor], c: torch.Tensor, targets_per_rank: list[torch.Tensor]
                                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Data-parallel linear cross-entropy in float32: (per-rank mean losses, per-rank dE, dC averaged over ranks).

    Rank r's loss is the mean cross-entropy of its tokens' logits e_r @ c^T; e_r's gradient is that loss's,
    and c's gradient is the mean over ranks (what DDP's averaging all_reduce gives).
    """
    c32 = c.detach().float().requires_grad_()
    losses, de, dc = [], [], torch.zeros_like(c32)
    for e, targets in zip(e_per_rank, targets_per_rank):
        e32 = e.detach().float().requires_grad_()
        loss = F.cross_entropy(e32 @ c32.T, targets)
        grad_e, grad_c = torch.autograd.grad(loss, (e32, c32))
        losses.append(loss.detach())
        de.append(grad_e)
        dc += grad_c / len(e_per_rank)
    return losses, de, dc
