"""Precompilation overlaps the execution that meets the keys: it waits for one config of a key, not for all.

Under the interpreter nothing is compiled, but precompilation's compile-only launches
(run(warmup=True)) go through heuristics() on their way to the compiler, in the compile threads.
Here kernel A's compile-only launches, all but BLOCK 16's, wait until kernel B's have begun. B is
launched after A in the function, so if A's precompilation held the execution up until every
config had compiled (as it did before: compile every config of a key, then run its first slot), or
until a particular slow one had, B's would never begin while A's waited: A's configs would run into
the compile timeout and fail.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels import DEVICE, SLOW_MS, autotuner, block_configs, chosen, grid
from triton_ctx_tune import contextual_autotune

B_COMPILING = threading.Event()
A_WAITED: list[bool] = []


def _a_waits_for_b(args: dict[str, Any]) -> int:
    if args.get("warmup") and args["BLOCK"] != 16:
        A_WAITED.append(B_COMPILING.wait(20))
    return 0


def _b_compiling(args: dict[str, Any]) -> int:
    if args.get("warmup"):
        B_COMPILING.set()
    return 0


@triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 64: 2 * SLOW_MS}), key=["n"])
@triton.heuristics({"TAG": _a_waits_for_b})
@triton.jit
def kernel_a(x_ptr, n, BLOCK: tl.constexpr, TAG: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 32: 2 * SLOW_MS}), key=["n"])
@triton.heuristics({"TAG": _b_compiling})
@triton.jit
def kernel_b(x_ptr, n, BLOCK: tl.constexpr, TAG: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def test_keys_met_in_one_execution_compile_side_by_side(tmp_path):
    executions = 0

    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, cache=False, log_dir=tmp_path,
                         compile_timeout_s=10.0, compile_workers=0)
    def op(x: torch.Tensor) -> torch.Tensor:
        nonlocal executions
        executions += 1
        h = x.clone()
        kernel_a[grid(h.numel())](h, h.numel())
        kernel_b[grid(h.numel())](h, h.numel())
        return h

    x = torch.arange(96, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(op(x), (x + 1) * 2)
    key = (96, "torch.float32")
    assert chosen(kernel_a) == {key: 32} and chosen(kernel_b) == {key: 64}
    # A's compiles of BLOCK 32 and 64 waited for B's, and B's began: nothing timed out. Meanwhile the
    # execution ran BLOCK 16, the one config of A ready by then.
    assert A_WAITED == [True, True]
    events = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    pre = [e for e in events if e["event"] == "precompile"]
    assert [(e["kernel"], e["mine"], e["failures"]) for e in pre] == [("kernel_a", [0, 1, 2], {}),
                                                                       ("kernel_b", [0, 1, 2], {})]
    assert pre[0]["ran_meanwhile"] == [0] and len(pre[1]["ran_meanwhile"]) == 1
    # Per key 3 configs x (1 warm-up + 2 timed) slots, one launch each per execution, both keys side
    # by side (the step that met them ran a ready config in their first warm-up slot); the final run.
    assert executions == 9 + 1
    # The first step's slots were logged once it had gathered the compiles: no slot preceded them.
    first_slot = next(i for i, e in enumerate(events) if e["event"] == "slot")
    assert all(events.index(e) < first_slot for e in pre)
    assert [e["event"] for e in events if e["event"] in ("decision",)] == ["decision", "decision"]
    for k in (kernel_a, kernel_b):
        autotuner(k).cache.clear()


def test_when_the_first_config_fails_the_execution_that_met_the_key_runs_the_next_one(tmp_path):
    from tests.kernels import limited_add_one_

    results: list[torch.Tensor] = []

    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, cache=False, log_dir=tmp_path)
    def op(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        limited_add_one_[grid(h.numel())](h, h.numel(), LIMIT=64)
        results.append(h)
        return h

    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(op(x), x + 1)
    assert chosen(limited_add_one_) == {(100, "torch.float32"): 64}
    # BLOCK 128 cannot compile (under the interpreter: cannot run). The first execution's launch ran
    # another config, so even that execution's result is whole; no slot tried BLOCK 128 again.
    torch.testing.assert_close(results[0], x + 1)
    events = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    (decision,) = [e for e in events if e["event"] == "decision"]
    assert "BLOCK over LIMIT" in decision["local_failures"]["0"]  # found compiling on a GPU, running here
    first, *rest = [e for e in events if e["event"] == "slot" and e["config_index"] == 0]
    assert first["step"] == 1 and not first["timed"] and first["ran"] not in (None, 0)
    assert rest and all(e["failure"].startswith("skipped") for e in rest)
    autotuner(limited_add_one_).cache.clear()


def test_the_compiler_hash_every_compile_keys_on_is_primed_once():
    """Threads that start compiling together would each compute Triton's triton_key() (a hash of
    libtriton): precompile computes it first, once. Found in this Triton, and cached by it."""
    import importlib

    from triton_ctx_tune.runtime.compat import prime_compiler_hash

    assert prime_compiler_hash()
    homes = [importlib.import_module(m) for m in ("triton.runtime.cache", "triton.compiler.compiler")]
    (key,) = {m.triton_key for m in homes if hasattr(m, "triton_key")}
    assert key.cache_info().currsize == 1
    hits = key.cache_info().hits
    prime_compiler_hash()
    assert key.cache_info().hits == hits + 1


def _fresh_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3, mask=offs < n)


def test_under_the_interpreter_precompile_rewrites_the_kernel_on_the_calling_thread():
    """CPython 3.11's parser is not safe on two threads at once: the interpreter's AST rewrite of a kernel
    happens on the thread that met the key, before the compile threads start (seen with Triton 3.4)."""
    from triton_ctx_tune.runtime.compat import interpret_mode, prime_interpreter

    kernel = triton.autotune(configs=block_configs([16, 32]), key=["n"])(triton.jit(_fresh_kernel))
    if not interpret_mode():
        assert not prime_interpreter(autotuner(kernel))  # compiled Triton: nothing to rewrite
        return
    from triton.runtime.interpreter import InterpretedFunction

    assert _fresh_kernel not in InterpretedFunction.rewritten_fn
    assert prime_interpreter(autotuner(kernel))
    assert _fresh_kernel in InterpretedFunction.rewritten_fn

def _running_work(hold: threading.Event, running: list[int], lock: threading.Lock):
    def work(i: int) -> int:
        with lock:
            running.append(i)
        hold.wait(20)
        return i * 10
    return work


def test_a_keys_first_config_compiles_at_once_while_other_keys_fill_every_place():
    from triton_ctx_tune.compile.precompile import CompileGate, run_with_deadline

    gate, hold, lock, running = CompileGate(), threading.Event(), threading.Lock(), []
    work = _running_work(hold, running, lock)
    outcomes: dict[str, Any] = {}
    # Key A: six configs, none of them first (its first is done), on six threads; width 3 leaves 2 places.
    a = threading.Thread(target=lambda: outcomes.update(
        a=run_with_deadline([0, 1, 2, 3, 4, 5], work, 6, 30, gate=lambda i: gate.enter(False, 3))))
    a.start()
    deadline = time.monotonic() + 10
    while len(running) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert sorted(running) == [0, 1]  # the gate holds A's other four back
    # Key B, met now: its first config (10) starts although every place is taken; its second waits.
    b = threading.Thread(target=lambda: outcomes.update(
        b=run_with_deadline([10, 11], work, 2, 30, gate=lambda i: gate.enter(i == 10, 3))))
    b.start()
    while 10 not in running and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert sorted(running) == [0, 1, 10]
    hold.set()
    a.join(20), b.join(20)
    assert outcomes["a"] == ({i: i * 10 for i in range(6)}, []) and outcomes["b"] == ({10: 100, 11: 110}, [])
    assert sorted(running) == [0, 1, 2, 3, 4, 5, 10, 11]


def test_a_compile_abandoned_at_its_deadline_gives_its_place_back():
    from triton_ctx_tune.compile.precompile import CompileGate, run_with_deadline

    gate, hold, lock, running = CompileGate(), threading.Event(), threading.Lock(), []
    start = time.monotonic()
    # Width 2: one place. Both configs hang; each is abandoned after 0.3 s, and the second one gets the
    # place the first gave back (else it would wait for it forever and the call would never return).
    done, late = run_with_deadline([0, 1], _running_work(hold, running, lock), 2, 0.3,
                                   gate=lambda i: gate.enter(False, 2))
    assert (done, late, sorted(running)) == ({}, [0, 1], [0, 1])
    assert time.monotonic() - start < 5
    hold.set()


def test_the_rest_compile_smallest_key_first():
    from triton_ctx_tune.compile.precompile import CompileGate

    gate, order = CompileGate(), []
    holder = gate.enter(False, 2, size=48)  # width 2: the one place is taken

    def wait(name: str, size: int) -> None:
        release = gate.enter(False, 2, size=size)
        order.append(name)
        release()

    big = threading.Thread(target=wait, args=("big", 48))
    big.start()
    time.sleep(0.2)  # the big key asked first
    small = threading.Thread(target=wait, args=("small", 6))
    small.start()
    time.sleep(0.2)
    assert order == []
    holder()
    big.join(10), small.join(10)
    assert order == ["small", "big"]  # a key of 6 configs is not held behind one of 48


def test_a_large_keys_last_config_is_not_held_behind_a_small_key_met_after_it():
    """The gate counts what each key has left waiting, not its size: the MLP op's GEMM key (18 configs) had one
    config left to start when GELU (8 configs) was met; GELU's seven went first and that config ended the GEMM
    key's compile 0.1 s after the rest (RESULTS.md section 50)."""
    from triton_ctx_tune.compile.precompile import CompileGate

    gate, order = CompileGate(), []
    holder = gate.enter(False, 2, size=18, key="gemm")  # width 2: the one place is taken

    def wait(name: str, size: int, key: str) -> None:
        release = gate.enter(False, 2, size=size, key=key)
        order.append(name)
        release()

    threads = [threading.Thread(target=wait, args=(f"gelu{i}", 8, "gelu")) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while sum(gate._queued.values()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    last = threading.Thread(target=wait, args=("gemm", 18, "gemm"))  # asks after all three
    last.start()
    while sum(gate._queued.values()) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert order == [] and dict(gate._queued) == {(0, "gelu"): 3, (0, "gemm"): 1}
    holder()
    for t in [*threads, last]:
        t.join(10)
    assert order[0] == "gemm" and sorted(order[1:]) == ["gelu0", "gelu1", "gelu2"]
    assert gate._rest == 0 and not gate._waiting and not gate._queued


def test_a_keys_configs_not_yet_queued_count_as_left():
    """A batch asks for places on at most one thread per worker, so a large key that holds most places has few
    configs queued at any time. Its announced configs count as left too: FLA's chunk_fwd_kernel_h (48 configs, about
    25 not yet placed, 1 queued) went ahead of chunk_bwd_kernel_dqkwg's 5, met after it (RESULTS.md section 51)."""
    from triton_ctx_tune.compile.precompile import CompileGate, run_with_deadline

    gate, lock, order = CompileGate(), threading.Lock(), []
    release = {i: threading.Event() for i in [*range(10), 20, 21, 22]}

    def work(i: int) -> int:
        with lock:
            order.append(i)
        release[i].wait(20)
        return i

    def batch(key: str, tasks: list[int], threads: int) -> None:
        gate.expect(len(tasks), len(tasks), key)
        try:
            run_with_deadline(tasks, work, threads, 30, gate=lambda i: gate.enter(False, 3, size=len(tasks), key=key))
        finally:
            gate.expect(-0, len(tasks), key)  # (every task asked: nothing to take back)

    def until(check) -> None:
        deadline = time.monotonic() + 10
        while not check() and time.monotonic() < deadline:
            time.sleep(0.01)

    # Key h: 10 configs on 3 threads, width 3 (2 places): 0 and 1 run, 2 is queued, 7 never asked yet.
    h = threading.Thread(target=batch, args=("h", list(range(10)), 3))
    h.start()
    until(lambda: len(order) == 2 and gate._queued[0, "h"] == 1)
    assert order == [0, 1] and gate._expected[0, "h"] == 7
    # Key dq, met now: 3 configs, all queued. h has 8 left (1 queued, 7 announced), dq 3: dq goes first.
    dq = threading.Thread(target=batch, args=("dq", [20, 21, 22], 3))
    dq.start()
    until(lambda: gate._queued[0, "dq"] == 3)
    release[0].set()
    until(lambda: len(order) == 3)
    time.sleep(0.1)
    assert order[2] == 20  # (counted by what was queued, h's 1 went first)
    for event in release.values():
        event.set()
    h.join(20), dq.join(20)
    assert sorted(order) == [*range(10), 20, 21, 22]
    assert gate._rest == 0 and not gate._waiting and not gate._queued and not gate._expected


def test_a_batch_that_ends_early_takes_back_the_configs_that_never_asked():
    from triton_ctx_tune.compile.precompile import CompileGate

    gate = CompileGate()
    gate.expect(5, 5, "k")
    places = [gate.enter(False, 3, size=5, key="k") for _ in range(2)]  # 2 asked and were placed
    assert dict(gate._expected) == {(0, "k"): 3}
    gate.expect(-3, 5, "k")
    for place in places:
        place()
    assert not gate._expected and not gate._queued and gate._rest == 0


def test_a_keys_configs_from_other_ranks_shares_wait_behind_and_count_apart():
    """Other ranks' configs a rank's workers take once its own share is done (size + _LATER) wait behind every own
    config, and are counted apart: key b's 3 of them do not put its own config behind key a's 2."""
    from triton_ctx_tune.compile.precompile import CompileGate

    gate, order = CompileGate(), []
    holder = gate.enter(False, 2, size=4, key="a")
    later = CompileGate._LATER

    def wait(name: str, size: int, key: str) -> None:
        release = gate.enter(False, 2, size=size, key=key)
        order.append(name)
        release()

    asks = [("b-later0", 4 + later, "b"), ("b-later1", 4 + later, "b"), ("b-later2", 4 + later, "b"),
            ("a0", 4, "a"), ("a1", 4, "a"), ("b0", 4, "b")]
    threads = []
    deadline = time.monotonic() + 10
    for n, ask in enumerate(asks, 1):
        threads.append(threading.Thread(target=wait, args=ask))
        threads[-1].start()
        while sum(gate._queued.values()) < n and time.monotonic() < deadline:
            time.sleep(0.01)
    assert dict(gate._queued) == {(1, "b"): 3, (0, "a"): 2, (0, "b"): 1}
    holder()
    for t in threads:
        t.join(10)
    assert order[0] == "b0" and sorted(order[1:3]) == ["a0", "a1"] and sorted(order[3:]) == ["b-later0", "b-later1",
                                                                                          "b-later2"]
    assert gate._rest == 0 and not gate._waiting and not gate._queued and gate._first is None


def test_a_config_waiting_for_another_keys_compile_steps_out_of_its_place():
    """A config whose binary another key compiles waits for it outside the gate: holding its place, two keys that
    split a rung's binaries filled the gate with waiters, and the configs that would compile waited behind them."""
    from triton_ctx_tune.compile.precompile import CompileGate

    gate, order = CompileGate(), []
    waiter = gate.enter(False, 2, size=3)  # width 2: the one place
    queued = threading.Event()

    def other() -> None:
        queued.set()
        release = gate.enter(False, 2, size=3)
        order.append("other compiles")
        release()

    with waiter.stepped_out():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
        assert order == ["other compiles"] and not waiter.held  # it took the place the waiter gave back
    assert waiter.held and gate._rest == 1  # back in its place after the wait
    waiter()
    waiter()  # idempotent
    assert gate._rest == 0 and not waiter.held
    # Abandoned at its deadline while stepped out (released for good): it does not take a place again.
    late = gate.enter(False, 2)
    with late.stepped_out():
        late()
    assert gate._rest == 0 and not late.held
    # A key's first config has no place to step out of.
    first = gate.enter(True, 2)
    with first.stepped_out():
        assert gate._rest == 0
    assert gate._rest == 0


def test_a_rank_hands_out_its_cheapest_config_first_then_the_slowest_to_compile(monkeypatch):
    """The execution waits for the first config ready, so the cheapest goes first; then the longest compiles,
    so that none starts last and ends the key alone. Other ranks steal from the other end."""
    import triton

    from triton_ctx_tune.compile import precompile
    from triton_ctx_tune.compile.precompile import compile_order, compile_weight

    monkeypatch.setattr(precompile, "interpret_mode", lambda: False)  # (under it, the list's order: nothing compiles)

    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "GROUP_M": 8}, num_warps=w, num_stages=st)
               for m, n, w, st in [(64, 64, 4, 3), (128, 256, 8, 4), (32, 32, 4, 2), (128, 128, 4, 3), (64, 64, 2, 2)]]
    # The tile per warp times stages (GROUP_M, 8, is not a tile): 64x64/4x3, 128x256/8x4, 32x32/4x2, 128x128/4x3,
    # 64x64/2x2
    assert [compile_weight(c) for c in configs] == [3072.0, 16384.0, 512.0, 12288.0, 4096.0]
    assert compile_order(configs, [0, 1, 2, 3, 4]) == [2, 1, 3, 4, 0]
    assert compile_order(configs, [0, 3]) == [0, 3] and compile_order(configs, [4]) == [4]
    # A budget's first rung (it does not wait for stragglers): all of them cheapest first.
    assert compile_order(configs, [0, 1, 2, 3, 4], cheapest_first=True) == [2, 0, 4, 3, 1]
    # FLA's chunk_bwd_kernel_dqkwg on an H100 or H200: warps 2 and 4, stages 2 to 4, no tile. Its configs at 4 warps
    # compiled in 1.3 to 1.4 s, at 2 warps in 5.9 to 7.1 s (RESULTS.md section 51).
    fla = [triton.Config({}, num_warps=w, num_stages=st) for w in (2, 4) for st in (2, 3, 4)]
    assert compile_order(fla, list(range(6))) == [3, 2, 1, 0, 5, 4]  # 4 warps x 2 stages, then the 2-warp ones


