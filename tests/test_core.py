"""Single-process behaviour of the contextual autotuner, on real Triton kernels."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner
from triton.runtime.errors import InterpreterError

from tests import kernels as K
from tests.kernels import DEVICE, autotuner, chosen, grid
from triton_ctx_tune import CtxTuneError, InvalidOptionError, NoValidConfigError, autotuner_patch, contextual_autotune
from triton_ctx_tune.runtime import patch as ctx_patch
from triton_ctx_tune.runtime import resolver
from triton_ctx_tune.runtime.compat import interpret_mode, interpreter_numpy_note, torch_version_note

ROOT = Path(__file__).resolve().parent.parent

ORIGINAL_RUN = Autotuner.__dict__["run"]
FAST = dict(n_warmup=1, n_repeat=2, early_stop=False)  # 3 slots per config, every config measured fully


def ramp(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device=DEVICE)


def assert_call_closed() -> None:
    """After a call: nothing is attributed or open, and the only hold on the patch is the resident one."""
    assert resolver.current() is None and not resolver.open_calls
    assert ctx_patch.installs() == (1 if ctx_patch.resident else 0)


def jsonl(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]


def test_two_keys_of_one_kernel_each_tuned_on_its_own_arguments():
    executions = 0

    @contextual_autotune(is_dist=False, **FAST)
    def op(a: torch.Tensor, b: torch.Tensor):
        nonlocal executions
        executions += 1
        a, b = a.clone(), b.clone()
        K.add_one_[grid(a.numel())](a, a.numel())
        K.add_one_[grid(b.numel())](b, b.numel())
        return a, b

    a, b = ramp(100), ramp(40)
    ya, yb = op(a, b)
    torch.testing.assert_close(ya, a + 1)
    torch.testing.assert_close(yb, b + 1)
    # Both keys tuned in lockstep: 3 configs x 3 slots = 9 tuning executions, then the final one.
    assert executions == 10 == op.last_call.executions
    assert chosen(K.add_one_) == {(100, "torch.float32"): 64, (40, "torch.float32"): 16}
    at = autotuner(K.add_one_)
    assert at.best_config.kwargs["BLOCK"] in (16, 64)
    assert sorted(c.kwargs["BLOCK"] for c in at.configs_timings) == [16, 32, 64]


def test_in_place_kernel_applied_exactly_once_and_second_call_runs_once():
    executions = 0

    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        nonlocal executions
        executions += 1
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())  # in place
        K.add_one_[grid(h.numel())](h, h.numel())  # in place, another kernel
        return h

    x = ramp(96)
    torch.testing.assert_close(op(x), x * 2 + 1)
    assert executions == 10
    assert chosen(K.double_) == {(96, "torch.float32"): 32}
    assert chosen(K.add_one_) == {(96, "torch.float32"): 16}
    executions = 0
    torch.testing.assert_close(op(x), x * 2 + 1)
    assert executions == 1 and op.last_call.executions == 1 and op.last_call.tuned == []


def test_same_key_launched_twice_per_execution_takes_two_slots():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        K.double_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(64)
    torch.testing.assert_close(op(x), x * 4)
    assert op.last_call.executions == 9 // 2 + 1 + 1  # 9 slots at 2 per execution, then the final run
    assert chosen(K.double_) == {(64, "torch.float32"): 32}


def test_tuned_keys_are_plain_triton_cache_hits_afterwards():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        K.scale_copy[grid(x.numel())](x, y := torch.empty_like(x), x.numel(), 3.0)
        return y

    x = ramp(80)
    torch.testing.assert_close(op(x), x * 3)
    assert_call_closed()
    y = torch.empty_like(x)
    # Outside any tuning call this is vanilla Triton; a cache miss would benchmark with Triton's
    # own do_bench, which has no driver under the interpreter, so success proves the key format.
    K.scale_copy[grid(x.numel())](x, y, x.numel(), 3.0)
    torch.testing.assert_close(y, x * 3)
    assert chosen(K.scale_copy) == {(80, "torch.float32", "torch.float32"): 64}


@pytest.mark.parametrize("exc_type", [ValueError, KeyboardInterrupt])
def test_patch_restored_and_exception_propagates_unchanged(exc_type):
    seen_inside = []
    boom = exc_type("stop at execution 3")

    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        seen_inside.append(ctx_patch.is_installed())
        if len(seen_inside) == 3:
            raise boom
        h = x.clone()
        K.add_one_[grid(h.numel())](h, h.numel())
        return h

    with pytest.raises(exc_type) as info:
        op(ramp(50))
    assert info.value is boom
    assert seen_inside == [True, True, True]
    assert_call_closed()
    assert autotuner(K.add_one_).cache == {}  # nothing half-decided was handed to Triton


def test_patch_stays_resident_is_invisible_outside_calls_and_release_restores():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.add_one_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(30)
    op(x)
    assert ctx_patch.is_installed() and ctx_patch.resident
    assert_call_closed()
    # Outside any call the dispatcher is Triton's own run: a one-config kernel is launched by Triton
    # itself (which records best_config), and a key tuned by the call is a plain cache hit.
    at = autotuner(K.single_config_add_one_)
    at.best_config = None
    h = x.clone()
    K.single_config_add_one_[grid(30)](h, 30)
    torch.testing.assert_close(h, x + 1)
    assert at.best_config is at.configs[0] and at.cache == {}
    h = x.clone()
    K.add_one_[grid(30)](h, 30)
    torch.testing.assert_close(h, x + 1)
    assert op.last_call.executions == 10
    ctx_patch.release()
    assert Autotuner.__dict__["run"] is ORIGINAL_RUN and not ctx_patch.is_installed()
    torch.testing.assert_close(op(x), x + 1)
    assert op.last_call.executions == 1 and ctx_patch.resident  # warm: the first call made it resident again
    ctx_patch.release()
    with autotuner_patch():
        assert ctx_patch.is_installed()
        with autotuner_patch():  # nested installs share the patch
            assert ctx_patch.is_installed()
        assert ctx_patch.is_installed()
    assert Autotuner.__dict__["run"] is ORIGINAL_RUN


def test_nested_tuned_functions_join_the_outer_call():
    inner_runs = 0

    @contextual_autotune(**FAST)
    def inner(h: torch.Tensor):
        nonlocal inner_runs
        inner_runs += 1
        K.double_[grid(h.numel())](h, h.numel())

    @contextual_autotune(**FAST)
    def outer(x: torch.Tensor):
        h = x.clone()
        K.add_one_[grid(h.numel())](h, h.numel())
        inner(h)
        return h

    x = ramp(100)
    torch.testing.assert_close(outer(x), (x + 1) * 2)
    assert inner_runs == outer.last_call.executions == 10
    assert chosen(K.double_) == {(100, "torch.float32"): 32}
    assert chosen(K.add_one_) == {(100, "torch.float32"): 64}


@pytest.fixture
def serialized_interpreter(monkeypatch):
    """Triton's interpreter patches triton.language globals while a kernel runs, so two kernels
    interpreted at once in two threads break each other. Serialize the kernel bodies only;
    the tuning sessions still interleave between launches (the tuned functions pause there)."""
    from triton_ctx_tune.runtime.compat import interpret_mode

    if not interpret_mode():
        return
    from triton.runtime.interpreter import GridExecutor

    lock = threading.Lock()
    call = GridExecutor.__call__

    def locked_call(self, *args, **kwargs):
        with lock:
            return call(self, *args, **kwargs)

    monkeypatch.setattr(GridExecutor, "__call__", locked_call)


@contextlib.contextmanager
def own_stream() -> Iterator[None]:
    """On a GPU, the calling thread's launches on a stream of its own; on the CPU, nothing changes.

    Threads that share the default stream share its queue: another thread's declared costs
    (torch.cuda._sleep, tests/kernels.py) land between this thread's timing events (runtime/timing.py
    records them on the current stream) and can make a winning config measure 15 ms more. Entered
    before any tuning call starts, so runtime/streams.py (which notes the streams made current while a
    call re-executes, process-wide) notes none of these streams: no key is taken to overlap another
    thread's stream. The exits only make the default stream current again, which it never notes."""
    if DEVICE != "cuda":
        yield
        return
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # inputs made on the default stream are ready
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()  # the main thread reads the results on the default stream


