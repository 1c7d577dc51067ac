"""Exactly once: a tuning call changes state older than the call as one plain call of the function does.

Each test runs a function the way users write training steps, once through a tuning call (several
executions) and once plainly on a copy of the same state, and compares the state after both.
"""
from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tests import kernels as K
from tests.kernels import DEVICE, grid
from triton_ctx_tune import contextual_autotune
from triton_ctx_tune.errors import StateNotRestorableError

N = 96
TUNE = dict(n_warmup=1, n_repeat=2, early_stop=False,
            cache=False)  # 3 configs x 3 slots: 9 tuning executions + the final run


_PLAIN = {"on": False}


def scaled(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    """A tuned Triton kernel out of place: the part of each step that is tuned (in plain runs, torch's
    exact equivalent: outside a tuning call Triton would benchmark the kernel itself)."""
    if _PLAIN["on"]:
        return x * scale
    y = torch.empty_like(x)
    K.scale_copy[grid(x.numel())](x, y, x.numel(), scale)
    return y


def _tuned_twice(step, *state_args):
    """Run `step` through a tuning call; return the call's stats and the number of executions."""
    K.reset_caches()  # tuned from scratch each time
    runs = {"n": 0}

    def counted(*args):
        runs["n"] += 1
        return step(*args)

    tuned = contextual_autotune(**TUNE)(counted)
    out = tuned(*state_args)
    assert tuned.last_call.executions == runs["n"] == 10  # really re-executed
    assert K.chosen(K.scale_copy) == {(N, "torch.float32", "torch.float32"): 64}
    return tuned, out


def plainly(step):
    """`step` as one plain call would run it."""
    def run(*args):
        _PLAIN["on"] = True
        try:
            return step(*args)
        finally:
            _PLAIN["on"] = False
    return run


def _model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(N, 4).to(DEVICE)


def _x() -> torch.Tensor:
    return torch.linspace(-1, 1, N, device=DEVICE)


def test_gradient_accumulation_backward_inside_the_call_accumulates_once():
    def step(model, x):
        loss = model(scaled(x)).square().sum()
        loss.backward()  # zero_grad is outside: gradients accumulate over micro-batches
        return loss

    tuned_model, plain_model = _model(), _model()
    for m in (tuned_model, plain_model):  # a micro-batch already accumulated before the call
        plainly(step)(m, _x() * 0.5)
    _tuned_twice(step, tuned_model, _x())
    plainly(step)(plain_model, _x())
    assert torch.equal(tuned_model.weight.grad, plain_model.weight.grad)
    assert torch.equal(tuned_model.bias.grad, plain_model.bias.grad)
    # and from no gradient at all (.grad assigned, not accumulated, by the first backward)
    fresh, plain = _model(), _model()
    _tuned_twice(step, fresh, _x())
    plainly(step)(plain, _x())
    assert torch.equal(fresh.weight.grad, plain.weight.grad)


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.AdamW(p, lr=0.1),
], ids=["sgd-momentum", "adamw"])
def test_an_optimizer_step_inside_the_call_steps_once(make_opt):
    def step(model, opt, x):
        opt.zero_grad()
        loss = model(scaled(x)).square().sum()
        loss.backward()
        opt.step()
        return loss.detach()

    tuned_model, plain_model = _model(), _model()
    tuned_opt, plain_opt = make_opt(tuned_model.parameters()), make_opt(plain_model.parameters())
    for _ in range(2):  # the optimizers have state before the call
        plainly(step)(tuned_model, tuned_opt, _x())
        plainly(step)(plain_model, plain_opt, _x())
    _, loss = _tuned_twice(step, tuned_model, tuned_opt, _x())
    plain_loss = plainly(step)(plain_model, plain_opt, _x())
    assert torch.equal(loss, plain_loss)
    for p, q in zip(tuned_model.parameters(), plain_model.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(p.grad, q.grad)
        for name, value in plain_opt.state[q].items():
            assert torch.equal(torch.as_tensor(tuned_opt.state[p][name]), torch.as_tensor(value)), name
    # and an optimizer whose state is created by the call's first step
    tuned_model, plain_model = _model(), _model()
    tuned_opt, plain_opt = make_opt(tuned_model.parameters()), make_opt(plain_model.parameters())
    _tuned_twice(step, tuned_model, tuned_opt, _x())
    plainly(step)(plain_model, plain_opt, _x())
    for p, q in zip(tuned_model.parameters(), plain_model.parameters()):
        assert torch.equal(p, q)
        assert set(tuned_opt.state[p]) == set(plain_opt.state[q])
        for name, value in plain_opt.state[q].items():
            assert torch.equal(torch.as_tensor(tuned_opt.state[p][name]), torch.as_tensor(value)), name


def test_batchnorm_in_training_counts_one_batch():
    def step(bn, x):
        return bn(scaled(x).view(8, 12))

    tuned_bn, plain_bn = torch.nn.BatchNorm1d(12).to(DEVICE), torch.nn.BatchNorm1d(12).to(DEVICE)
    _, out = _tuned_twice(step, tuned_bn, _x())
    plain_out = plainly(step)(plain_bn, _x())
    assert int(tuned_bn.num_batches_tracked) == 1
    assert torch.equal(tuned_bn.running_mean, plain_bn.running_mean)
    assert torch.equal(tuned_bn.running_var, plain_bn.running_var)
    assert torch.equal(out, plain_out)


def test_in_place_ops_on_arguments_and_captured_tensors_apply_once():
    counter = torch.zeros(3, device=DEVICE)
    big = torch.zeros(4, 4, device=DEVICE)

    def step(x, acc):
        x.add_(1)
        big[1].mul_(2).add_(3)  # through a view of a captured tensor
        torch.add(acc, scaled(x), out=acc)
        counter[0] += 1
        return x.clone()

    x, acc = torch.zeros(N, device=DEVICE), torch.ones(N, device=DEVICE)
    _, out = _tuned_twice(step, x, acc)
    assert torch.equal(x, torch.ones(N, device=DEVICE))
    assert torch.equal(acc, torch.full((N,), 3.0, device=DEVICE))
    assert counter.tolist() == [1.0, 0.0, 0.0]
    assert big[1].tolist() == [3.0] * 4 and big.sum().item() == 12.0
    assert torch.equal(out, x)


def test_random_numbers_are_those_of_one_plain_call():
    def step(x):
        noise = torch.rand(N, device=DEVICE)
        return scaled(x) + noise + random.random() + float(np.random.rand())

    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    _, out = _tuned_twice(step, _x())
    after = (torch.rand(1).item(), random.random(), float(np.random.rand()))
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    plain = plainly(step)(_x())
    assert torch.equal(out, plain)
    assert after == (torch.rand(1).item(), random.random(), float(np.random.rand()))


def test_best_config_inside_a_tuning_call_is_the_config_that_ran():
    ran: list[int] = []

    def note(nargs):
        ran.append(nargs["BLOCK"])

    configs = [triton.Config({"BLOCK": b}, pre_hook=note) for b in (16, 32, 64)]

    @triton.autotune(configs=configs, key=["n"])
    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    seen: list[tuple[int, int]] = []

    @contextual_autotune(**TUNE)
    def step(x):
        y = torch.empty_like(x)
        copy_kernel[grid(N)](x, y, N)
        seen.append((ran[-1], copy_kernel.best_config.kwargs["BLOCK"]))  # what a library reads after a launch
        assert isinstance(copy_kernel.configs_timings, dict)
        return y

    x = _x()
    assert torch.equal(step(x), x)
    assert len(seen) == step.last_call.executions > 1
    assert all(ran_block == best for ran_block, best in seen), seen
    assert {b for b, _ in seen} == {16, 32, 64}
    winner = copy_kernel.cache[(N, "torch.float32", "torch.float32")]
    assert copy_kernel.best_config is winner and set(copy_kernel.configs_timings) == set(copy_kernel.configs)


def test_over_the_snapshot_limit_the_call_stops_before_its_second_execution_with_state_untouched():
    runs = {"n": 0}
    w = torch.zeros(1024, device=DEVICE)

    @contextual_autotune(snapshot_limit_mb=0.001, **TUNE)  # about 1 KB: w's 4 KB are over it
    def step(x):
        runs["n"] += 1
        w.add_(1)
        return scaled(x)

    with pytest.raises(StateNotRestorableError) as info:
        step(_x())
    assert runs["n"] == 1
    assert torch.equal(w, torch.zeros(1024, device=DEVICE))  # put back: nothing was applied
    message = str(info.value)
    assert "float32[1024]" in message and "aten.add_.Tensor" in message and "snapshot_limit_mb" in message
    assert K.chosen(K.scale_copy) == {}  # nothing was decided either


def test_a_write_that_cannot_be_undone_stops_the_call_with_state_untouched():
    holder = torch.zeros(4, device=DEVICE)

    @contextual_autotune(**TUNE)
    def step(x):
        holder.resize_(8)
        return scaled(x)

    with pytest.raises(StateNotRestorableError, match=rf"float32\[4\] on {DEVICE}(:0)? changed by aten.resize_"):
        step(_x())


def test_a_failing_call_puts_the_state_back():
    x = torch.zeros(N, device=DEVICE)
    runs = {"n": 0}

    @contextual_autotune(**TUNE)
    def step(x):
        runs["n"] += 1
        x.add_(1)
        if runs["n"] == 3:
            raise RuntimeError("boom")
        return scaled(x)

    with pytest.raises(RuntimeError, match="boom"):
        step(x)
    assert torch.equal(x, torch.zeros(N, device=DEVICE))


def test_exactly_once_false_lets_executions_compound():
    x = torch.zeros(N, device=DEVICE)

    @contextual_autotune(exactly_once=False, **TUNE)
    def step(x):
        x.add_(1)
        return scaled(x)

    step(x)
    assert torch.equal(x, torch.full((N,), 10.0, device=DEVICE))


def test_a_new_key_in_a_later_call_of_a_state_changing_function_is_tuned_by_the_next_watched_call():
    model = _model()
    plain = copy.deepcopy(model)

    def body(m, x):
        loss = m(torch.nn.functional.pad(scaled(x), (0, N - x.numel()))).sum()
        loss.backward()
        return loss.detach()

    tuned = contextual_autotune(**TUNE)(body)
    small = torch.linspace(-1, 1, 40, device=DEVICE)
    tuned(model, _x())
    plainly(body)(plain, _x())
    assert tuned.last_call.executions == 10
    tuned(model, small)  # a new key, in an unwatched call: runs once, untuned
    plainly(body)(plain, small)
    assert tuned.last_call.executions == 1
    assert tuned.last_call.deferred == [("scale_copy", (40, "torch.float32", "torch.float32"))]
    assert (40, "torch.float32", "torch.float32") not in K.autotuner(K.scale_copy).cache
    tuned(model, small)  # watched from its start: tunes it
    plainly(body)(plain, small)
    assert tuned.last_call.executions == 10 and tuned.last_call.deferred == []
    assert K.chosen(K.scale_copy)[(40, "torch.float32", "torch.float32")] == 64
    assert torch.equal(model.weight.grad, plain.weight.grad)  # three calls, three gradients


def test_a_pure_function_still_tunes_a_new_key_in_the_call_that_meets_it():
    tuned = contextual_autotune(**TUNE)(scaled)
    tuned(_x())
    small = torch.linspace(-1, 1, 40, device=DEVICE)
    assert torch.equal(tuned(small), small * 2)
    assert tuned.last_call.executions == 10 and tuned.last_call.deferred == []


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_tuning_a_data_parallel_training_step_end_with_one_plain_steps_state(world, tmp_path):
    from tests.test_dist import run_ranks

    results = run_ranks(world, ["train_step", "limit_on_rank1"], tmp_path, worker="exactly_once_worker.py")
    rows = results["train_step"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
        # Three calls (the first tuned, 10 executions), each rank against three plain steps of its own:
        # every loss, parameter, AdamW state and BatchNorm statistic is the same, bit for bit.
        assert row["losses_equal"] and row["params_equal"] and row["opt_state_equal"] and row["bn_equal"], row
        assert row["adam_step"] == 3.0 and row["bn_batches"] == 3 and row["last_executions"] == 1
        assert row["chosen"] == rows[0]["chosen"] == {"(96, 'torch.float32', 'torch.float32')": 64}
    rows = results["limit_on_rank1"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["outcome"].startswith("StateNotRestorableError: ") and "rank 1" not in row["outcome"][:30]
        assert "snapshot_limit_mb=0.001" in row["outcome"], row["outcome"]  # every rank names rank 1's reason
        assert row["runs"] == 1 and row["w_untouched"] and row["chosen"] == {}