def _compile_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("ctx-tune-") and t.is_alive()}


def test_no_compile_thread_outlives_run_with_deadline_but_the_abandoned_one():
    from triton_ctx_tune.compile.precompile import run_with_deadline

    before = _compile_threads()
    hold, lock, running = threading.Event(), threading.Lock(), []
    done, late = run_with_deadline([0, 1, 2, 3], lambda i: i * 10, 4, 30)
    assert (done, late) == ({0: 0, 1: 10, 2: 20, 3: 30}, [])
    assert _compile_threads() == before  # joined, not left to end on their own
    done, late = run_with_deadline([0, 1], lambda i: _running_work(hold, running, lock)(i) if i == 1 else i, 2, 0.3)
    assert (done, late) == ({0: 0}, [1])
    (stuck,) = _compile_threads() - before  # only the one abandoned in its compile
    hold.set()
    stuck.join(10)


def test_at_exit_compile_threads_take_no_further_config_and_end():
    from triton_ctx_tune.compile import precompile

    before = _compile_threads()
    hold, lock, running = threading.Event(), threading.Lock(), []
    outcome: dict[str, Any] = {}
    # One thread, six configs: the first is in hand when the process exits; the other five never start.
    call = threading.Thread(target=lambda: outcome.update(
        r=precompile.run_with_deadline(list(range(6)), _running_work(hold, running, lock), 1, 30)))
    call.start()
    deadline = time.monotonic() + 10
    while not running and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        threading.Timer(0.3, hold.set).start()  # the config in hand ends while the hook waits for it
        start = time.monotonic()
        precompile._stop_threads()
        assert time.monotonic() - start < precompile.EXIT_WAIT_S
        call.join(10)
        assert outcome["r"] == ({0: 0}, [1, 2, 3, 4, 5]) and running == [0]
        assert _compile_threads() == before
        # Run now, with no thread at all: nothing starts either.
        assert precompile.run_with_deadline([7, 8], lambda i: i, 2, 30) == ({}, [7, 8])
    finally:
        precompile._EXITING.clear()
        hold.set()


