"""Compile timeouts: a config whose compilation does not finish in time is invalid, its worker abandoned.

Under the interpreter nothing is compiled, but the compile-only launch that precompilation makes
(run(warmup=True)) still goes through heuristics() on its way to the compiler, in the compile
worker thread. A heuristic that blocks there for one config is, to the tuner, a compiler that
hangs on that config: the same thread, the same call, the same deadline. On a GPU the same
kernel stalls at the same point, before Triton's real compile.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels import DEVICE, SLOW_MS, autotuner, block_configs, chosen, grid
from triton_ctx_tune import contextual_autotune

ROOT = Path(__file__).resolve().parents[1]
RELEASE = threading.Event()


def _stall_compile_of_64(args: dict[str, Any]) -> int:
    if args.get("warmup") and args["BLOCK"] == 64:  # the compile-only launch of BLOCK 64, not its runs
        RELEASE.wait(120)
    return 0


# BLOCK 64 sleeps in no hook, so it wins when it compiles; 32 is next.
@triton.autotune(configs=block_configs([16, 32, 64], slow={16: 2 * SLOW_MS, 32: SLOW_MS}), key=["n"])
@triton.heuristics({"STALL": _stall_compile_of_64})
@triton.jit
def stalling_add_one_(x_ptr, n, BLOCK: tl.constexpr, STALL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _op(**opts: Any):
    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, cache=False, **opts)
    def op(x: torch.Tensor):
        h = x.clone()
        stalling_add_one_[grid(h.numel())](h, h.numel())
        return h

    return op


def _compile_workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ctx-tune-compile" and t.is_alive()]


def test_a_config_whose_compile_hangs_is_invalid_and_its_worker_abandoned(tmp_path):
    x = torch.arange(96, dtype=torch.float32, device=DEVICE)
    key = (96, "torch.float32")
    # Control: when BLOCK 64 compiles, it wins.
    RELEASE.set()
    torch.testing.assert_close(_op(compile_timeout_s=5.0)(x), x + 1)
    assert chosen(stalling_add_one_) == {key: 64}
    autotuner(stalling_add_one_).cache.clear()

    RELEASE.clear()
    stuck: list[threading.Thread] = []
    try:
        op = _op(compile_timeout_s=0.5)
        start = time.monotonic()
        out = op(x)
        elapsed = time.monotonic() - start
        stuck = _compile_workers()
        torch.testing.assert_close(out, x + 1)
        assert chosen(stalling_add_one_) == {key: 32}
        # BLOCK 64's slots left the plan when its failure was gathered (KeyState.unplan): they used to run a
        # fallback, 3 executions more.
        assert op.last_call.executions == 2 * 3 + 1
        assert elapsed < 60, elapsed  # the stalled compile waits up to 120 s; the call did not wait for it
        assert len(stuck) == 1 and stuck[0].daemon  # abandoned, still stuck, and no obstacle to the process exiting
    finally:
        RELEASE.set()
        for t in stuck:
            t.join(30)
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    precompile = [e for e in events if e["event"] == "precompile"][-1]  # the control's came first
    reason = ("compile timeout: compiling this config took longer than 0.5 s, so it was abandoned (raise "
              "compile_timeout_s or TRITON_CTX_TUNE_COMPILE_TIMEOUT if it is just slow)")
    assert precompile["failures"] == {"2": reason}
    decision = [e for e in events if e["event"] == "decision"][-1]
    assert decision["winner"] == 1 and decision["local_failures"] == {"2": reason}
    assert decision["reduced"][2] == float("inf")
    slots = [e for e in events[events.index(precompile):] if e["event"] == "slot" and e["config_index"] == 2]
    assert slots == []  # out of the plan from the gather on (the slots before it are the untimed first launch's)


_NEVER_COMPILES = textwrap.dedent("""
    import time, torch, triton
    import triton.language as tl
    from tests.kernels import block_configs, grid
    from triton_ctx_tune import contextual_autotune

    def stall(args):
        if args.get("warmup") and args["BLOCK"] == 64:
            time.sleep(3600)  # never released: only the process exit ends this thread
        return 0

    @triton.autotune(configs=block_configs([16, 32, 64], slow={16: 30.0}), key=["n"])
    @triton.heuristics({"STALL": stall})
    @triton.jit
    def k(x_ptr, n, BLOCK: tl.constexpr, STALL: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    @contextual_autotune(n_warmup=1, n_repeat=1, early_stop=False, cache=False, log_dir=False)
    def op(x):
        h = x.clone()
        k[grid(h.numel())](h, h.numel())
        return h

    x = torch.arange(96, dtype=torch.float32)
    assert torch.equal(op(x), x + 1)
    print("chosen", {key: c.kwargs["BLOCK"] for key, c in k.cache.items()}, flush=True)
    """)


def test_a_compile_that_never_finishes_does_not_hold_up_the_process_exit():
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_CTX_TUNE_COMPILE_TIMEOUT="1", TRITON_CTX_TUNE_QUIET="1",
               PYTHONPATH=str(ROOT))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _NEVER_COMPILES], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == "chosen {(96, 'torch.float32'): 32}"
    assert time.monotonic() - start < 120  # its stalled worker would sleep for an hour


@pytest.mark.dist
def test_a_compile_that_hangs_on_one_rank_makes_the_config_invalid_on_every_rank(tmp_path):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < 2:
        pytest.skip("needs 2 GPUs")
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CTX_TUNE_QUIET="1", OMP_NUM_THREADS="1",
               TRITON_CTX_TUNE_LOG_DIR=str(tmp_path / "logs"))
    if gpus == 0:
        env.update(TRITON_INTERPRET="1", TRITON_CTX_TUNE_BACKEND="gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "compile_timeout_worker.py"), "--out", str(tmp_path), "own", "other"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ranks still running after 300 s (a hang):\n{(e.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    reason = ("compile timeout: compiling this config took longer than 1 s, so it was abandoned (raise "
              "compile_timeout_s or TRITON_CTX_TUNE_COMPILE_TIMEOUT if it is just slow)")
    logs = {r: [json.loads(line) for line in (tmp_path / "logs" / f"rank-{r}.jsonl").read_text().splitlines()]
            for r in (0, 1)}
    # "own": BLOCK 64 is config 1, rank 1's to compile. "other": config 2, rank 0's; rank 1 stalls loading it.
    for i, (name, stalled) in enumerate((("own", 1), ("other", 2))):
        rows = [json.loads((tmp_path / f"{name}.rank{r}.json").read_text()) for r in (0, 1)]
        assert [(r["ok"], r["blocks"]) for r in rows] == [(True, {"(64, 'torch.float32')": 32})] * 2, name
        # The stalled config's slots left both ranks' plans at the step end that agreed it failed: in lockstep.
        assert rows[0]["executions"] == rows[1]["executions"] == 2 * 3 + 1
        assert all(r["elapsed"] < 120 for r in rows)  # rank 1's stalled compile sleeps for an hour
        precompile = {r: [e for e in logs[r] if e["event"] == "precompile"][i] for r in (0, 1)}
        assert precompile[0]["failures"] == {str(stalled): f"rank 1: {reason}"}, name
        assert precompile[1]["failures"] == {str(stalled): reason}, name
        # Rank 0 compiled BLOCK 64 fine, yet it leaves the plan from the gather on, as on rank 1.
        for r in (0, 1):
            start = logs[r].index(precompile[r])
            end = next(j for j in range(start, len(logs[r])) if logs[r][j]["event"] == "decision")
            slots = [e for e in logs[r][start:end] if e["event"] == "slot" and e["config_index"] == stalled]
            assert slots == [], (name, r)
