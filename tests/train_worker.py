"""One rank of the training-loop tests (test_train_loop.py), started by torchrun.

A data-parallel MLP block whose linear layers run the examples' autotuned Triton GEMM forward and
backward (the backward's dW reuses the forward's tile, read from `matmul_kernel.best_config`, as some
kernel libraries do), trained with AdamW over 2 accumulated micro-batches, the optimizer step inside
the tuned function. Arms: every kernel fixed to one config; re-execution tuning on the first step;
online tuning; and the tuned arms' winners fixed, which must reproduce them bit for bit.
TRAIN_STEPS sets the number of steps (default 30).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from mlp_kernels import matmul, matmul_kernel  # noqa: E402
from tests.dist_worker import main  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402

STEPS = int(os.environ.get("TRAIN_STEPS", "30"))
GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float32
M, H, I = (256, 512, 1024) if GPU else (32, 32, 48)


def _fixed_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: triton.Config) -> None:
    """out = a @ b with the given config, no autotuning: a library reusing the forward's tile."""
    m, k = a.shape
    n = b.shape[1]
    kw = config.all_kwargs()
    grid = (triton.cdiv(m, kw["BLOCK_M"]) * triton.cdiv(n, kw["BLOCK_N"]),)
    matmul_kernel.fn[grid](a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                           out.stride(0), out.stride(1), **kw)


class TritonLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
        matmul(x, w, y)
        ctx.save_for_backward(x, w)
        ctx.config = matmul_kernel.best_config  # the config the launch just ran
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        matmul(dy, w.t(), dx)
        dw = torch.empty_like(w)
        _fixed_matmul(x.t(), dy, dw, ctx.config)
        return dx, dw


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter((torch.randn(H, I, generator=g) / H ** 0.5).to(DEVICE, DTYPE))
        self.w2 = torch.nn.Parameter((torch.randn(I, H, generator=g) / I ** 0.5).to(DEVICE, DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(TritonLinear.apply(x, self.w1), approximate="tanh")
        return TritonLinear.apply(h, self.w2)


def _batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return [(torch.randn(M, H, generator=g).to(DEVICE, DTYPE), torch.randn(M, H, generator=g).to(DEVICE, DTYPE))
            for _ in range(2)]


def train_step(model: Block, opt: torch.optim.Optimizer, batches: list[tuple[torch.Tensor,
                                                                             torch.Tensor]]) -> torch.Tensor:
    opt.zero_grad()
    total = torch.zeros((), device=DEVICE)
    for x, target in batches:  # gradient accumulation over micro-batches
        loss = (model(x).float() - target.float()).square().mean() / len(batches)
        loss.backward()
        total += loss.detach()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    dist.all_reduce(total)
    return total


class _Pinned(dict):
    """An Autotuner.cache that answers every key with one config (a fixed-config run under Triton's run)."""

    def __init__(self, choose: Callable[[tuple], triton.Config]) -> None:
        super().__init__()
        self.choose = choose

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: tuple) -> triton.Config:
        return self.choose(key)


def _arm(step_fn: Callable[..., torch.Tensor], pinned: Callable[[tuple], triton.Config] | None) -> dict[str, Any]:
    saved = matmul_kernel.cache
    matmul_kernel.cache = _Pinned(pinned) if pinned is not None else {}
    try:
        model = Block()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses, times, first_tuned = [], [], 1
        online = getattr(getattr(step_fn, "opts", None), "online", False)
        for step in range(STEPS):
            if GPU:
                torch.cuda.synchronize()
            began = time.perf_counter()
            losses.append(step_fn(model, opt, _batches(step)))
            if GPU:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
            if online and step_fn._online is not None:
                first_tuned = step + 2  # the session goes on: the first call that runs every key tuned is later
        winners = {repr(k): str(v) for k, v in dict.items(matmul_kernel.cache)} if pinned is None else {}
        return {"losses": torch.stack(losses).float().cpu(),
                "params": [p.detach().float().cpu() for p in model.parameters()],
                "state": [opt.state[p][name].float().cpu() for p in model.parameters() for name in ("exp_avg",
                                                                                                    "exp_avg_sq")],
                "times": times, "winners": winners, "cache": dict(dict.items(matmul_kernel.cache)),
                **_first_tuned(times, first_tuned if first_tuned <= STEPS else None)}
    finally:
        matmul_kernel.cache = saved


def _first_tuned(times: list[float], call: int | None) -> dict[str, Any]:
    """The first step that runs every key tuned (1-based; online: the first call after the session ended; None: not
    within the steps), the time to its end, and the extra time: each step's time above the tuned step's (the median
    of the last 10 steps after it), summed over the steps up to and with it."""
    after = times[call:][-10:] if call is not None else []
    if not after:
        return {"first_tuned_call": call, "first_tuned_at_s": None, "extra_s": None}
    tuned = statistics.median(after)
    return {"first_tuned_call": call, "first_tuned_at_s": sum(times[:call]),
            "extra_s": sum(t - tuned for t in times[:call])}


def _close(a: dict[str, Any], b: dict[str, Any], rtol: float) -> dict[str, bool]:
    def near(x: torch.Tensor, y: torch.Tensor) -> bool:
        return bool(torch.allclose(x, y, rtol=rtol, atol=rtol))
    return {"losses": near(a["losses"], b["losses"]), "params": all(near(x, y) for x, y in zip(a["params"],
                                                                                               b["params"])),
            "state": all(near(x, y) for x, y in zip(a["state"], b["state"]))}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (torch.equal(a["losses"], b["losses"]) and all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
            and all(torch.equal(x, y) for x, y in zip(a["state"], b["state"])))


def train_loop() -> dict[str, Any]:
    first = matmul_kernel.configs[0]
    fixed = _arm(train_step, lambda key: first)
    reexec = _arm(contextual_autotune(is_dist=True, cache=False)(train_step), None)
    online = _arm(contextual_autotune(is_dist=True, cache=False, online=True)(train_step), None)
    again = _arm(train_step, lambda key, c=reexec["cache"]: c[key])  # re-execution's winners, fixed
    # bf16 rounding of the GEMMs differs between configs (their K tiles sum in another order)
    rtol = 5e-2 if GPU else 1e-4
    return {"steps": STEPS, "keys": len(reexec["winners"]), "online_keys": len(online["winners"]),
            "reexec_vs_fixed": _close(reexec, fixed, rtol), "online_vs_fixed": _close(online, fixed, rtol),
            "reexec_same_as_its_winners_fixed": _same(reexec, again),
            "winners_agree": reexec["winners"],
            "first_step_s": {"fixed": fixed["times"][0], "reexec": reexec["times"][0], "online": online["times"][0]},
            # What tuning cost the loop: the first step that runs every key tuned, the time to its end, the extra time.
            "first_tuned": {arm: {k: r[k] for k in ("first_tuned_call", "first_tuned_at_s", "extra_s")}
                            for arm, r in (("reexec", reexec), ("online", online))},
            "total_s": {"fixed": sum(fixed["times"]), "reexec": sum(reexec["times"]), "online": sum(online["times"])},
            "steady_ms": {k: 1e3 * statistics.median(v["times"][-10:]) for k, v in
                          (("fixed", fixed), ("reexec", reexec), ("online", online), ("again", again))},
            "max_loss_diff": {"reexec": float((reexec["losses"] - fixed["losses"]).abs().max()),
                              "online": float((online["losses"] - fixed["losses"]).abs().max())}}


if __name__ == "__main__":
    main({"train_loop": train_loop})