@triton.autotune(configs=block_configs([16, 32]), key=["n"])
@triton.jit
def _line_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def test_the_compile_line_counts_every_config_once_and_report_prints_it(tmp_path, capfd):
    """Each key's precompile event counts its configs by place; the call's compile event and printed line total
    them (workers + in-process + disk cache == configs), with the time to the first timed slot."""
    from triton_ctx_tune.tools.report import build, format_report

    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, cache=False, log_dir=tmp_path, quiet=False)
    def op(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        _line_kernel[grid(h.numel())](h, h.numel())
        _line_kernel[grid(h.numel() // 2)](h, h.numel() // 2)  # a second key of the same kernel
        return h

    op(torch.zeros(64, dtype=torch.float32, device=DEVICE))
    events = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    pre = [e for e in events if e["event"] == "precompile"]
    assert len(pre) == 2
    for e in pre:
        assert sum(e["counts"].values()) + len(e["failures"]) + len(e["rejected"]) == 2
        assert sorted(e["places"]) == ["0", "1"] and set(e["places"].values()) <= {"workers", "here", "ranks", "cache"}
        assert e["wall_s"] >= 0 and e["compile_s"] >= 0
    (call,) = [e for e in events if e["event"] == "compile"]
    assert call["configs"] == 4 == call["workers"] + call["here"] + call["ranks"] + call["cache"]
    assert call["keys"] == 2 and call["first_slot_s"] is not None and call["first_slot_s"] >= 0
    assert call["compile_s"] == pytest.approx(sum(e["compile_s"] for e in pre))
    line = next(x for x in capfd.readouterr().err.splitlines() if ": compile: " in x)
    assert f"compile: 4 configs, {call['workers']} in " in line and f"{call['here']} in-process" in line
    assert f"{call['cache']} from disk cache" in line and "first timed slot" in line
    # The parallelism the compiles allowed: never below what they reached (the floors are parts of the wall time).
    if call["bound"] is not None:
        assert call["bound"] >= call["parallelism"] * 0.999 and "(at most " in line
    text = format_report(build(tmp_path))
    assert "op: compile: 4 configs" in text
    assert text.count("  compile    2 configs: ") == 2
    autotuner(_line_kernel).cache.clear()


def test_the_compile_line_names_what_bounds_its_parallelism():
    """FLA's step at 2 ranks (RESULTS sections 38 and 42): a key met 2.3 s in whose largest config compiles for 7.6 s
    sets the wall time, whatever the node's cores: the line says the parallelism it allowed and why."""
    from triton_ctx_tune.tools.logs import compile_line, compile_totals

    def key(kernel: str, started: float, longest_s: float, compile_s: float, ended: float) -> dict:
        return {"counts": {"workers": 6}, "compile_s": compile_s, "started": 100.0 + started, "ended": 100.0 + ended,
                "pool": 16, "shared_ptxas": [], "kernel": kernel, "longest_s": longest_s}

    keys = [key("chunk_fwd_kernel_h", 0.0, 1.7, 16.5, 5.2), key("chunk_bwd_kernel_dqkwg", 2.3, 7.6, 11.5, 9.92)]
    t = compile_totals(keys, 5.3)
    assert t["wall_s"] == pytest.approx(9.92) and t["parallelism"] == pytest.approx(28.0 / 9.92)
    assert t["bound"] == pytest.approx(28.0 / 9.9)  # the critical path, 2.3 + 7.6 s, is longer than 28 s / 16
    assert t["bound_by"] == {"kernel": "chunk_bwd_kernel_dqkwg", "met_s": pytest.approx(2.3), "longest_s": 7.6}
    assert "parallelism 2.8x (at most 2.8x: chunk_bwd_kernel_dqkwg met 2.3 s in, a config of it 7.6 s), 9.9 s" \
        in compile_line(t)
    # Many short compiles: the pool is the floor (64 s over 16 workers = 4 s, longer than any key's path).
    t = compile_totals([key("k", 0.0, 0.8, 64.0, 5.0)], None)
    assert t["bound"] == pytest.approx(16.0) and t["bound_by"] == {"pool": 16}
    assert "parallelism 12.8x (at most 16.0x: the compiles spread over 16 workers), 5.0 s" in compile_line(t)
    # A log written before the bound existed: the line as it was.
    old = {k: v for k, v in t.items() if k not in ("bound", "bound_by")}
    assert "parallelism 12.8x, 5.0 s" in compile_line(old)


def test_the_compile_line_says_how_many_cores_the_compiles_kept_busy():
    """With front workers a rank runs more compile processes than cores: the compiles' own times (wall) sum to
    more than the cores gave. Their CPU seconds (a worker's own and its ptxas's) over the wall time do not."""
    from triton_ctx_tune.tools.logs import compile_line, compile_totals

    keys = [{"counts": {"workers": 48}, "compile_s": 30.0, "cpu_s": 24.0, "started": 100.0, "ended": 104.0, "pool": 24,
             "shared_ptxas": [], "kernel": "h", "longest_s": 1.2},
            {"counts": {"workers": 6}, "compile_s": 20.0, "cpu_s": 16.0, "started": 102.0, "ended": 108.0, "pool": 24,
             "shared_ptxas": [], "kernel": "dqkwg", "longest_s": 6.0}]
    t = compile_totals(keys, None)
    assert (t["cpu_s"], t["cores_busy"], t["parallelism"]) == (40.0, 5.0, 6.25)
    assert "parallelism 6.2x (at most 6.2x: dqkwg met 2.0 s in, a config of it 6.0 s), 5.0 cores busy, 8.0 s" \
        in compile_line(t)
    t = compile_totals([keys[0], {k: v for k, v in keys[1].items() if k != "cpu_s"}], None)  # (a record before it)
    assert t["cpu_s"] is None and t["cores_busy"] is None and "cores busy" not in compile_line(t)


def test_report_adds_up_a_nodes_ranks_compiles(tmp_path):
    """A rank's compile line counts its own share; `report` adds every local rank's (per host) so that the node's
    parallelism, the issue's measure against the node's cores, is one line: (38.5 + 27.5) s in 5.5 s = 12.0x."""
    from triton_ctx_tune.tools.report import build, format_report

    def events(rank: int, compile_s: float, wall_s: float, workers: int, here: int, cpu: bool = False) -> list[dict]:
        call = f"node7:{100 + rank}:1"
        head = {"rank": rank, "call": call, "time": 1.0}
        return [{"event": "call", **head, "function": "step", "world": 2, "device": "gpu", "timer": "cuda-events",
                 "triton": "3.6.0", "torch": "2.11", "triton_ctx_tune": "0.1.0", "host": "node7", "pid": 100 + rank},
                {"event": "compile", **head, "function": "step", "keys": 2, "configs": 40, "workers": workers,
                 "here": here, "ranks": 40 - workers - here, "cache": 0, "pool": 16, "compile_s": compile_s,
                 "wall_s": wall_s, "parallelism": compile_s / wall_s, "first_slot_s": 1.0,
                 **({"cpu_s": compile_s * 0.8} if cpu else {})},
                {"event": "end", **head, "function": "step", "executions": 9, "wall_s": 6.0, "error": None}]

    for rank, row in enumerate([events(0, 38.5, 5.5, 19, 1), events(1, 27.5, 5.0, 20, 0)]):
        (tmp_path / f"rank-{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in row))
    text = format_report(build(tmp_path))
    assert "step: compile: 40 configs, 19 in 16 workers, 1 in-process, 20 by other local ranks" in text
    assert "step: node node7: 2 ranks compiled 40 configs, 66.0 s of compiles in 5.5 s, parallelism 12.0x over 32 " \
           "workers" in text
    assert "cores busy" not in text  # (logs before the compiles' CPU seconds were)
    for rank, row in enumerate([events(0, 38.5, 5.5, 19, 1, cpu=True), events(1, 27.5, 5.0, 20, 0, cpu=True)]):
        (tmp_path / f"rank-{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in row))
    text = format_report(build(tmp_path))  # (38.5 + 27.5) x 0.8 CPU seconds in 5.5 s
    assert "parallelism 12.0x over 32 workers, 9.6 cores busy" in text
