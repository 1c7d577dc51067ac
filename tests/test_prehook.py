"""Config pre_hooks that change what a kernel is compiled for (host TensorDescriptors' block_shape), and
precompile that never excludes a config alone (issue 34).

The kernels are in prehook_kernels.py: a heuristic stands in for the compile's specialization on the
descriptor, since the interpreter compiles nothing.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.kernels import DEVICE, autotuner, chosen
from tests.prehook_kernels import (
    TensorDescriptor,
    desc_double,
    desc_double_failing,
    desc_double_rejected,
    descriptor,
    doubling_op,
)
from tests.test_dist import run_ranks
from triton_ctx_tune import NoValidConfigError
from triton_ctx_tune.runtime import compat
from triton_ctx_tune.tools.report import build, format_report

pytestmark = pytest.mark.skipif(TensorDescriptor is None, reason="this Triton has no triton.tools.tensor_descriptor")

KEY = (100, "torch.float32")


def _events(log_dir) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "rank-0.jsonl").read_text().splitlines()]


def _tune(kernel, log_dir) -> tuple[torch.Tensor, torch.Tensor, int]:
    op, executions = doubling_op(kernel, log_dir=log_dir)
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    try:
        return op(x), x, executions[0]
    finally:
        autotuner(kernel).cache.clear()


def test_precompile_applies_each_configs_pre_hook_to_copies_of_the_arguments():
    at = autotuner(desc_double)
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    y = torch.empty_like(x)
    real = descriptor(x)
    for config, block in zip(at.configs, (16, 32, 64)):
        args, kwargs = compat.hooked_launch_args(at, config, (real, y, 100), {})
        assert args[0] is not real and args[0].block_shape == [block]  # the hook's copy, set for this config
        assert args[1] is y and args[2] == 100  # tensors and numbers as they were
        assert real.block_shape == [8]  # the caller's descriptor untouched
        assert args[0].base is x  # the copy still describes the caller's tensor (its pointer decides alignment)


def test_a_kernel_whose_hook_sets_the_descriptor_block_tunes_with_default_options(tmp_path):
    y, x, executions = _tune(desc_double, tmp_path)
    torch.testing.assert_close(y, 2 * x)
    (pre,) = [e for e in _events(tmp_path) if e["event"] == "precompile"]
    # Compiled as the launch compiles it: the hook's block, so nothing failed or was rejected.
    assert (pre["failures"], pre["rejected"], pre["skipped"]) == ({}, {}, {})
    (decision,) = [e for e in _events(tmp_path) if e["event"] == "decision"]
    assert decision["winner"] == 1 and decision["local_failures"] == {}
    # 3 configs x (1 warm-up + 2 timed) slots, the step that met the key ran a ready config in its first
    # warm-up slot; then the final run.
    assert executions == 9 + 1


def test_a_config_only_precompile_rejects_is_timed_and_can_win(tmp_path):
    y, x, _ = _tune(desc_double_rejected, tmp_path)
    torch.testing.assert_close(y, 2 * x)
    events = _events(tmp_path)
    (pre,) = [e for e in events if e["event"] == "precompile"]
    assert pre["failures"] == {} and list(pre["rejected"]) == ["1"]
    assert pre["rejected"]["1"].startswith("CompileTimeAssertionFailure: rejected by precompile alone")
    (decision,) = [e for e in events if e["event"] == "decision"]
    assert decision["winner"] == 1 and decision["local_failures"] == {}  # BLOCK 32, the fastest, chosen
    timed = [e for e in events if e["event"] == "slot" and e["config_index"] == 1 and e["timed"]]
    assert len(timed) == 2 and all(e["failure"] is None for e in timed)
    (disagreed,) = [e for e in events if e["event"] == "precompile-disagreed"]
    assert disagreed["config_index"] == 1 and disagreed["config"].startswith("BLOCK=32")
    report = format_report(build(tmp_path))
    assert "precompile disagreed with the launch" in report and "_doubled: 1 config(s)" in report


def test_every_config_failing_lists_the_distinct_reasons_with_counts(tmp_path):
    with pytest.raises(NoValidConfigError) as err:
        _tune(desc_double_failing, tmp_path)
    message = str(err.value)
    lines = message.splitlines()
    # Each reason once, cause first, with its count: not one truncated source excerpt per config.
    assert lines[1].startswith("Reasons, most common first")
    assert lines[2] == ("  3 x CompileTimeAssertionFailure: needs more shared memory than this GPU has | "
                        "<source unavailable> [rank 0]")
    assert lines[3].startswith("Configs: {BLOCK=16, num_warps=4, num_stages=3}; {BLOCK=32")
    (error,) = [e for e in _events(tmp_path) if e["event"] == "error"]
    assert set(error["failures"]) == {f"BLOCK={b}, num_warps=4, num_stages=3" for b in (16, 32, 64)}
    assert chosen(desc_double_failing) == {}


def test_a_compile_error_keeps_its_message_after_the_source_excerpt():
    import ast

    from triton.compiler.errors import CompilationError

    src = "def kernel(a_desc):\n" + "".join(f"    x{i} = {i}\n" for i in range(40)) + "    acc = tl.dot(a, b)\n"
    node = ast.parse(src).body[0].body[-1]
    inner = CompilationError(src, node, "ValueError('incompatible dimensions at index 0: 64 and 128')")
    try:
        try:
            raise inner
        except CompilationError as e:
            raise CompilationError(src, node, None) from e  # re-raised at the call site, without a message
    except CompilationError as outer:
        reason = compat.config_failure_reason(outer)
    assert reason is not None
    assert reason.startswith("CompilationError: ValueError('incompatible dimensions at index 0: 64 and 128') "
                             "| at 42:4:")
    assert "x39 = 39" in reason  # the whole excerpt follows, for the logs


def test_two_ranks_share_a_rejection_and_both_time_the_config(tmp_path):
    rows = run_ranks(2, ["precompile_rejects"], tmp_path, worker="prehook_worker.py")["precompile_rejects"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["ok"] and row["chosen"] == {repr(KEY): 32}
        assert row["rejected"] == ["1"] and row["failures"] == {} and row["local_failures"] == {}
        assert row["disagreed"] == [1]  # every rank's launch compiled and ran it
    # Split precompile: local rank r compiles configs i with i % 2 == r, so only rank 1 rejected BLOCK 32 itself.
    assert [row["mine"] for row in rows] == [[0, 2], [1]]
    assert rows[0]["executions"] == rows[1]["executions"]


def test_a_hook_runs_in_precompile_only_where_an_argument_can_carry_its_change():
    """Tensors, numbers and strings: the hook cannot change the signature, so precompile does not call it (a hook
    that counts its launches, or spends time, sees only the launches)."""
    import triton

    calls: list[int] = []
    config = triton.Config({"BLOCK": 16}, pre_hook=lambda nargs: calls.append(nargs["BLOCK"]))
    at = autotuner(desc_double)
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    args, kwargs = compat.hooked_launch_args(at, config, (x, x, 100), {"grid": (1,)})
    assert calls == [] and args == (x, x, 100) and kwargs == {"grid": (1,)}
    compat.hooked_launch_args(at, config, (descriptor(x), x, 100), {"grid": (1,)})
    assert calls == [16]
