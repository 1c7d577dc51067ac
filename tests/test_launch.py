"""./launch on bad input: one clear line naming the fix, before any rank starts; a failing rank's own error last."""
from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 300


def launch(script: Path | str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """./launch as a user in a virtualenv runs it: PYTHON names this interpreter, nothing else is inherited."""
    base = {k: v for k, v in os.environ.items() if k not in ("NPROC", "TRITON_CTX_TUNE_DEVICE", "PYTHON")}
    return subprocess.run([str(ROOT / "launch"), str(script), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=DEADLINE_S, env={**base, "PYTHON": sys.executable, **env})


@pytest.fixture
def marker_script(tmp_path):
    """A script that leaves a file behind if any rank ever runs it."""
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return script, marker


def _torchless_python(tmp_path: Path) -> str:
    venv.create(tmp_path / "venv", with_pip=False)
    return str(tmp_path / "venv" / "bin" / "python")


BAD_INPUT = {
    "nproc-zero": (dict(NPROC="0"),
                   "launch: NPROC=0: expected a positive integer, the number of processes per node (e.g. NPROC=2)"),
    "nproc-abc": (dict(NPROC="abc"),
                  "launch: NPROC=abc: expected a positive integer, the number of processes per node (e.g. NPROC=2)"),
    "device-typo": (dict(TRITON_CTX_TUNE_DEVICE="gpu"),
                    "launch: TRITON_CTX_TUNE_DEVICE=gpu: expected auto, cuda or cpu"),
    "python-missing": (dict(PYTHON="/nonexistent/python3"),
                       "launch: PYTHON=/nonexistent/python3: no such command; set PYTHON to the Python that has "
                       "torch and triton"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_environment_is_named_before_any_rank_starts(case, marker_script):
    script, marker = marker_script
    env, message = BAD_INPUT[case]
    proc = launch(script, **env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", message + "\n")
    assert not marker.exists()


def test_python_without_torch_is_named(marker_script, tmp_path):
    script, marker = marker_script
    python = _torchless_python(tmp_path)
    proc = launch(script, PYTHON=python)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"launch: {python} has no torch; set PYTHON to the Python that has torch and triton, "
                           "e.g. PYTHON=.venv/bin/python\n")
    assert not marker.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_named(marker_script):
    script, marker = marker_script
    proc = launch(script, TRITON_CTX_TUNE_DEVICE="cuda")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"launch: TRITON_CTX_TUNE_DEVICE=cuda, but {sys.executable} sees no GPU "
                           "(torch.cuda.is_available() is False); use TRITON_CTX_TUNE_DEVICE=cpu, or auto, to run on "
                           "the CPU\n")
    assert not marker.exists()


def test_a_script_usage_error_ends_the_output_with_its_exit_code():
    proc = launch("examples/tp_mlp.py", "--bogus", NPROC="2")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2  # argparse's, not torchrun's 1
    assert lines[-1] == "tp_mlp.py: error: unrecognized arguments: --bogus"
    # The first rank to fail ends the run: torchrun stops the other, which may not have printed its own yet.
    assert lines.count("tp_mlp.py: error: unrecognized arguments: --bogus") in (1, 2)
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr and "exitcode" not in proc.stderr


def test_a_rank_killed_by_a_signal_gets_one_line(tmp_path):
    script = tmp_path / "die.py"
    script.write_text("import os, signal, time\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    os.kill(os.getpid(), signal.SIGKILL)\n"
                      "time.sleep(60)\n")  # rank 0 lives until torchrun stops it
    proc = launch(script, NPROC="2")
    assert proc.returncode == 128 + 9
    assert proc.stderr.strip().splitlines()[-1] == "launch: rank 1 was killed by SIGKILL"
    assert "Traceback" not in proc.stderr