def test_threads_tune_independently_and_plain_launches_are_not_captured(serialized_interpreter):
    x = ramp(100)
    autotuner(K.scale_copy).cache[(100, "torch.float32", "torch.float32")] = triton.Config({"BLOCK": 16})
    start = threading.Barrier(3)
    results: dict[str, object] = {}

    # Outside the timed slots, a real pause hands the interpreter to the other threads; the configs'
    # declared costs (tests/kernels.py) count on each thread's own clock (CPU) or stream (GPU) only.
    @contextual_autotune(**FAST)
    def op_a(x: torch.Tensor):
        h = x.clone()
        time.sleep(0.002)
        K.double_[grid(h.numel())](h, h.numel())
        return h

    @contextual_autotune(**FAST)
    def op_b(x: torch.Tensor):
        h = x.clone()
        time.sleep(0.002)
        K.add_one_[grid(h.numel())](h, h.numel())
        return h

    def run(name, fn):
        with own_stream():
            start.wait()
            try:
                results[name] = fn()
            except BaseException as e:  # noqa: BLE001 (reported below)
                results[name] = e

    def plain():
        outs = []
        for _ in range(20):
            y = torch.empty_like(x)
            K.scale_copy[grid(100)](x, y, 100, 2.0)  # cached key, vanilla path
            outs.append(y)
        return outs

    threads = [threading.Thread(target=run, args=("a", lambda: op_a(x))),
               threading.Thread(target=run, args=("b", lambda: op_b(x))),
               threading.Thread(target=run, args=("plain", plain))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    torch.testing.assert_close(results["a"], x * 2)
    torch.testing.assert_close(results["b"], x + 1)
    assert all(torch.equal(y, x * 2) for y in results["plain"])
    assert op_a.last_call.executions == op_b.last_call.executions == 10
    assert chosen(K.double_) == {(100, "torch.float32"): 32}
    assert chosen(K.add_one_) == {(100, "torch.float32"): 64}
    assert chosen(K.scale_copy) == {(100, "torch.float32", "torch.float32"): 16}  # never re-tuned
    assert_call_closed()


@pytest.mark.parametrize("kernel", [K.heur_inner_add_one_, K.heur_outer_add_], ids=["autotune-outside",
                                                                                    "heuristics-outside"])
def test_heuristics_stacked_either_way(kernel):
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        kernel[grid(h.numel())](h, h.numel())
        return h

    x = ramp(96)
    torch.testing.assert_close(op(x), x + 1)
    assert chosen(kernel) == {(96, "torch.float32"): 32}
    assert op.last_call.executions == 10


def test_early_config_prune_tunes_only_what_is_left():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.early_pruned_add_one_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(64)
    torch.testing.assert_close(op(x), x + 1)
    assert op.last_call.executions == 2 * 3 + 1  # two configs survive pruning
    assert sorted(c.kwargs["BLOCK"] for c in autotuner(K.early_pruned_add_one_).configs_timings) == [16, 32]
    assert chosen(K.early_pruned_add_one_) == {(64, "torch.float32"): 32}


def test_perf_model_top_k():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.modelled_add_one_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(64)
    torch.testing.assert_close(op(x), x + 1)
    assert sorted(c.kwargs["BLOCK"] for c in autotuner(K.modelled_add_one_).configs_timings) == [64, 128]
    assert chosen(K.modelled_add_one_) == {(64, "torch.float32"): 64}


def test_restore_value_leaves_the_input_changed_once():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        K.restored_add_one_[grid(x.numel())](x, x.numel())  # in place on the caller's tensor
        return x

    x = ramp(64)
    expected = x + 1
    op(x)
    torch.testing.assert_close(x, expected)
    assert chosen(K.restored_add_one_) == {(64, "torch.float32"): 32}


def test_reset_to_zero_accumulator_is_zeroed_before_the_final_launch():
    @contextual_autotune(**FAST)
    def op(src: torch.Tensor, acc: torch.Tensor):
        K.accumulate[grid(src.numel())](src, acc, src.numel())
        return acc

    src = ramp(64)
    acc = torch.zeros_like(src)
    op(src, acc)
    torch.testing.assert_close(acc, src)  # one accumulation, not one per tuning execution
    assert chosen(K.accumulate) == {(64, "torch.float32", "torch.float32"): 32}


def test_single_config_kernel_and_warmup_launches_are_not_tuned():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        compiled = K.add_one_.run(h, h.numel(), grid=grid(h.numel()), warmup=True)  # no slot, no effect
        assert len(compiled) == 3  # every config compiled
        K.single_config_add_one_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(64)
    torch.testing.assert_close(op(x), x + 1)
    assert op.last_call.executions == 1
    assert chosen(K.add_one_) == {}


def test_failing_config_is_excluded_and_function_keeps_running():
    outputs = []

    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.limited_add_one_[grid(h.numel())](h, h.numel(), LIMIT=64)
        outputs.append(h)
        return h

    x = ramp(128)
    torch.testing.assert_close(op(x), x + 1)
    assert op.last_call.executions == 4 * 3 + 1
    assert chosen(K.limited_add_one_) == {(128, "torch.float32"): 64}
    timings = {c.kwargs["BLOCK"]: t[0] for c, t in autotuner(K.limited_add_one_).configs_timings.items()}
    assert timings[128] == float("inf") and all(timings[b] < float("inf") for b in (16, 32, 64))
    # BLOCK 128 comes first, before any config was known to work: the execution that met the key ran
    # the next config that compiles (BLOCK 16), and BLOCK 128's later slots ran it too. No launch skipped.
    assert all(torch.equal(o, x + 1) for o in outputs)


def test_failing_config_in_the_middle_falls_back_to_a_working_one(tmp_path):
    outputs = []

    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.limited_mid_add_one_[grid(h.numel())](h, h.numel(), LIMIT=64)
        outputs.append(h)
        return h

    x = ramp(128)
    torch.testing.assert_close(op(x), x + 1)
    assert all(torch.equal(o, x + 1) for o in outputs)  # every slot of BLOCK 128 ran BLOCK 16 instead
    assert chosen(K.limited_mid_add_one_) == {(128, "torch.float32"): 64}
    events = jsonl(tmp_path)
    slots = [e for e in events if e["event"] == "slot" and e["config_index"] == 1]
    assert len(slots) == 3 and all(e["ran"] == 0 and e["failure"] for e in slots)
    # On a GPU precompilation finds the failure before any slot (and the launch confirms it); the interpreter
    # only finds it by running, in the slot or in the execution that met the key (whichever config was ready).
    (decision,) = [e for e in events if e["event"] == "decision"]
    reason = decision["local_failures"]["1"]
    assert "CompileTimeAssertionFailure" in reason or "InterpreterError" in reason


def test_no_valid_config_raises_one_clear_error():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.limited_add_one_[grid(h.numel())](h, h.numel(), LIMIT=8)
        return h

    with pytest.raises(NoValidConfigError) as info:
        op(ramp(64))
    msg = str(info.value)
    assert "limited" not in msg or "_limited" in msg
    assert "_limited" in msg and "(64, 'torch.float32')" in msg
    for block in (16, 32, 64, 128):
        assert f"BLOCK={block}," in msg
    # One line per distinct reason, with how many configs (and ranks) gave it: here all four, one reason.
    assert "\n  4 x InterpreterError: AssertionError('BLOCK over LIMIT') [rank 0]\n" in msg
    assert_call_closed()


def test_real_kernel_error_propagates():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        K.add_one_[grid(x.numel())](x, x.numel(), BLOCK=16)  # conflicts with the tuned meta-parameter
        return x

    with pytest.raises(ValueError, match="Conflicting meta-parameters: BLOCK"):
        op(ramp(16))
    assert_call_closed()


def test_key_launched_only_once_is_an_error_not_a_hang():
    executions = 0

    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        nonlocal executions
        executions += 1
        if executions == 1:
            K.add_one_[grid(x.numel())](x.clone(), x.numel())
        return x

    with pytest.raises(CtxTuneError, match="was launched in an earlier execution"):
        op(ramp(16))
    assert executions == 2


def test_logs_record_every_slot_and_decision(tmp_path):
    @contextual_autotune(**FAST, stat="min")
    def op(x: torch.Tensor):
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        return h

    op(ramp(64))
    events = jsonl(tmp_path)
    assert [e["event"] for e in events].count("call") == 1
    slots = [e for e in events if e["event"] == "slot"]
    assert len(slots) == 9
    assert sum(1 for e in slots if e["timed"]) == 6 and all(e["ms"] > 0 for e in slots if e["timed"])
    (decision,) = [e for e in events if e["event"] == "decision"]
    assert decision["winner"] == 1 and decision["winner_config"].startswith("BLOCK=32,")
    assert decision["stat"] == "min" and decision["world"] == 1 and len(decision["reduced"]) == 3
    reduced = decision["reduced"]
    assert reduced[1] < reduced[0] < reduced[2]  # each config's declared cost decides its place
    text = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "decision kernel=double_ key=(64, 'torch.float32') winner=config#1 {BLOCK=32" in text


def test_bare_decorator_and_bad_options():
    @contextual_autotune
    def op(x: torch.Tensor):
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(32)
    torch.testing.assert_close(op(x), x * 2)
    # Defaults: early stopping screens each config with 1 warm-up + 1 timed slot; the two that
    # cost more are over 1.5x the best, so BLOCK 32 wins at once: 6 executions, then the final one.
    assert op.last_call.executions == 3 * 2 + 1
    assert chosen(K.double_) == {(32, "torch.float32"): 32}
    with pytest.raises(InvalidOptionError, match="n_repeat=0 is not valid: expected an int >= 1"):
        contextual_autotune(n_repeat=0)
    with pytest.raises(InvalidOptionError, match="reduce='sum'"):
        contextual_autotune(reduce="sum")


@pytest.mark.parametrize("precompile, executions", [(True, 6 + 2 + 1 + 1), (False, 6 + 2 + 2 + 1 + 1)])
def test_early_stopping_screens_then_measures_the_survivors(tmp_path, precompile, executions):
    @contextual_autotune(n_warmup=2, n_repeat=3, early_stop=1.5, precompile=precompile)
    def op(x: torch.Tensor):
        h = x.clone()
        K.screened_add_one_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(64)
    torch.testing.assert_close(op(x), x + 1)
    # Screening: 3 configs x (1 warm-up + 1 timed). BLOCK 64 is 2x the best and is dropped; 16 and 32 get their
    # last warm-up unless they were precompiled, then a first round of timed slots. 32 is 20% behind 16 there,
    # more than RACE_BAND: it leaves, and 16 alone takes the second round. Then the final run.
    assert op.last_call.executions == executions
    assert chosen(K.screened_add_one_) == {(64, "torch.float32"): 16}
    events = jsonl(tmp_path)
    (screen,) = [e for e in events if e["event"] == "screen"]
    assert screen["kept"] == [0, 1] and screen["factor"] == 1.5
    (decision,) = [e for e in events if e["event"] == "decision"]
    assert decision["screened_out"] == [2] and decision["winner"] == 0 and decision["raced_out"] == [1]
    (raced,) = [e for e in events if e["event"] == "lockstep-round"]
    assert (raced["stay"], raced["out"], raced["rounds_left"]) == ([0], [1], 0)
    assert 1.1 < raced["luckiest"][1] / raced["luckiest"][0] < 1.5  # 2.4 against 2 SLOW_MS
    timed = {i: sum(1 for e in events if e["event"] == "slot" and e["config_index"] == i and e["timed"])
             for i in range(3)}
    assert timed == {0: 3, 1: 2, 2: 1}
    assert [e["event"] for e in events].count("precompile") == (1 if precompile else 0)


def test_early_stop_option_and_environment(monkeypatch):
    from triton_ctx_tune.options import TuneOptions

    assert TuneOptions().resolved_early_stop() == 1.5
    assert TuneOptions(early_stop=False).resolved_early_stop() is None
    assert TuneOptions(early_stop=2).resolved_early_stop() == 2.0
    monkeypatch.setenv("TRITON_CTX_TUNE_EARLY_STOP", "off")
    assert TuneOptions().resolved_early_stop() is None
    monkeypatch.setenv("TRITON_CTX_TUNE_EARLY_STOP", "1.25")
    assert TuneOptions().resolved_early_stop() == 1.25
    monkeypatch.setenv("TRITON_CTX_TUNE_EARLY_STOP", "0.5")
    with pytest.raises(InvalidOptionError, match="TRITON_CTX_TUNE_EARLY_STOP='0.5'"):
        TuneOptions().resolved_early_stop()
    with pytest.raises(InvalidOptionError, match="early_stop=1.0 is not valid"):
        contextual_autotune(early_stop=1.0)
    with pytest.raises(InvalidOptionError, match="bogus=1 is not valid: expected one of the known options"):
        contextual_autotune(bogus=1)



NUMPY_SCALAR_ERROR = "only 0-dimensional arrays can be converted to Python scalars"  # numpy >= 2.4's words


def _interpreter_error(cause: BaseException) -> InterpreterError:
    """Raised as Triton's interpreter raises what a kernel body raised."""
    try:
        try:
            raise cause
        except Exception as e:
            raise InterpreterError(repr(e)) from e
    except InterpreterError as err:
        return err


@triton.jit
def _add_one_in_chunks(x_ptr, n, BLOCK: tl.constexpr):
    # range() over a scalar tensor: the interpreter makes it an int through tensor.__index__.
    for i in range(0, tl.cdiv(n, BLOCK)):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def test_scalar_tensor_index_runs_or_names_the_numpy_fix():
    @contextual_autotune(**FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        _add_one_in_chunks[(1,)](h, h.numel(), BLOCK=16)  # the user's own, untuned kernel
        return h

    x = ramp(40)
    if not interpret_mode() or interpreter_numpy_note(_interpreter_error(TypeError(NUMPY_SCALAR_ERROR))) is None:
        torch.testing.assert_close(op(x), x * 2 + 1)
        return
    # triton 3.4 to 3.6 under the interpreter with numpy >= 2.4: Triton's own error, and the fix.
    with pytest.raises(InterpreterError, match="only 0-dimensional arrays") as info:
        op(x)
    (note,) = info.value.__notes__
    assert "pip install 'numpy<2.4'" in note and "triton>=3.7" in note and "triton-lang/triton#9171" in note


def test_numpy_note_only_for_the_versions_that_have_the_bug():
    err = _interpreter_error(TypeError(NUMPY_SCALAR_ERROR))
    for triton_version, numpy_version in (("3.4.0", "2.4.6"), ("3.6.0", "2.4.0")):
        note = interpreter_numpy_note(err, triton_version, numpy_version)
        assert note == (f"triton_ctx_tune: triton {triton_version}'s interpreter cannot run this kernel with numpy "
                        f"{numpy_version}: it turns a 1-element array into an int, an error since numpy 2.4 "
                        "(triton-lang/triton#9171, fixed in triton 3.7). Install numpy<2.4 (pip install "
                        "'numpy<2.4') or triton>=3.7.")
    for triton_version, numpy_version in (("3.7.0", "2.4.6"), ("3.9.0", "2.4.6"), ("3.4.0", "2.3.5")):
        assert interpreter_numpy_note(err, triton_version, numpy_version) is None
    assert interpreter_numpy_note(_interpreter_error(TypeError("unsupported operand")), "3.4.0", "2.4.6") is None
    assert interpreter_numpy_note(TypeError(NUMPY_SCALAR_ERROR), "3.4.0", "2.4.6") is None


def test_a_torch_older_than_2_8_is_named_with_the_hang_it_risks_and_the_fix():
    note = torch_version_note("2.4.1+cu121")
    assert note == ("triton_ctx_tune needs torch 2.8 or newer; found 2.4.1+cu121. With an older torch a job can hang "
                    "in torch.distributed.destroy_process_group() at its end (gloo's destructor holds the GIL that its "
                    "own thread needs: pytorch/pytorch#154976, fixed in torch 2.8). Upgrade: pip install "
                    "'torch>=2.8'.")
    assert torch_version_note("2.7.1") is not None
    for supported in ("2.8.0+cu128", "2.11.0+cu130", "2.13.0+cpu", "2.10.0a0+git1234", "3.0.0"):
        assert torch_version_note(supported) is None
    # Importing the package says so, once, in a process whose torch reports 2.4.1.
    code = ("import warnings, torch; torch.__version__ = '2.4.1'; warnings.simplefilter('always'); "
            "import triton_ctx_tune")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_CTX_TUNE_COMPILE_WORKERS": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("needs torch 2.8 or newer; found 2.4.1") == 1, proc.stderr[-2000:]


def test_the_fast_tuning_key_is_tritons_key_for_every_way_of_passing_arguments():
    from tests.kernels import scale_copy
    from triton_ctx_tune.runtime.compat import triton_key, tuning_key

    at = autotuner(scale_copy)
    src, dst = torch.ones(8, device=DEVICE), torch.ones(8, device=DEVICE, dtype=torch.float16)
    launches = [((src, dst, 8, 2.0), {"grid": None, "warmup": False}),
                ((src, dst), {"n": 8, "scale": 2.0}),  # parameters by name: Triton's own path
                ((src,), {"dst_ptr": dst, "n": 8, "scale": 2.0}),
                ((src, dst, 8), {"scale": 2.0, "num_warps": 4})]
    keys = [tuning_key(at, args, kwargs) for args, kwargs in launches]
    assert keys == [triton_key(at, args, kwargs) for args, kwargs in launches]
    assert keys[0] == (8, "torch.float32", "torch.float16")
    # Again, once every dtype's spelling is remembered, and with a NumPy array among the arguments.
    import numpy as np
    again = [((src, dst.to(torch.int32), 8, 2.0), {}), ((src, np.zeros(3, dtype=np.int8), 8, 2.0), {})]
    assert [tuning_key(at, a, k) for a, k in again] == [triton_key(at, a, k) for a, k in again] == [
        (8, "torch.float32", "torch.int32"), (8, "torch.float32", "int8")]


def test_a_warm_launch_runs_the_config_it_finds_even_when_configs_are_rebuilt():
    """The warm path keeps each tuned config's launch keywords; a new Config object at the same key
    (the cache edited, or a config rebuilt with other values) must launch its own values."""
    from tests.kernels import add_one_

    at = autotuner(add_one_)
    K.reset_caches()
    launched: list[int] = []

    def one_program(meta: dict) -> tuple[int]:
        launched.append(meta["BLOCK"])
        return (1,)

    @contextual_autotune(cache=False, log_dir=False, quiet=True)
    def op(x: torch.Tensor) -> torch.Tensor:
        add_one_[one_program](x, x.numel())
        return x

    key = (120, "torch.float32")
    op(torch.zeros(120, device=DEVICE))  # tunes: BLOCK 64 for n >= 100
    assert chosen(add_one_) == {key: 64}
    launched.clear()
    y = op(torch.zeros(120, device=DEVICE))
    assert launched == [64] and op.last_call.executions == 1 and y.sum().item() == 64
    at.cache[key] = triton.Config({"BLOCK": 16}, num_warps=4)
    launched.clear()
    y = op(torch.zeros(120, device=DEVICE))
    assert launched == [16] and op.last_call.executions == 1 and y.sum().item() == 16  # one program of BLOCK 16
    K.reset_caches()


# A config's first launch on a rank pays one-off host work (on a GPU, while the GPU waits: the span counts it).
# BLOCK 32 spends 20 ms a launch and 40 more on its first; BLOCK 64 spends 25 ms. With no warm-up, BLOCK 32's
# only sample was once its first launch (60 ms) and BLOCK 64 won; its first launch now runs untimed (issue 35).
_first_launches: list[int] = []


def _first_is_slow(block: int, ms: float, first_extra: float) -> Callable[[dict], None]:
    def hook(nargs: dict) -> None:
        extra = first_extra if block not in _first_launches else 0.0
        _first_launches.append(block)
        K.spend(ms + extra)
    return hook


_first_kernel = triton.autotune(
    configs=[triton.Config({"BLOCK": 64}, num_warps=4, pre_hook=_first_is_slow(64, 25.0, 0.0)),
             triton.Config({"BLOCK": 32}, num_warps=4, pre_hook=_first_is_slow(32, 20.0, 40.0))],
    key=["n"])(triton.jit(K.double_.fn.fn))


def test_a_configs_first_launch_on_a_rank_is_never_its_timed_sample():
    _first_launches.clear()

    @contextual_autotune(n_warmup=0, n_repeat=1, early_stop=False, cache=False)
    def op(x: torch.Tensor) -> torch.Tensor:
        _first_kernel[grid(x.numel())](x, x.numel())
        return x

    op(torch.ones(64, device=DEVICE))
    assert chosen(_first_kernel) == {(64, "torch.float32"): 32}
    # Each config ran untimed before its timed slot (BLOCK 64, config 0, as the first execution's stand-in).
    assert _first_launches.count(64) >= 2 and _first_launches.count(32) >= 2


def test_a_timed_launch_waits_twice_the_hosts_recent_launch_time_on_the_gpu(monkeypatch, tmp_path):
    """Each timed slot's span starts after a GPU sleep sized from the host's recent launch spans
    (runtime/timing.HostLead), so a host slower than the GPU (a config hook, a node busy compiling) stays
    out of the sample. On the CPU the host clock ignores the sleep: this checks the sizes asked for."""
    from triton_ctx_tune.runtime import timing

    asked: list[float] = []
    real_start = timing.HostTimer.start

    def start(self: timing.HostTimer, span: str, head_start_s: float = 0.0) -> float:
        asked.append(head_start_s)
        return real_start(self, span, head_start_s)

    monkeypatch.setattr(timing.HostTimer, "start", start)
    hook_s = 4e-4
    kernel = triton.autotune(configs=[triton.Config({"BLOCK": b}, pre_hook=K.busy_host(hook_s)) for b in (16, 32)],
                             key=["n"])(triton.jit(K.add_one_.fn.fn))

    # Without a confirmation: two configs of one cost may come out close enough to be re-timed, in more slots.
    @contextual_autotune(**FAST, confirm=False)
    def op(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        kernel[grid(y.numel())](y, y.numel())
        return y

    torch.testing.assert_close(op(ramp(64)), ramp(64) + 1)
    # 2 configs x 2 timed slots. The first comes before any launch of a loaded binary (a first launch loads
    # it, which is no measure of the next), so it gets the default; the others see the hook's spans.
    # The second follows a step of the hook's 0.4 ms at least, long after the first one's 0.1 ms sleep ran out.
    # (A later one may find part of the last sleep still queued, and sleep only the rest: the next test.)
    assert len(asked) == 4 and asked[0] == timing.HostLead.FIRST_S, asked
    assert 2 * hook_s < asked[1] <= timing.HostLead.MAX_S and all(0 <= s <= timing.HostLead.MAX_S for s in asked)
    events = [e for e in jsonl(tmp_path) if e["event"] == "slot" and e["timed"]]
    assert [e["lead_ms"] for e in events] == pytest.approx([s * 1e3 for s in asked], abs=1e-4)


def test_the_gpu_lead_is_twice_the_median_host_span_less_what_queued_sleeps_still_cover():
    from triton_ctx_tune.runtime import timing

    lead = timing.HostLead()
    assert lead.take(now=10.0) == timing.HostLead.FIRST_S  # nothing measured yet
    for span in (1e-4, 3e-4, 2e-4, 5e-2):  # a stall does not move the median
        lead.note(span)
    want = 2 * 2.5e-4 + 2e-5
    assert lead.take(now=20.0) == pytest.approx(want)  # the GPU ran out of sleeps long ago
    # 0.2 ms later the GPU still has 0.32 ms of that sleep to run: it sleeps only the rest of the lead
    assert lead.take(now=20.0002) == pytest.approx(2e-4)
    assert lead.take(now=20.0002) == 0.0  # queued right behind: the sleeps ahead cover all of it
    for _ in range(8):
        lead.note(5e-3)
    assert lead.take(now=30.0) == timing.HostLead.MAX_S


def test_an_end_to_end_head_start_covers_the_hosts_runs_less_the_gpus_work_before_the_last():
    from triton_ctx_tune.runtime import timing

    # all-gather + GEMM as tuned on 2 H200s: 2 ms of host work and 0.6 ms of GPU work per run, 3 runs.
    # The host has enqueued run 3 after 3 x 2 ms (x 1.25); the GPU reaches it after the sleep and 2 runs.
    assert timing.head_start(2e-3, 3, 6e-4) == pytest.approx(1.25 * 6e-3 - 2 * 6e-4 + 5e-5)
    assert timing.head_start(2e-3, 3, 0.0) == pytest.approx(1.25 * 6e-3 + 5e-5)  # no sample yet: the host's alone
    # A GPU slower than the host needs no more than one run's host time ahead of it.
    assert timing.head_start(1e-3, 3, 5e-3) == pytest.approx(1.25e-3 + 5e-5)
    assert timing.head_start(1e-2, 3, 0.0) == timing.HEAD_START_MAX_S


def test_while_a_call_tunes_the_collector_runs_between_steps_only_and_is_back_on_after_every_exit():
    """runtime/collector.py: automatic collection is off for a tuning call's executions (a full collection's pause
    would land in a sample or a budget), the young generations are collected between steps, so each execution's
    cycles are freed a step later, and the collector is back on when the call ends, as it ends. A warm call
    leaves it alone, and so does a call in a program that turned it off."""
    import gc
    import weakref

    kernel = triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"])(
        triton.jit(K.add_one_.fn.fn))
    enabled: list[bool] = []
    cycles: list[weakref.ref] = []
    alive: list[int] = []
    kept: list[list[list[int]]] = []

    class Node:
        pass

    @contextual_autotune(**FAST, confirm=False)  # (no re-timing of near-ties: 7 executions per key, always)
    def op(x: torch.Tensor, fail: bool = False) -> torch.Tensor:
        enabled.append(gc.isenabled())
        alive.append(sum(r() is not None for r in cycles))  # the cycles of earlier executions still in memory
        node = Node()
        node.me = node  # garbage that only the cyclic collector frees
        cycles.append(weakref.ref(node))
        kept.append([[] for _ in range(gc.get_threshold()[0] + 100)])  # enough new objects to call for a collection
        y = x.clone()
        kernel[grid(y.numel())](y, y.numel())
        if fail and len(enabled) > 2:
            raise RuntimeError("the function's own error")
        return y

    assert gc.isenabled()
    torch.testing.assert_close(op(ramp(64)), ramp(64) + 1)
    # The first execution started warm, before its first launch made it a tuning call; every later one is off.
    assert enabled == [True] + [False] * 6, enabled
    # Each execution makes more new objects than the collector's first threshold, so each step boundary's young
    # collection frees the cycles made before it: never more than the last one is left in memory (with the
    # collector simply off, the 7th execution would find all 6 before it).
    assert len(alive) == 7 and max(alive) <= 1, alive
    assert gc.isenabled()
    enabled.clear()
    op(ramp(64))  # warm: every key is tuned
    assert enabled == [True] and gc.isenabled()
    enabled.clear()
    with pytest.raises(RuntimeError, match="the function's own error"):
        op(ramp(32), fail=True)
    assert enabled == [True, False, False] and gc.isenabled()
    gc.disable()  # the program's own choice: the call neither collects between steps nor turns it back on
    try:
        enabled.clear()
        cycles.clear()
        alive.clear()
        op(ramp(16))
        assert enabled == [False] * 7 and alive == list(range(7)) and not gc.isenabled()
    finally:
        gc.enable()
