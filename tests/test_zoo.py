"""The conformance zoo's machinery on the CPU (benchmarks/zoo, docs/zoo.md): its own TMA-descriptor kernels under
Triton's interpreter, both arms on 2 gloo ranks, the merge; and the checks it judges outputs with.

The libraries' cases (flag_gems, gemlite, torchao, FLA, CCE) need a GPU: their imports or ops look for CUDA, so
none runs under the interpreter; the runner skips them by name, as tested here.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "benchmarks" / "zoo"
DEADLINE_S = 420  # both arms on 2 ranks take about a minute on 2 cores
TMA_CASES = ("zoo.tma_matmul", "zoo.tma_matmul_acc")


def _zoo_path() -> None:
    for path in (ZOO, ROOT / "benchmarks" / "clients", ROOT / "benchmarks"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def _run_arm(arm: str, out: Path, world: int) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TRITON_CTX_TUNE_QUIET="1")
    if not torch.cuda.is_available():
        env.update(TRITON_INTERPRET="1", TRITON_CTX_TUNE_BACKEND="gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           str(ZOO / "run_zoo.py"), "--arm", arm, "--out", str(out), "--cases", "zoo,flag_gems.mm",
           "--steady-iters", "2"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"zoo ranks still running after {DEADLINE_S} s (a hang):\n{(e.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, proc.stderr[-6000:]


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("on GPUs the zoo runs as benchmarks/zoo/device_zoo.sh (these inputs are CPU-seeded)")
    pytest.importorskip("triton.tools.tensor_descriptor", reason="this Triton has no host TensorDescriptor")
    out = tmp_path_factory.mktemp("zoo")
    for arm in ("plain", "ours"):
        _run_arm(arm, out, world=2)
    results = {arm: {r["case"]: r for r in json.loads((out / f"zoo-{arm}-w2.json").read_text())["results"]}
               for arm in ("plain", "ours")}
    return out, results


def _reference(case: str) -> tuple[torch.Tensor, dict]:
    """The case's reference, built again here the way every rank built it (one seed, CPU)."""
    _zoo_path()
    import cases

    ctx = types.SimpleNamespace(device=torch.device("cpu"), generator=lambda: torch.Generator().manual_seed(0))
    built = cases.BY_NAME[case].build(ctx)
    return built.reference, built.tolerance.as_dict()


@pytest.mark.dist
@pytest.mark.parametrize("case", TMA_CASES)
def test_ours_tunes_the_tma_kernels_on_two_ranks_to_one_of_their_configs(zoo_run, case):
    _zoo_path()
    from kernels import tma_matmul

    from triton_ctx_tune.runtime.compat import config_str

    _, results = zoo_run
    rec = results["ours"][case]
    assert rec["status"] == "tuned", rec.get("error")
    kernel = {"zoo.tma_matmul": tma_matmul.tma_matmul_kernel, "zoo.tma_matmul_acc": tma_matmul.tma_matmul_acc_kernel}
    at = kernel[case]
    # One key, decided by the tuner (not Triton's own run), agreed by both ranks, to one of the kernel's configs.
    assert len(rec["tuned"]) == 1 and rec["tuned"] == rec["keys"]
    (key, config), = rec["tuned"].items()
    assert key.startswith(at.base_fn.__name__ + " (")
    assert config in {config_str(c) for c in at.configs}
    assert rec["keys_outside_space"] == []
    assert rec["agreement"]["per_key"][key] == [config, config]
    assert rec["executions"] > 1  # re-executed to tune
    assert rec["ok"] and rec["error_ratio"] <= 1


@pytest.mark.dist
@pytest.mark.parametrize("case", TMA_CASES)
def test_both_arms_outputs_equal_the_float64_reference(zoo_run, case):
    # For the in-place kernel the reference is C0 + A @ B^T: one accumulation per call in either arm, the
    # tuning runs' own accumulations undone (restore_value in plain, re-execution's restore in ours).
    out, results = zoo_run
    ref, tol = _reference(case)
    for arm in ("plain", "ours"):
        assert results[arm][case]["status"] == "tuned"
        for rank in (0, 1):
            got = torch.load(out / f"outputs-{arm}-w2" / f"{case}.rank{rank}.pt")
            torch.testing.assert_close(got.double(), ref, atol=tol["atol"], rtol=tol["rtol"])


