"""Which call a launch belongs to (resolver.py), and the warm path that shares it (call.py)."""
from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import pytest
import torch
import torch.utils.checkpoint

from tests import kernels as K
from tests.kernels import DEVICE, chosen, grid
from triton_ctx_tune import UnattributedLaunchWarning, carry, contextual_autotune
from triton_ctx_tune.runtime import resolver

FAST = dict(n_warmup=1, n_repeat=2, early_stop=False)  # 3 slots per config, every config measured fully


def ramp(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device=DEVICE)


def decided_keys(tmp_path: Path) -> set[tuple[str, tuple]]:
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    return {(e["kernel"], tuple(e["key"])) for e in events if e["event"] == "decision"}


def test_launch_from_a_thread_the_call_starts_with_carry_belongs_to_the_call(tmp_path):
    threads_seen: set[int] = set()

    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.add_one_[grid(h.numel())](h, h.numel())

        def worker() -> None:
            threads_seen.add(threading.get_ident())
            K.double_[grid(h.numel())](h, h.numel())

        t = threading.Thread(target=carry(worker))
        t.start()
        t.join()
        return h

    x = ramp(100)
    torch.testing.assert_close(op(x), (x + 1) * 2)
    assert threading.get_ident() not in threads_seen
    # The worker's kernel took its slots in lockstep with the caller's: 3 configs x 3 slots, then the final run.
    assert op.last_call.executions == 10
    assert {(t.kernel, t.key) for t in op.last_call.tuned} == {("add_one_", (100, "torch.float32")),
                                                                 ("double_", (100, "torch.float32"))}
    assert decided_keys(tmp_path) == {("add_one_", (100, "torch.float32")), ("double_", (100, "torch.float32"))}
    assert chosen(K.double_) == {(100, "torch.float32"): 32}
    assert resolver.current() is None and not resolver.open_calls


def test_a_thread_the_call_does_not_carry_runs_triton_untouched_and_is_named(tmp_path):
    outcome: dict[str, object] = {}

    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.add_one_[grid(h.numel())](h, h.numel())

        def plain() -> None:
            dst = torch.empty_like(x)
            try:  # Triton's own autotuner: out of place, so its benchmark loop harms nothing
                K.scale_copy[grid(x.numel())](x, dst, x.numel(), 2.0)
                outcome["dst"] = dst
            except Exception as e:  # noqa: BLE001 (triton < 3.9 benchmarks even under the interpreter, and fails)
                outcome["error"] = e

        t = threading.Thread(target=plain)
        t.start()
        t.join()
        return h

    x = ramp(30)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = op(x)
    torch.testing.assert_close(h, x + 1)
    named = [w for w in caught if issubclass(w.category, UnattributedLaunchWarning)]
    assert len(named) >= 1 and {str(w.message) for w in named} == {str(named[0].message)}  # one key, named
    assert "kernel scale_copy, key (30, 'torch.float32', 'torch.float32')" in str(named[0].message)
    assert "carry(fn)" in str(named[0].message)
    if "dst" in outcome:
        torch.testing.assert_close(outcome["dst"], x * 2)
    # The call tuned only its own thread's kernel; the other launch never reached it.
    assert [t.kernel for t in op.last_call.tuned] == ["add_one_"]
    assert decided_keys(tmp_path) == {("add_one_", (30, "torch.float32"))}


