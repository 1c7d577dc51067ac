"""compile/shared_ptxas.py: one ptxas run per PTX on the node, and whatever happens to that run, every config still
gets a cubin made from its own PTX. Real locks (flock) between threads and processes; no GPU needed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from triton_ctx_tune.compile import shared_ptxas as S

ROOT = Path(__file__).resolve().parents[1]


def _runner(out: bytes, calls: list[str], name: str, delay_s: float = 0.0, fail: bool = False):
    def run() -> bytes:
        calls.append(name)
        time.sleep(delay_s)
        if fail:
            raise RuntimeError(f"ptxas failed in {name}")
        return out
    return run


def test_the_second_process_to_reach_a_ptx_waits_for_the_first_and_takes_its_cubin(tmp_path):
    calls: list[str] = []
    got: dict[str, bytes] = {}
    S.since_last()
    first = threading.Thread(target=lambda: got.update(a=S.build("k1", str(tmp_path), _runner(b"CUBIN", calls, "a",
                                                                                               delay_s=0.5))))
    first.start()
    time.sleep(0.1)  # "a" holds the lock and runs
    got["b"] = S.build("k1", str(tmp_path), _runner(b"OTHER", calls, "b"))
    first.join()
    assert calls == ["a"] and got == {"a": b"CUBIN", "b": b"CUBIN"}
    taken, waited_s = S.since_last()
    assert taken == 1 and 0.2 < waited_s < 5  # "b" waited about 0.4 s for "a"'s run
    assert S.since_last() == (0, 0.0)
    assert (tmp_path / "k1.out").read_bytes() == b"CUBIN"
    # A later compile of the same PTX finds it without a lock; another key runs its own.
    assert S.build("k1", str(tmp_path), _runner(b"X", calls, "c")) == b"CUBIN"
    assert S.build("k2", str(tmp_path), _runner(b"K2", calls, "d")) == b"K2"
    assert calls == ["a", "d"] and S.since_last()[0] == 1


def test_a_failed_run_leaves_nothing_and_the_waiter_runs_its_own(tmp_path):
    calls: list[str] = []
    errors: list[str] = []

    def failing() -> None:
        try:
            S.build("k", str(tmp_path), _runner(b"", calls, "a", delay_s=0.3, fail=True))
        except RuntimeError as e:
            errors.append(str(e))
    first = threading.Thread(target=failing)
    first.start()
    time.sleep(0.1)
    got = S.build("k", str(tmp_path), _runner(b"MINE", calls, "b"))
    first.join()
    assert errors == ["ptxas failed in a"]  # the holder's own config fails with its own error
    assert calls == ["a", "b"] and got == b"MINE"
    assert S.since_last()[0] == 0


def test_a_holder_killed_mid_run_drops_its_lock_and_the_waiter_runs_ptxas_itself(tmp_path):
    # Another process takes the lock (as a worker running ptxas would) and is killed, as a compile timeout does.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from triton_ctx_tune.compile import node_lock\n"
        "fd = node_lock.open_lock(sys.argv[1], 'k')\n"
        "assert node_lock.take(fd, wait=True)\n"
        "print('held', flush=True)\n"
        "time.sleep(3600)\n"), str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        threading.Timer(0.5, lambda: os.kill(holder.pid, signal.SIGKILL)).start()
        calls: list[str] = []
        began = time.monotonic()
        got = S.build("k", str(tmp_path), _runner(b"MINE", calls, "b"))
        assert got == b"MINE" and calls == ["b"]
        assert 0.4 < time.monotonic() - began < 30  # it waited for the holder, and not for ever
    finally:
        holder.kill()
        holder.wait(10)


def test_where_no_lock_can_be_made_each_runs_its_own(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    calls: list[str] = []
    assert S.build("k", str(blocked / "sub"), _runner(b"A", calls, "a")) == b"A"
    assert S.build("k", str(blocked / "sub"), _runner(b"B", calls, "b")) == b"B"
    assert calls == ["a", "b"]


def test_files_older_than_an_hour_are_removed_once_per_folder(tmp_path):
    old, new = tmp_path / "old.out", tmp_path / "new.out"
    for f in (old, new, tmp_path / "old.lock"):
        f.write_bytes(b"x")
    hour_ago = time.time() - S.KEEP_S - 10
    os.utime(old, (hour_ago, hour_ago))
    os.utime(tmp_path / "old.lock", (hour_ago, hour_ago))
    S._pruned.discard(str(tmp_path))
    S.build("k", str(tmp_path), lambda: b"K")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.lock", "k.out", "new.out"]


def test_the_key_ignores_num_stages_and_nothing_else_that_ptxas_sees():
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from triton_ctx_tune.runtime.compat import _ptxas_key
    backend = make_backend(GPUTarget("cuda", 90, 32))
    ptx = ".version 8.0\n.target sm_90a\n.visible .entry k() { ret; }\n"

    def key(src: str = ptx, **options: object) -> str:
        return _ptxas_key(backend, src, backend.parse_options({"num_warps": 4, "num_stages": 3, **options}), 90)
    assert key() == key(num_stages=1) == key(num_stages=4)
    assert key(enable_fp_fusion=False) != key()
    assert key(num_warps=8) != key()
    assert key(src=ptx.replace("ret", "exit")) != key()
    assert _ptxas_key(backend, ptx, backend.parse_options({"num_warps": 4}), 80) != key()


@pytest.mark.parametrize("var", ["TRITON_DISABLE_LINE_INFO", "PTXAS_OPTIONS"])
def test_the_key_follows_the_environment_that_changes_ptxas_output(monkeypatch, var):
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from triton_ctx_tune.runtime.compat import _ptxas_key
    backend = make_backend(GPUTarget("cuda", 90, 32))
    opts = backend.parse_options({})
    monkeypatch.delenv(var, raising=False)
    before = _ptxas_key(backend, "ptx", opts, 90)
    monkeypatch.setenv(var, "1")
    assert _ptxas_key(backend, "ptx", opts, 90) != before
    monkeypatch.setenv("TRITON_CTX_TUNE_QUIET", "0")  # ours: no part of ptxas's input
    after = _ptxas_key(backend, "ptx", opts, 90)
    monkeypatch.setenv("TRITON_CTX_TUNE_QUIET", "1")
    assert _ptxas_key(backend, "ptx", opts, 90) == after


def test_report_lists_same_binary_configs_apart_from_failures():
    """A config left out of the timing as another config's binary is not a failure: `report` words it under its own
    heading, after the real failures, and says "failures none" when there are no others."""
    from triton_ctx_tune.tools.report import KeyReport, format_key

    same = "the same binary as config 0: they differ only in num_stages"
    r = KeyReport("k", "(1,)", None, "tuned", configs=["BLOCK: 64, stages 1", "BLOCK: 64, stages 2", "BLOCK: 128"],
                  winner=0, ms=[0.5, None, None], q20=[0.5, None, None], q80=[0.5, None, None],
                  per_rank=[[0.5, None, None]],
                  failures={1: {"rank 0": same}, 2: {"ranks 0": "OutOfResources: shared"}})
    lines = [line for line in format_key(r) if line.lstrip().startswith(("failures", "same bin.", "#1 {", "#2 {"))]
    assert lines == ["  failures   #2 {BLOCK: 128}: ranks 0: OutOfResources: shared",
                     f"  same bin.  #1 {{BLOCK: 64, stages 2}}: rank 0: {same}"]
    r.failures = {1: {"rank 0": same}}
    assert "  failures   none" in format_key(r)


def test_only_configs_alike_but_for_num_stages_with_one_binary_are_timed_as_one():
    """precompile.same_binaries on compiled kernels' binaries and metadata (the fields Triton's CompiledKernel
    has): the first config of each group stands for the rest; another meta-parameter, a pre_hook, other metadata
    or another binary keeps a config in; a kernel without a binary (the interpreter) is never grouped."""
    from collections import namedtuple

    import triton

    from triton_ctx_tune.compile.precompile import same_binaries

    Meta = namedtuple("Meta", ["hash", "num_stages", "num_warps", "shared"])

    class Compiled:
        def __init__(self, cubin: bytes | None, stages: int, shared: int = 0) -> None:
            self.asm = {} if cubin is None else {"cubin": cubin}
            self.metadata = Meta(f"h{stages}{shared}", stages, 4, shared)

    def hook(nargs: dict) -> None:
        return None
    configs = [triton.Config({"B": 64}, num_stages=s) for s in (2, 3, 4)] + [
        triton.Config({"B": 128}, num_stages=2), triton.Config({"B": 64}, num_stages=5, pre_hook=hook),
        triton.Config({"B": 64}, num_stages=6), triton.Config({"B": 64}, num_stages=7),
        triton.Config({"B": 64}, num_stages=8)]
    kernels = {0: Compiled(b"A", 2), 1: Compiled(b"A", 3), 2: Compiled(b"A", 4), 3: Compiled(b"A", 2),
               4: Compiled(b"A", 5), 5: Compiled(b"A", 6, shared=1024), 6: Compiled(b"B", 7), 7: Compiled(None, 8)}
    same = same_binaries(configs, kernels)
    assert sorted(same) == [1, 2] and all(r.startswith("the same binary as config 0: ") for r in same.values())
    # Config 0 left out (it failed somewhere): the next of its group stands for the others.
    assert sorted(same_binaries(configs, {i: k for i, k in kernels.items() if i != 0})) == [2]