@pytest.mark.dist
def test_missing_and_gpu_only_cases_are_skipped_by_name(zoo_run):
    _, results = zoo_run
    import importlib.util

    mm = results["ours"]["flag_gems.mm"]
    assert mm["status"] == "skipped"
    if importlib.util.find_spec("flag_gems") is None:
        assert mm["reason"] == "skipped: flag_gems not installed (pip install -e '.[zoo]')"
    elif not torch.cuda.is_available():
        assert mm["reason"] == "skipped: needs a CUDA GPU"


@pytest.mark.dist
def test_merge_writes_the_table_and_totals(zoo_run):
    out, _ = zoo_run
    proc = subprocess.run([sys.executable, str(ZOO / "merge.py"), str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = (out / "zoo.md").read_text()
    assert text.strip() == proc.stdout.strip()
    rows = [line for line in text.splitlines() if line.startswith("| zoo.tma_matmul")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == cells[3] == "tuned"
        assert cells[4].startswith("ok (") and " / ok (" in cells[4]  # ours vs reference, ours vs plain
        # Plain ranks tune alone (host-clock timings under the interpreter): they may differ; ours may not.
        assert cells[5] in ("yes / yes", "NO (2 configs) / yes")
    assert "- cases run by ours: 2 (1 skipped); tuned: 2 (100%)" in text
    assert re.search(r"^- keys whose ranks disagree, plain / ours: [0-2] / 0$", text, re.M)
    assert "- wrong outputs (ours vs reference or vs plain): none; plain vs reference: none" in text


def test_unknown_case_names_are_refused():
    _zoo_path()
    import cases

    with pytest.raises(ValueError, match="unknown case 'no_such'"):
        cases.select("zoo,no_such")
    assert [c.name for c in cases.select("zoo")] == list(TMA_CASES)
    assert all(c.default for c in cases.select("default"))


def test_tolerance_rules():
    _zoo_path()
    from checks import Tolerance

    want = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    close = Tolerance("allclose", atol=0.1, rtol=0.0)
    assert close.ratio(torch.tensor([1.05, 2.0, 4.0]), want) == pytest.approx(0.5)
    assert close.ratio(torch.tensor([1.0, 2.0, float("nan")]), want) == math.inf
    assert close.ratio(torch.ones(2), want) == math.inf  # a wrong shape never passes
    exact = Tolerance("allclose")
    assert exact.ratio(torch.tensor([3, 1]), torch.tensor([3, 1])) == 0.0
    assert exact.ratio(torch.tensor([3, 2]), torch.tensor([3, 1])) == math.inf
    assert Tolerance("mean_abs", atol=1e-3).ratio(want + 5e-4, want) == pytest.approx(0.5)
    assert Tolerance("rel_fro", rtol=1e-2).ratio(want * 1.005, want) == pytest.approx(0.5)
    # Several outputs: the worst part decides.
    assert close.ratio((want, want + 0.2), (want, want)) == pytest.approx(2.0)


def test_libentry_launch_that_is_not_the_tuned_config_is_named():
    # FlagGems' LibEntry runs the config its first launch compiled, whatever was tuned afterwards.
    _zoo_path()
    from run_zoo import libentry_mismatches

    picks = {"mm_kernel_general (32, 64)": "BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3",
             "amax_kernel (last launch)": "BLOCK_M=4, BLOCK_N=1024, num_warps=4, num_stages=2"}
    same = {"mm_kernel_general": ["BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3"],
            "amax_kernel": ["BLOCK_M=4, BLOCK_N=1024, num_warps=4, num_stages=2"]}
    assert libentry_mismatches(same, picks) == []
    first_step = {**same, "mm_kernel_general": ["BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3"]}
    assert libentry_mismatches(first_step, picks) == ["mm_kernel_general"]
    assert libentry_mismatches({"bmm_kernel": ["BLOCK_M=16, num_warps=4, num_stages=2"]}, picks) == ["bmm_kernel"]
