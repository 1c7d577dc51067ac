"""One rank of the multi-process exactly-once tests (test_exactly_once.py), started by torchrun;
dist_worker.main runs the scenarios and writes each one's outcome to OUT/SCENARIO.rank{r}.json.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import kernels as K  # noqa: E402
from tests.dist_worker import main  # noqa: E402
from tests.kernels import DEVICE, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402
from triton_ctx_tune.errors import StateNotRestorableError  # noqa: E402

N = 96
TUNE = dict(n_warmup=1, n_repeat=2, early_stop=False, cache=False, is_dist=True)


def _scaled(x: torch.Tensor, plain: bool) -> torch.Tensor:
    if plain:
        return x * 2.0
    y = torch.empty_like(x)
    K.scale_copy[grid(x.numel())](x, y, x.numel(), 2.0)
    return y


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                plain: bool = False) -> torch.Tensor:
    """A data-parallel training step: its own all_reduce of the gradients, then the optimizer step."""
    opt.zero_grad()
    loss = model(_scaled(x, plain).view(8, 12)).square().mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    return loss.detach()


def train_step() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 6), torch.nn.BatchNorm1d(6)).to(DEVICE)
    plain = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=0.1)
    x = torch.linspace(-1, 1, N, device=DEVICE) * (dist.get_rank() + 1)  # each rank its own micro-batch
    tuned = contextual_autotune(**TUNE)(_train_step)
    losses = [tuned(model, opt, x).item() for _ in range(3)]
    executions = tuned.last_call.executions
    plain_losses = [_train_step(plain, plain_opt, x, plain=True).item() for _ in range(3)]
    params = all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters()))
    states = all(torch.equal(torch.as_tensor(opt.state[p][k]), torch.as_tensor(v))
                 for p, q in zip(model.parameters(), plain.parameters()) for k, v in plain_opt.state[q].items())
    bn, plain_bn = model[1], plain[1]
    return {"losses_equal": losses == plain_losses, "params_equal": params, "opt_state_equal": states,
            "adam_step": float(opt.state[model[0].weight]["step"]), "bn_batches": int(bn.num_batches_tracked),
            "bn_equal": torch.equal(bn.running_mean, plain_bn.running_mean), "last_executions": executions,
            "chosen": {repr(k): v for k, v in K.chosen(K.scale_copy).items()}}


def limit_on_rank1() -> dict[str, Any]:
    """Rank 1 alone cannot keep its copies: every rank stops before its second execution."""
    K.reset_caches()
    w = torch.zeros(1024, device=DEVICE)
    runs = {"n": 0}
    limit = 0.001 if dist.get_rank() == 1 else 64.0

    @contextual_autotune(snapshot_limit_mb=limit, **TUNE)
    def step(x: torch.Tensor) -> torch.Tensor:
        runs["n"] += 1
        w.add_(1)
        y = _scaled(x, plain=False)
        dist.all_reduce(y)
        return y

    try:
        step(torch.ones(N, device=DEVICE))
        outcome = "returned"
    except StateNotRestorableError as e:
        outcome = f"StateNotRestorableError: {e}"
    return {"outcome": outcome, "runs": runs["n"], "w_untouched": bool((w == 0).all()),
            "chosen": {repr(k): v for k, v in K.chosen(K.scale_copy).items()}}


ONLINE = dict(online=True, n_warmup=1, n_repeat=2, early_stop=False, cache=False, is_dist=True, precompile=False)


def online() -> dict[str, Any]:
    """online=True with the function's own all_reduce: the same calls decide the same winner everywhere."""
    K.reset_caches()
    runs = {"n": 0}

    @contextual_autotune(**ONLINE)
    def step(x: torch.Tensor) -> torch.Tensor:
        runs["n"] += 1
        K.double_[grid(128)](x, 128)  # in place, once per call
        y = x.clone()
        dist.all_reduce(y)
        return y

    x = torch.ones(128, device=DEVICE)
    calls = 0
    while True:
        calls += 1
        step(x)
        if step._online is None or calls > 30:
            break
    step(x)
    return {"calls": calls, "runs": runs["n"], "x_ok": bool((x == 2.0 ** runs["n"]).all()),
            "chosen": {repr(k): v for k, v in K.chosen(K.double_).items()}}


def online_defaults() -> dict[str, Any]:
    """Issue 38's hang: two kernels of 3 configs each and an all_reduce, online with the default options
    (split screening on, background compiles), n_repeat=2, n_warmup=1. 3 configs over 2 ranks give uneven
    screening shares; every call must still end with the same collectives on every rank."""
    K.reset_caches()
    runs = {"n": 0}

    @contextual_autotune(is_dist=True, online=True, n_repeat=2, n_warmup=1, cache=False)
    def step(x: torch.Tensor) -> torch.Tensor:
        runs["n"] += 1
        K.double_[grid(128)](x, 128)
        K.add_one_[grid(128)](x, 128)
        y = x.clone()
        dist.all_reduce(y)
        return y

    x = torch.zeros(128, device=DEVICE)
    expected = torch.zeros(128, device=DEVICE)
    decided_at = None
    for call in range(1, 41):
        step(x)
        expected = expected * 2 + 1
        if decided_at is None and step._online is None:
            decided_at = call
    return {"decided_at": decided_at, "runs": runs["n"], "x_ok": bool(torch.equal(x, expected)),
            "chosen": {f"{name}{key!r}": v for name, k in (("double_", K.double_), ("add_one_", K.add_one_))
                       for key, v in K.chosen(k).items()}}


def online_mismatch() -> dict[str, Any]:
    """Rank 1 launches a key the others do not, in its third call: a named error on every rank, no hang."""
    K.reset_caches()
    runs = {"n": 0}

    @contextual_autotune(**ONLINE)
    def step(x: torch.Tensor) -> torch.Tensor:
        runs["n"] += 1
        K.double_[grid(128)](x, 128)
        if dist.get_rank() == 1 and runs["n"] == 3:
            K.add_one_[grid(128)](x, 128)
        return x

    x = torch.ones(128, device=DEVICE)
    try:
        for _ in range(9):
            step(x)
        outcome = "returned"
    except Exception as e:  # noqa: BLE001 (the outcome under test)
        outcome = f"{type(e).__name__}: {e}"
    return {"outcome": outcome, "runs": runs["n"]}


if __name__ == "__main__":
    main({"train_step": train_step, "limit_on_rank1": limit_on_rank1, "online": online,
          "online_defaults": online_defaults,
          "online_mismatch": online_mismatch})
