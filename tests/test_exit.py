"""A tuned distributed program exits cleanly: nothing the tuner started or kept outlives it.

exit_worker.py decorates its function after init_process_group, tunes it, calls it again, destroys
the group and returns through sys.exit(0), so the interpreter's whole teardown runs. The tuner used
to keep the default group alive past destroy_process_group() (torch._dynamo, imported at
decoration, bound it into torch.distributed.nn's defaults); a gloo worker thread then aborted the
rank in interpreter finalization in 9 of 60 runs ("terminate called without an active exception",
exit -6). A few runs can miss that, so each run also checks its cause directly: no gloo thread
after destroy_process_group(), and no tuner thread or child process left when the interpreter finalizes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]
RUNS = 5
DEADLINE_S = 300


def _run(out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CTX_TUNE_QUIET="1", OMP_NUM_THREADS="1",
               TRITON_CTX_TUNE_LOG_DIR=str(out / "logs"), TRITON_CTX_TUNE_CACHE_DIR=str(out / "cache"))
    if not torch.cuda.is_available():
        env.update(TRITON_INTERPRET="1", TRITON_CTX_TUNE_BACKEND="gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "exit_worker.py"), "--out", str(out)]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ranks still running after {DEADLINE_S} s (a hang at exit?):\n{(e.stderr or b'')[-4000:]!r}")


def test_two_ranks_exit_cleanly_after_tuning(tmp_path):
    if 0 < torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    for run in range(RUNS):
        out = tmp_path / f"run{run}"
        out.mkdir()
        proc = _run(out)
        assert "terminate called" not in proc.stderr, proc.stderr[-6000:]
        assert proc.returncode == 0, f"run {run}: torchrun exited {proc.returncode}\n{proc.stderr[-6000:]}"
        for rank in range(2):
            result = json.loads((out / f"exit.rank{rank}.json").read_text())
            assert result["ok"], result
            assert result["tuned"] == ["_add_one_exit (100, 'torch.float32')"], result  # the first call tuned
            assert result["blocks"] == {"(100, 'torch.float32')": 32}, result  # the real winner, not a fallback
            assert result["executions"][1] == 1, result  # the second call ran warm
            threads = json.loads((out / f"exit_threads.rank{rank}.json").read_text())
            if threads["gloo_threads_after_destroy"] is not None:  # Linux lists a process's threads
                assert threads["gloo_threads_after_destroy"] == [], threads  # the group was really destroyed
                assert threads["gloo_threads_at_exit"] == [], threads
            assert threads["tuner_threads_at_exit"] == [], threads
            assert threads["children_at_exit"] in ([], None), threads


_IMPORTED_AFTER_INIT = textwrap.dedent("""
    import sys, tempfile
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    world = dist.group.WORLD
    import triton_ctx_tune  # after init_process_group: it imports torch.distributed.nn now
    import torch._dynamo  # what decorating a function imports
    import torch.distributed.nn.functional as fn
    assert fn.all_reduce.__defaults__[-1] is None and fn.all_to_all_single.__defaults__[-1] is None
    dist.destroy_process_group()
    print("references", sys.getrefcount(world))  # 2: `world` and getrefcount's argument
    """)


def test_imported_after_init_process_group_it_leaves_no_reference_to_the_group():
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_CTX_TUNE_QUIET="1")
    proc = subprocess.run([sys.executable, "-c", _IMPORTED_AFTER_INIT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # (torch 2.8's gloo prints a line of its own when the group forms)
    ours = [line for line in proc.stdout.splitlines() if line.startswith("references")]
    assert ours == ["references 2"], proc.stdout  # nothing but the script's own `world`
