"""Serving: shape buckets, tune-ahead (lockstep and spread over ranks), freeze, throughput next to latency."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels import DEVICE, SIZED_CONFIGS, autotuner, grid
from triton_ctx_tune import autotune, contextual_autotune
from triton_ctx_tune.errors import InvalidOptionError, UserHookError
from triton_ctx_tune.runtime import devices
from triton_ctx_tune.tools import report as R

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(n_warmup=1, n_repeat=2, early_stop=False)


def plus_one_source(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    """dst = src + 1; with SIZED_CONFIGS BLOCK 64 wins for n >= 100, BLOCK 16 below."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask) + 1, mask=mask)


def _kernel() -> Any:
    """A fresh autotuned kernel: its Autotuner.cache is this test's alone."""
    return triton.autotune(configs=SIZED_CONFIGS, key=["n"])(triton.jit(plus_one_source))


def _op(kernel: Any, **options: Any) -> Any:
    @contextual_autotune(**{**FAST, **options})
    def op(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        kernel[grid(x.numel())](x, y, x.numel())
        return y
    return op


def _blocks(kernel: Any) -> dict[int, int]:
    return {k[0]: c.kwargs["BLOCK"] for k, c in autotuner(kernel).cache.items()}


def _ones(n: int) -> torch.Tensor:
    return torch.ones(n, device=DEVICE)


def _check(y: torch.Tensor, n: int) -> None:
    assert y.shape == (n,) and torch.equal(y, torch.full((n,), 2.0, device=DEVICE))


# ---- buckets ----------------------------------------------------------------------------------


def test_a_key_inside_a_tuned_bucket_runs_its_winner_with_no_tuning():
    kernel = _kernel()
    op = _op(kernel, buckets={"n": "pow2"})
    _check(op(_ones(100)), 100)  # tunes bucket 128 on n=100: BLOCK 64
    assert op.last_call.executions > 1 and [t.key[0] for t in op.last_call.tuned] == [128]
    for n in (120, 128, 65):  # the same bucket: the warm path, and Triton's own cache learns the shape
        _check(op(_ones(n)), n)
        assert op.last_call.executions == 1 and op.last_call.tuned == []
    assert _blocks(kernel) == {128: 64, 120: 64, 65: 64}
    _check(op(_ones(50)), 50)  # bucket 64 is a new bucket: tuned, BLOCK 16
    assert [t.key[0] for t in op.last_call.tuned] == [64] and _blocks(kernel)[64] == 16
    _check(op(_ones(129)), 129)  # bucket 256: tuned on its first shape
    assert [t.key[0] for t in op.last_call.tuned] == [256]


def test_a_list_rule_puts_sizes_above_its_last_edge_into_the_last_bucket():
    kernel = _kernel()
    op = _op(kernel, buckets={"n": [64, 256]})
    _check(op(_ones(300)), 300)
    assert [t.key[0] for t in op.last_call.tuned] == [256]
    _check(op(_ones(200)), 200)
    _check(op(_ones(5000)), 5000)
    assert op.last_call.executions == 1 and _blocks(kernel)[5000] == 64
    _check(op(_ones(10)), 10)
    assert [t.key[0] for t in op.last_call.tuned] == [64] and _blocks(kernel)[64] == 16


def test_a_callable_rule_and_a_dimension_that_is_not_in_the_key():
    kernel = _kernel()
    op = _op(kernel, buckets={"n": lambda n: 1000 if n > 90 else 10, "M": "pow2"})  # M: no kernel names it
    op(_ones(91))
    op(_ones(150))
    assert op.last_call.executions == 1 and set(_blocks(kernel)) == {1000, 150}


def test_an_autotune_key_fn_returning_named_values_is_bucketed_by_name():
    kernel = _kernel()
    seen: list[int] = []

    @autotune(config_space=[{"chunks": 1}, {"chunks": 2}], key_fn=lambda x: {"M": x.numel()},
              buckets={"M": "pow2", "n": "pow2"}, **FAST)  # the function's key, and its kernel's
    def op(x: torch.Tensor, *, chunks: int) -> torch.Tensor:
        seen.append(chunks)
        y = torch.empty_like(x)
        kernel[grid(x.numel())](x, y, x.numel())
        return y

    _check(op(_ones(100)), 100)
    tuned = op.last_call.executions
    assert tuned > 1 and list(op.best) == [(("M", 128),)]
    seen.clear()
    _check(op(_ones(127)), 127)
    assert op.last_call.executions == 1 and len(seen) == 1 and list(op.best) == [(("M", 128),)]


# ---- freeze -----------------------------------------------------------------------------------


def test_freeze_never_tunes_and_runs_the_nearest_tuned_bucket_else_the_first_config(tmp_path):
    kernel = _kernel()
    tuner = _op(kernel, buckets={"n": "pow2"})
    tuner(_ones(40))  # bucket 64: BLOCK 16
    tuner(_ones(100))  # bucket 128: BLOCK 64
    frozen = _op(kernel, buckets={"n": "pow2"}, freeze=True)
    for n, bucket, block in ((1000, 1024, 64), (3, 4, 16), (70, 128, 64)):
        _check(frozen(_ones(n)), n)
        stats = frozen.last_call
        assert stats.executions == 1 and stats.tuned == []
        assert _blocks(kernel)[bucket] == block
    assert frozen.last_call.frozen == []  # bucket 128 was tuned: no miss
    lonely = _kernel()  # nothing tuned for it (the cache on disk, which knows its source, left out): its first config
    _check(_op(lonely, freeze=True, cache=False)(_ones(30)), 30)
    assert _blocks(lonely) == {30: 16}
    report = R.format_report(R.build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert "freeze: 3 key(s) had no tuned result" in report
    assert "key=(1024, 'torch.float32', 'torch.float32'): ran the winner of (128, 'torch.float32', " \
           "'torch.float32'), {BLOCK=64" in report
    assert "key=(30, 'torch.float32', 'torch.float32'): ran the first config" in report
    assert "TRITON_CTX_TUNE_FREEZE=0" in report


def test_freeze_reads_the_tuning_cache_for_the_exact_key_and_for_its_neighbours(monkeypatch):
    kernel = _kernel()
    tuner = _op(kernel, buckets={"n": "pow2"})
    tuner(_ones(100))  # bucket 128 (BLOCK 64), written to the cache
    tuner(_ones(40))  # bucket 64 (BLOCK 16)
    autotuner(kernel).cache.clear()  # a new server process: only the cache on disk knows
    monkeypatch.setenv("TRITON_CTX_TUNE_FREEZE", "1")  # the variable, not the option
    frozen = _op(kernel, buckets={"n": "pow2"})
    frozen(_ones(127))
    assert frozen.last_call.cache_hits == 1 and frozen.last_call.frozen == [] and _blocks(kernel)[128] == 64
    frozen(_ones(2))  # bucket 2: nearest on disk is 64
    assert frozen.last_call.executions == 1 and frozen.last_call.frozen == [("plus_one_source", (2, "torch.float32",
                                                                                                  "torch.float32"))]
    assert _blocks(kernel)[2] == 16


# ---- tune ahead -------------------------------------------------------------------------------


def test_tune_ahead_tunes_every_bucket_then_serving_never_tunes():
    kernel = _kernel()
    op = _op(kernel, buckets={"n": "pow2"}, flops=lambda x: 2.0 * x.numel(), bytes=lambda x: 8.0 * x.numel())
    rows = op.tune_ahead(dim="n", up_to=300, inputs_for=lambda n: (_ones(n),), timed_runs=2)
    assert [r.size for r in rows] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert all(r.tuned == 1 and r.executions > 1 for r in rows)
    assert {b: _blocks(kernel)[b] for b in (64, 128, 512)} == {64: 16, 128: 64, 512: 64}
    for r in rows:
        assert r.call_ms is not None and r.call_ms > 0
        assert r.tflops == pytest.approx(2.0 * r.size / (r.call_ms / 1e3) / 1e12)
        assert r.gbps == pytest.approx(8.0 * r.size / (r.call_ms / 1e3) / 1e9)
        tf_peak, gb_peak = devices.peak()
        if tf_peak is None:  # the interpreter (and an unknown GPU) has no peak
            assert r.peak_fraction is None
        else:
            assert r.peak_fraction == pytest.approx(max(r.tflops / tf_peak, r.gbps / gb_peak))
    for n in (1, 5, 77, 300, 129):
        _check(op(_ones(n)), n)
        assert op.last_call.executions == 1
    report = R.format_report(R.build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert "op: tuned ahead, 10 sizes" in report and "TFLOP/s" in report


def test_tune_ahead_over_a_list_with_an_example_resized_and_sizes_sharing_a_bucket():
    kernel = _kernel()
    op = _op(kernel, buckets={"n": "pow2"})
    rows = op.tune_ahead([100, 120, 40], example=(_ones(8),), resize={0: 0}, timed_runs=0)
    assert [(r.size, r.tuned) for r in rows] == [(40, 1), (100, 1), (120, 0)]  # 120 falls into 100's bucket
    assert rows[2].executions == 1 and rows[0].call_ms is None
    assert {b: _blocks(kernel)[b] for b in (64, 128)} == {64: 16, 128: 64}


def test_tune_ahead_under_freeze_still_tunes():
    kernel = _kernel()
    op = _op(kernel, freeze=True)
    rows = op.tune_ahead([50], lambda n: (_ones(n),), timed_runs=0)
    assert rows[0].tuned == 1 and op.opts.freeze is True
    assert op(_ones(60)) is not None and op.last_call.frozen == [("plus_one_source", (60, "torch.float32",
                                                                                        "torch.float32"))]


def test_tune_ahead_refuses_a_factory_that_ignores_its_size():
    op = _op(_kernel(), buckets={"n": "pow2"})
    with pytest.raises(UserHookError, match=r"inputs_for.*size 64 with no tensor dimension.*equal to 64"):
        op.tune_ahead([64], lambda n: (_ones(7),))
    with pytest.raises(UserHookError, match=r"inputs_for.*size 16 whose kernels met n=32"):
        op.tune_ahead([16], lambda n: (torch.ones(n, 2, device=DEVICE),), dim="n")  # n rows, but 2n elements
    with pytest.raises(UserHookError, match=r"inputs_for.*not a tuple, a dict or an \(args, kwargs\) pair"):
        op.tune_ahead([4], lambda n: _ones(n))
    with pytest.raises(InvalidOptionError, match=r"dim=.*one of the bucketed dimensions \['n'\]"):
        op.tune_ahead(dim="M", up_to=64, inputs_for=lambda n: (_ones(n),))


def test_tune_ahead_refuses_spread_for_a_function_with_collectives():
    op = _op(_kernel())
    op.opts = dataclasses.replace(op.opts, is_dist=True)  # as decorated with is_dist=True: refused before any call
    with pytest.raises(InvalidOptionError, match=r"spread=True.*collectives need every rank"):
        op.tune_ahead([4], lambda n: (_ones(n),), spread=True)


# ---- ranks ------------------------------------------------------------------------------------


def _run_ranks(world: int, scenarios: list[str], out: Path) -> dict[str, list[dict]]:
    from tests.test_dist import run_ranks
    return run_ranks(world, scenarios, out, deadline_s=300, worker="serving_worker.py",
                     env_extra={"TRITON_CTX_TUNE_CACHE_DIR": str(out / "cache")})


@pytest.mark.dist
def test_two_ranks_tune_ahead_in_lockstep_and_spread(tmp_path):
    results = _run_ranks(2, ["lockstep", "spread"], tmp_path)
    lock, spread = results["lockstep"], results["spread"]
    for row in lock + spread:
        assert "error" not in row, row.get("traceback")
    expected = {"4": 16, "64": 16, "128": 64, "512": 64}
    # Lockstep: every rank ran every size, with the function's all_reduce in every execution.
    for r in lock:
        assert [row[0] for row in r["rows"]] == [3, 40, 100, 300] and all(row[2] == 1 for row in r["rows"])
        assert r["winners"] == expected and r["warm_executions"] == 1 and r["y"] == [4.0, 4.0, 4.0]
    # Spread: rank 0 tuned sizes 3 and 100, rank 1 sizes 40 and 300; each rank has every winner after.
    for r in spread:
        assert [tuple(row[:3]) for row in r["rows"]] == [(3, 0, 1), (40, 1, 1), (100, 0, 1), (300, 1, 1)]
        assert r["winners"] == expected and r["warm_executions"] == [1] * 6
        assert r["entries"] == 4  # its own two entries and the other rank's two, in its own cache directory
    assert spread[0]["rows"] == spread[1]["rows"]


@pytest.mark.dist
def test_the_tune_command_runs_a_script_under_the_launcher(tmp_path):
    script = tmp_path / "ahead.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import torch.distributed as dist\n"
        "from tests.serving_worker import _op\n"
        "dist.init_process_group('gloo')\n"
        "op, at = _op(is_dist=True)\n"
        "op.tune_ahead([5, 200], lambda n: (torch.ones(n),), timed_runs=1)\n"
        "dist.destroy_process_group()\n")
    env = dict(os.environ, TRITON_CTX_TUNE_LOG_DIR=str(tmp_path / "logs"), TRITON_CTX_TUNE_DEVICE="cpu",
               TRITON_CTX_TUNE_FREEZE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "triton_ctx_tune", "tune", "--nproc", "1", str(script)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "op: tuned ahead, 2 sizes" in proc.stdout
    rows = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    assert [e["size"] for e in rows if e["event"] == "tune-ahead"] == [5, 200]