class _DoubleWithAccumulatingBackward(torch.autograd.Function):
    """y = 2x; its backward accumulates into a zeroed gradient buffer with an autotuned in-place kernel."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        y = x.detach().clone()
        K.double_[grid(y.numel())](y, y.numel())
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        acc = torch.zeros_like(grad)
        g2 = grad.contiguous() * 2
        K.accumulate[grid(acc.numel())](g2, acc, acc.numel())  # acc += 2 * grad, reset_to_zero=acc
        return acc


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpoint"])
def test_backward_inside_the_call_is_tuned_by_the_call(tmp_path, checkpointed):
    w = torch.linspace(0.5, 1.5, 64, device=DEVICE)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _DoubleWithAccumulatingBackward.apply(x) * w

    @contextual_autotune(**FAST)
    def step(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_(True)
        y = torch.utils.checkpoint.checkpoint(forward, x, use_reentrant=False) if checkpointed else forward(x)
        y.sum().backward()
        return x.grad

    grad = step(ramp(64))
    torch.testing.assert_close(grad, 2 * w)  # one accumulation, exact
    assert decided_keys(tmp_path) == {("double_", (64, "torch.float32")),
                                      ("accumulate", (64, "torch.float32", "torch.float32"))}
    assert chosen(K.accumulate) == {(64, "torch.float32", "torch.float32"): 32}
    assert step.last_call.executions == 10


def test_warm_call_runs_once_and_an_untuned_key_met_mid_call_is_tuned_by_the_call(tmp_path):
    executions = 0

    @contextual_autotune(**FAST)
    def op(x: torch.Tensor, y: torch.Tensor):
        nonlocal executions
        executions += 1
        a, b = x.clone(), y.clone()
        K.add_one_[grid(a.numel())](a, a.numel())
        K.add_one_[grid(b.numel())](b, b.numel())
        return a, b

    x = ramp(100)
    op(x, x)  # tunes the key of n=100, launched twice per execution: 9 slots in 5 executions, then the final run
    assert op.last_call.executions == 6 and chosen(K.add_one_) == {(100, "torch.float32"): 64}
    executions = 0
    a, b = op(x, x)
    torch.testing.assert_close(a, x + 1)
    assert executions == 1 and op.last_call.executions == 1 and op.last_call.tuned == []
    assert op._last.session is None  # the warm path built no Session (Triton passes warmup=False on every launch)
    # Warm on the first launch, then a new key: the execution in progress becomes the first step.
    executions = 0
    y = ramp(40)
    a, b = op(x, y)
    torch.testing.assert_close(a, x + 1)
    torch.testing.assert_close(b, y + 1)
    assert executions == op.last_call.executions == 10
    assert [(t.kernel, t.key) for t in op.last_call.tuned] == [("add_one_", (40, "torch.float32"))]
    assert chosen(K.add_one_) == {(100, "torch.float32"): 64, (40, "torch.float32"): 16}


def test_warm_path_launch_honours_config_pre_hook_and_best_config():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(64)
    op(x)
    at = K.autotuner(K.double_)
    at.best_config = None
    torch.testing.assert_close(op(x), x * 2)
    assert at.best_config.kwargs["BLOCK"] == 32 and op.last_call.executions == 1


def test_torch_compile_breaks_the_graph_once_at_the_call_and_tunes_with_our_tuner():
    @contextual_autotune(**FAST, cache=False)
    def op(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())  # in place on a buffer the call allocates
        return h

    def model(x: torch.Tensor) -> torch.Tensor:
        return op(x + 1) - 1

    import torch._dynamo

    torch._dynamo.reset()
    x = ramp(64)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 1
    torch._dynamo.reset()
    K.reset_caches()  # explain ran (and tuned) the call once
    compiled = torch.compile(model, backend="eager")
    torch.testing.assert_close(compiled(x), (x + 1) * 2 - 1)  # the first call tunes: still exact
    assert [t.kernel for t in op.last_call.tuned] == ["double_"] and op.last_call.executions == 10
    torch.testing.assert_close(compiled(x), (x + 1) * 2 - 1)
    assert op.last_call.executions == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_cuda_graph_timing_is_refused_without_a_gpu_before_any_work():
    from triton_ctx_tune import InvalidOptionError

    with pytest.raises(InvalidOptionError,
                       match="cuda_graph=True is not valid: expected False here: graph replays need"):
        contextual_autotune(cuda_graph=True)
