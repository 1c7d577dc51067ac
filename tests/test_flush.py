"""flush_l2: where a tuning call clears L2 before its samples.

"step" (the default) clears it once as each re-execution starts, so a kernel is timed with the cache its producers
in the function leave it (the MLP op's GELU reads its GEMM's output from L2; RESULTS sections 43 and 45). True
clears it before every timed launch, as Triton's _bench does. The session code is the same on the
CPU; only the flush itself needs CUDA (tests/test_gpu.py counts real flushes in each mode). Here the host timer's
begin_step and start are wrapped, calling through, to record what a GPU timer is asked to do: the timer decides
from its mode whether a request flushes (flushes()).
"""
from __future__ import annotations

import pytest
import torch

from tests import kernels as K
from tests.kernels import DEVICE, chosen, grid
from triton_ctx_tune import InvalidOptionError, contextual_autotune
from triton_ctx_tune.options import TuneOptions
from triton_ctx_tune.runtime import timing
from triton_ctx_tune.runtime.timing import flushes

N = 64
# 3 configs x 3 slots per key (1 warm-up, 2 timed), no confirmation rounds: the number of steps is exact.
EXACT = dict(n_warmup=1, n_repeat=2, early_stop=False, confirm=False, cache=False)


def test_which_spans_flush_in_each_mode() -> None:
    assert flushes("step", "step") and not flushes("step", "launch") and flushes("step", "execution")
    assert flushes(True, "launch") and flushes(True, "step") and not flushes(True, "execution")
    assert not flushes(False, "launch") and not flushes(False, "step") and not flushes(False, "execution")


def test_the_default_flushes_once_per_re_execution_and_never_between_the_functions_launches() -> None:
    # A GELU timed after an L2 flush read its GEMM's output from DRAM, where BLOCK 1024 and 2048 are level; in
    # the op it reads it from L2, and 1024 is 2.2 to 3.1% slower (RESULTS.md section 45).
    default = TuneOptions().flush_l2
    assert default == "step"
    assert flushes(default, "execution") and flushes(default, "step") and not flushes(default, "launch")


@pytest.mark.parametrize("bad", ["always", "launch", 1, None])
def test_a_flush_l2_that_is_not_one_of_the_three_is_refused_with_them_named(bad: object) -> None:
    with pytest.raises(InvalidOptionError, match='"step" .*True .*False'):
        contextual_autotune(flush_l2=bad)


def _record(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    begin, start = timing.HostTimer.begin_step, timing.HostTimer.start

    def recorded_begin(self: timing.HostTimer) -> None:
        seen.append("begin_step")
        begin(self)

    def recorded_start(self: timing.HostTimer, span: str, head_start_s: float = 0.0) -> float:
        seen.append(span)
        return start(self, span, head_start_s)

    monkeypatch.setattr(timing.HostTimer, "begin_step", recorded_begin)
    monkeypatch.setattr(timing.HostTimer, "start", recorded_start)
    return seen


def test_each_re_execution_begins_with_the_steps_flush_and_its_launches_are_timed_as_launches(monkeypatch) -> None:
    seen = _record(monkeypatch)
    executions = 0

    @contextual_autotune(**EXACT)
    def op(x: torch.Tensor) -> torch.Tensor:
        nonlocal executions
        executions += 1
        y = x.clone()
        K.add_one_[grid(N)](y, N)
        K.double_[grid(N)](y, N)  # reads what add_one_ just wrote
        return y

    x = torch.arange(N, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(op(x), (x + 1) * 2)
    # The first execution met the keys (it was running already: no flush), 8 re-executions took the other slots,
    # and the final run is not timed.
    assert executions == 10
    assert seen.count("begin_step") == 8
    assert seen.count("launch") == 2 * 3 * 2 and "step" not in seen  # both keys' timed slots
    # Each re-execution flushes before its launches: the first step's one slot is a warm-up, untimed.
    steps = " ".join(seen).split("begin_step")
    assert steps[0] == "" and all(s.strip() in ("launch launch", "") for s in steps[1:])
    assert sum(s.strip() == "launch launch" for s in steps[1:]) == 6
    assert set(chosen(K.add_one_)) == {(N, "torch.float32")} and set(chosen(K.double_)) == {(N, "torch.float32")}
    K.autotuner(K.add_one_).cache.clear()
    K.autotuner(K.double_).cache.clear()


def test_an_end_to_end_step_is_one_span_and_asks_for_no_flush_of_its_own(monkeypatch) -> None:
    seen = _record(monkeypatch)

    @contextual_autotune(objective="end_to_end", **EXACT)
    def op(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        K.add_one_[grid(N)](y, N)
        return y

    x = torch.arange(N, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(op(x), x + 1)
    assert "begin_step" not in seen and "launch" not in seen
    assert seen and set(seen) == {"step"}  # the span flushes itself unless flush_l2=False
    K.autotuner(K.add_one_).cache.clear()


def test_online_each_call_after_the_first_begins_with_the_steps_flush(monkeypatch) -> None:
    seen = _record(monkeypatch)
    calls = 0

    @contextual_autotune(online=True, precompile=False, **EXACT)
    def step(x: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        K.double_[grid(N)](x, N)
        return x

    x = torch.zeros(N, device=DEVICE)
    while True:
        step(x)
        if step._online is None:
            break
    assert calls == 9  # 3 configs x 3 slots, one slot per call
    assert seen.count("begin_step") == 8 and seen.count("launch") == 6
    step(x)  # warm: nothing
    assert seen.count("begin_step") == 8
    K.autotuner(K.double_).cache.clear()
