"""Compile worker processes, for real: Triton compiles for a CUDA target (sm_90) without a GPU.

tests/workers_parent.py is a tuning process outside the interpreter; its workers compile the
kernels of tests/kernels.py to cubins in a temporary TRITON_CACHE_DIR with the wheel's ptxas,
and the parent's own compile-only launches must then find every one of them (no new cubin).
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HAS_CUDA
from tests.worker_kernels import HAS_CONSTEXPR_FUNCTION
from triton_ctx_tune.compile.compile_workers import BULK_NICE, FRONT_NICE, default_workers, front_workers

ROOT = Path(__file__).resolve().parents[1]
needs_constexpr_function = pytest.mark.skipif(not HAS_CONSTEXPR_FUNCTION,
                                              reason="needs tl.constexpr_function (Triton 3.5+)")


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(cache), TRITON_CTX_TUNE_QUIET="1", **extra)
    return env


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's reaping is left


def _all_gone(pids: list[int], within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _fresh_process(code: str, drop: tuple[str, ...] = (), **extra: str) -> list[str]:
    """Run `code` in a fresh Python process at the repository's root, without the environment's variables `drop`
    and with `extra`; its output's lines (it must exit 0)."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, **extra}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@functools.cache
def _run(scenarios: tuple[str, ...], cache: str, **extra: str) -> dict[str, dict[str, Any]]:
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers_parent.py"), *scenarios], cwd=ROOT,
                          env=_env(Path(cache), **extra), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {row["scenario"]: row for row in map(json.loads, proc.stdout.splitlines())}
    pids = {p for row in rows.values() for p in row["pids"] + row.get("pids_after", []) + [row.get("zygote", 0)] if p}
    assert _all_gone(sorted(pids)), "a worker outlived its parent's exit"  # atexit closed the pool
    return rows


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> dict[str, dict[str, Any]]:
    # LOCAL_RANK 1 of 2: the split scenario's precompile compiles configs 1 and 3 of 4 first.
    marker = tmp_path_factory.mktemp("preload") / "pids"
    rows = _run(("reuse", "split", "fallback", "cuda_import", "descriptor", "helpers"),
                str(tmp_path_factory.mktemp("triton-cache")),
                LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", PRELOAD_MARKER=str(marker))
    return {**rows, "preloaded": {"pids": sorted(int(p) for p in marker.read_text().split())}}


def test_workers_compile_real_binaries_that_the_parent_then_finds(healthy):
    row = healthy["reuse"]
    first, second = row["first"], row["second"]
    assert first["by_workers"] == [1, 2, 3] and first["new_cubins"] == 3
    # BLOCK 128 > LIMIT: tl.static_assert, reported by the worker. A compile error there rejects the config, it
    # does not exclude it: its launch compiles it again with the real arguments before it is called failed.
    assert first["failures"] == {} and list(first["rejected"]) == ["0"]
    assert first["rejected"]["0"].startswith("CompileTimeAssertionFailure: BLOCK over LIMIT")  # the cause first
    assert second["by_workers"] == [0, 1, 2] and second["new_cubins"] == 3 and second["failures"] == {}
    assert row["outer"]["by_workers"] == [0, 1, 2] and row["outer"]["new_cubins"] == 3
    # The parent's own compile-only launches after the workers' compiles were all hits in Triton's disk cache
    # (its compilation listener saw no miss): the worker's binary is under the key the parent looks up.
    for name in ("first", "second", "outer"):
        assert row[name]["compiled_here"] == 0, name
        assert row[name]["counts"] == {"workers": len(row[name]["by_workers"]), "here": 0, "ranks": 0, "cache": 0}, name
    # The parent compiled the same 6 configs again: every one a hit in Triton's cache, so the same keys.
    assert row["parent_new_cubins"] == 0
    # Each worker's compile reports the CPU seconds it took (its own and its ptxas's): some, and no more than its
    # wall time allows (one thread, one ptxas at a time).
    second = row["second"]
    assert sorted(second["cpu_s"]) == sorted(second["compile_s"]) == ["0", "1", "2"]
    assert all(0 < second["cpu_s"][i] <= second["compile_s"][i] + 0.05 for i in second["cpu_s"]), second


def test_workers_start_once_and_serve_every_later_key(healthy):
    pids = healthy["reuse"]["pids"]
    assert len(pids) == 3 and len(set(pids)) == 3 and os.getpid() not in pids  # 2 bulk workers, 1 front
    # start_compile_workers(preload=...) had the zygote import the kernels' module once, before it forked them.
    assert healthy["preloaded"]["pids"] == [healthy["reuse"]["zygote"]]
    for name in ("reuse", "split", "fallback"):
        assert healthy[name]["pids"] == pids, name
    assert healthy["reuse"]["pids_after"] == healthy["split"]["pids_after"] == pids


def test_each_local_rank_hands_its_own_share_to_its_workers(healthy):
    result = healthy["split"]["result"]
    assert result["mine"] == [1, 3] and result["by_workers"] == [1, 3] and result["failures"] == {}
    assert result["new_cubins"] == 4  # the others' share was then compiled here too: no rank 0 shared its cache


def test_kernels_a_fresh_process_cannot_import_are_compiled_by_workers_from_their_source(healthy):
    row = healthy["fallback"]
    for name in ("main", "local"):  # defined in __main__; built inside a function
        got = row[name]
        assert (got["mine"], got["by_workers"], got["failures"], got["new_cubins"]) == ([0, 1], [0, 1], {}, 2), name
        assert got["counts"] == {"workers": 2, "here": 0, "ranks": 0, "cache": 0} and got["compiled_here"] == 0, name
    threads = row["threads_only"]  # workers=0: this process compiles, and says so
    assert (threads["mine"], threads["by_workers"], threads["new_cubins"]) == ([0], [], 1)
    assert threads["counts"] == {"workers": 0, "here": 1, "ranks": 0, "cache": 0} and threads["compiled_here"] == 1


def test_a_kernel_module_that_touches_cuda_at_import_does_not_break_the_workers(healthy):
    """FLA asks the GPU for its name when imported; the workers never import the kernel's module."""
    result = healthy["cuda_import"]["result"]
    assert result["by_workers"] == [0, 1, 2], result
    assert result["by_workers"] == [0, 1, 2] and result["failures"] == {} and result["new_cubins"] == 3
    assert result["counts"] == {"workers": 3, "here": 0, "ranks": 0, "cache": 0} and result["compiled_here"] == 0


def test_a_host_tensor_descriptor_set_by_a_config_pre_hook_is_compiled_by_workers(healthy):
    """The persistent-matmul pattern: each config's pre_hook sets the descriptor's block_shape, part of the
    signature. The worker gets the signature of the hooked launch, and the parent's own launch of each
    config afterwards compiles nothing new."""
    row = healthy["descriptor"]
    result = row["result"]
    assert result["by_workers"] == [0, 1, 2] and result["failures"] == {} and result["rejected"] == {}
    assert result["counts"] == {"workers": 3, "here": 0, "ranks": 0, "cache": 0} and result["compiled_here"] == 0
    assert result["new_cubins"] == 3 and row["parent_new_cubins"] == 0


def test_helpers_laid_out_as_flas_are_rebuilt_in_the_worker(healthy):
    """One-line @triton.jit defs inside an if/else, after a helper with a default argument (fla/ops/utils/op.py):
    each is rebuilt from its own lines, not run on into the next."""
    result = healthy["helpers"]["result"]
    assert result["by_workers"] == [0, 1] and result["failures"] == {} and result["rejected"] == {}
    assert result["compiled_here"] == 0 and result["new_cubins"] == 2


def test_the_compile_counts_add_up_to_the_configs(healthy):
    """workers + in-process + Triton's cache == the configs compiled (the failed and rejected ones are in none)."""
    rows = [healthy["reuse"][k] for k in ("first", "second", "outer")] + [healthy["split"]["result"]]
    rows += [healthy["fallback"][k] for k in ("main", "local", "threads_only")] + [healthy["cuda_import"]["result"]]
    rows += [healthy["descriptor"]["result"], healthy["helpers"]["result"]]
    for r in rows:
        assert sum(r["counts"].values()) + len(r["failures"]) + len(r["rejected"]) == r["configs"], r
    # A warm repeat finds every binary in Triton's cache (the split scenario's 4 configs, compiled by then).
    assert healthy["split"]["result"]["counts"]["workers"] >= 2


def test_a_rank_whose_share_is_done_compiles_the_other_local_ranks_configs_before_the_step_ends(tmp_path):
    """The node's cores, not the rank's: local rank 1 of 2 compiles configs 1 and 3, then, while the execution
    would go on, its workers take the other rank's 2 and 0 (warming the shared cache); finish() then finds them
    there. No collective depends on it: finish() gathers the same shares as before."""
    row = _run(("steal",), str(tmp_path / "cache"), LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")["steal"]
    assert row["mine"] == [1, 3] and row["by_workers"] == [1, 3] and row["stolen"] == [0, 2]
    assert row["cubins_before_finish"] == 4 and row["new_cubins"] == 4 and row["compiled_here"] == 0
    assert row["places"] == {"0": "workers", "1": "workers", "2": "workers", "3": "workers"}
    assert row["counts"] == {"workers": 4, "here": 0, "ranks": 0, "cache": 0}


def test_at_a_cold_start_configs_wait_for_the_workers_instead_of_all_compiling_here(tmp_path):
    """Issue 37: a function decorated just before its call, the zygote still importing torch at the first key.
    Before, every config whose thread found no worker ready compiled on that thread, GIL-bound, long after the
    workers were ready (the first FLA key: 24 of 24 in the rank's process, 19 s). Now one config at a time
    compiles here while none is ready, and the workers take the rest once they are."""
    row = _run(("cold",), str(tmp_path / "cache"))["cold"]
    # The execution goes on with whichever config is ready first: config 0 compiled here at once while no worker
    # is ready, or another, when the workers came up meanwhile (config 0 then waits for one, ahead of the others).
    assert row["zygote_at_start"] == "booting" and row["first"] is not None
    assert row["failures"] == {} and row["rejected"] == {}
    counts = row["counts"]
    assert sum(counts.values()) == row["configs"] == 48 and counts["cache"] == 0
    assert counts["workers"] >= 1 and counts["workers"] == len(row["by_workers"])  # 24 of 48 on an idle 2-core VM
    assert row["seconds"] < 120


def test_two_keys_that_compile_the_same_binaries_compile_each_once(tmp_path):
    """The GEMM space's three shapes compiled the first rung's slowest configs once per key, each key from its own
    start. A binary being compiled for one key is waited for by the other, which then finds it in the cache."""
    row = _run(("twins",), str(tmp_path / "cache"))["twins"]
    assert row["keys"][0] != row["keys"][1] and row["failures"] == [0, 0]
    first, second = row["counts"]
    assert sum(first.values()) == sum(second.values()) == row["configs"] == 48
    # Every binary compiled once, in a worker or (the config an execution waits for, no worker free) here.
    assert row["new_cubins"] == 48
    assert first["workers"] + second["workers"] + first["here"] + second["here"] == 48
    assert first["cache"] + second["cache"] == 48 and first["ranks"] == second["ranks"] == 0


def test_two_processes_of_a_node_compile_each_binary_once(tmp_path):
    """Two local ranks each compiling the same 48 binaries (a budget's rung is compiled on every rank): each
    binary is compiled once on the node, by whichever process takes its lock first; the other process waits for
    it and finds it in the shared cache."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = _env(tmp_path / "cache", NODE_BARRIER=str(barrier))
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "workers_parent.py"), "node_rank"], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    rows = []
    for proc in procs:
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-4000:]
        rows.append(json.loads(out.splitlines()[-1]))
    assert all(row["failures"] == 0 and row["configs"] == 48 for row in rows)
    compiled = sum(row["counts"]["workers"] + row["counts"]["here"] for row in rows)
    assert compiled == 48 and sum(row["counts"]["cache"] for row in rows) == 48, rows
    assert len(list((tmp_path / "cache").glob("*/*.cubin"))) == 48
    assert _all_gone(sorted({p for row in rows for p in row["pids"]}))


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict[str, dict[str, Any]]:
    if not HAS_CONSTEXPR_FUNCTION:
        pytest.skip("needs tl.constexpr_function (Triton 3.5+)")
    return _run(("timeout", "crash", "deadline_alone", "deadline", "stragglers_fill_workers"),
                str(tmp_path_factory.mktemp("triton-cache")))


@needs_constexpr_function
def test_a_compile_past_its_limit_kills_the_worker_and_fails_the_config(broken):
    row = broken["timeout"]
    result = row["result"]
    assert result["failures"] == {"2": "compile timeout: compiling this config took longer than 8 s, so its compile "
                                       "worker was killed (raise compile_timeout_s or TRITON_CTX_TUNE_COMPILE_TIMEOUT "
                                       "if it is just slow)"}
    assert result["by_workers"] == [0, 1] and result["new_cubins"] == 2
    killed = set(row["pids"]) - set(row["pids_after"])
    assert len(killed) == 1 and len(row["pids_after"]) == 3  # replaced: the pool keeps its size
    assert row["seconds"] < 200  # the hung compile sleeps for an hour


@needs_constexpr_function
def test_a_budgets_first_rung_leaves_out_a_straggler_compile(broken):
    """A seconds budget's first rung does not wait for a config still compiling after 3x the median compile of the
    rung once half of it has compiled; a config alone is waited for up to the compile limit (a budget never leaves
    a key without a config that compiled). The straggler's worker is killed, as at a timeout: no thread is left
    waiting on it (one that was, at the process's exit, ended it with SIGABRT)."""
    row = broken["deadline"]
    (twin,) = row["twin"]
    for key in (row, twin):
        assert list(key["failures"]) == ["2"]
        assert key["failures"]["2"].startswith("not explored: still compiling after ")
        assert key["failures"]["2"].endswith(" s, 3x the median compile of the budget's first rung (it does not "
                                              "wait for stragglers)")
    # The two keys compile the same binaries: each compiled once, in a worker, by whichever key claimed it first;
    # the other key waited for it and found it in the cache (and the straggler failed for both, once). Which key
    # claims which depends on the threads' order; the two that compiled count towards either key's half.
    assert {row["places"]["0"], twin["places"]["0"]} == {row["places"]["1"], twin["places"]["1"]} == \
        {"workers", "cache"}
    assert {k: row["counts"][k] + twin["counts"][k] for k in row["counts"]} == \
        {"workers": 2, "here": 0, "ranks": 0, "cache": 2}
    assert row["seconds"] < 60.0  # neither key waited for the worker's own limit (workers_parent.LIMIT_BESIDE_S)
    alone = broken["deadline_alone"]
    assert list(alone["failures"]) == ["0"] and alone["failures"]["0"].startswith("compile timeout: compiling this "
                                                                                  "config took longer than 8 s")
    assert alone["seconds"] >= 8.0


@needs_constexpr_function
def test_a_budgets_first_rung_with_as_many_stragglers_as_workers_compiles_its_cheapest_first(broken):
    """A budget's first rung hands its configs out cheapest first: slowest first, two stragglers held both
    workers before half of the rung had compiled, and only the compile limit (60 s here) ended them."""
    row = broken["stragglers_fill_workers"]
    hanging = {i for i, (block, _) in row["blocks"].items() if block == 64}
    assert len(hanging) == 2 and set(row["failures"]) == hanging
    assert all(r.startswith("not explored: still compiling after ") for r in row["failures"].values())
    assert row["places"] == {i: "workers" for i in row["blocks"] if i not in hanging}
    assert row["counts"] == {"workers": 4, "here": 0, "ranks": 0, "cache": 0}
    assert row["seconds"] < 60.0


@needs_constexpr_function
def test_a_worker_that_crashes_fails_its_config_only_and_is_replaced(broken):
    row = broken["crash"]
    result = row["result"]
    assert result["failures"] == {"2": "compile worker crashed: its process ended with signal SIGSEGV while "
                                       "compiling this config (a crash in Triton's compiler); the worker was replaced"}
    assert result["by_workers"] == [0, 1] and result["new_cubins"] == 2
    assert len(set(row["pids"]) - set(row["pids_after"])) == 1 and len(row["pids_after"]) == 3
    assert row["pids"] == broken["timeout"]["pids_after"]  # the same pool went on from the timeout scenario


def test_workers_exit_when_their_parent_is_killed(tmp_path):
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workers_parent.py"), "hold"], cwd=ROOT,
                            env=_env(tmp_path / "cache"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # after the workers have started
        row = json.loads(line)
        assert len(row["pids"]) == 3 and all(_alive(p) for p in row["pids"] + [row["zygote"]])
    finally:
        proc.send_signal(signal.SIGKILL)  # no atexit: only the zygote's and the workers' own watch can end them
        proc.wait(timeout=60)
    assert _all_gone(row["pids"] + [row["zygote"]]), "orphaned workers"


def test_the_default_path_forks_a_worker_per_core_from_the_zygote_that_the_import_started(tmp_path):
    """Without start_compile_workers() or an option: more than one compile process per node (on CI's 2 cores,
    2 workers; one local rank)."""
    row = _run(("default",), str(tmp_path / "cache"))["default"]
    cores = len(os.sched_getaffinity(0))
    assert row["before"] in ("booting", "ready") and row["at_decoration"] in ("booting", "ready")
    assert row["n"] == default_workers() == min(32, cores) and row["n"] >= 2
    status = row["status"]
    front = front_workers(row["n"])
    assert (status["ready"], status["front"], status["booting"], status["boot_failures"]) == (row["n"] + front, front,
                                                                                              0, 0)
    assert status["zygote"]["state"] == "ready" and len(row["pids"]) == row["n"] + front
    assert row["parents"] == [row["zygote"]]  # forked by the zygote, not started (and importing torch) one by one
    # The first key forked the pool: its compiles waited the milliseconds the forks took rather than running
    # on threads (no execution waits for one of them here).
    first = row["first"]
    assert (first["mine"], first["by_workers"], first["failures"], first["new_cubins"]) == ([0, 1, 2], [0, 1, 2], {},
                                                                                          3), row
    assert first["counts"] == {"workers": 3, "here": 0, "ranks": 0, "cache": 0} and first["compiled_here"] == 0
    # Once the pool has started, the workers compile every config; the one too big fails there.
    second = row["second"]
    assert second["by_workers"] == [1, 2, 3] and list(second["rejected"]) == ["0"] and second["new_cubins"] == 3


def test_default_worker_count_shares_the_cores_among_local_ranks(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert default_workers() == min(32, cores)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 2))
    assert default_workers() == 1


def test_compile_workers_option_is_checked_and_the_interpreter_uses_none(monkeypatch):
    from triton_ctx_tune import InvalidOptionError, contextual_autotune
    from triton_ctx_tune.options import TuneOptions

    for bad in (-1, True, 2.0):
        with pytest.raises(InvalidOptionError, match=r"compile_workers=.* is not valid: expected an int >= 0 "
                           r"\(0: compile on threads only\), or None for the default\."):
            contextual_autotune(compile_workers=bad)
    monkeypatch.setenv("TRITON_CTX_TUNE_COMPILE_WORKERS", "3")
    assert TuneOptions().compile_workers is None
    assert TuneOptions(compile_workers=5).resolved_compile_workers() == (5 if HAS_CUDA else 0)  # interpreter: none
    monkeypatch.setenv("TRITON_CTX_TUNE_COMPILE_WORKERS", "x")
    with pytest.raises(InvalidOptionError, match="TRITON_CTX_TUNE_COMPILE_WORKERS='x' is not valid"):
        TuneOptions()


def test_the_config_an_execution_waits_for_takes_the_next_free_worker_first(tmp_path):
    """Issue 37: it once compiled in the rank's process whenever no worker was idle (7.3 s under the GIL against
    3.8 s in a worker, for FLA's largest config); now it waits up to FIRST_WAIT_S, ahead of every other config."""
    rows = _run(("urgent", "first_in_grace"), str(tmp_path / "triton-cache"))
    row = rows["urgent"]
    assert row["first"] == ["urgent"] and row["order"] == ["urgent", "plain"]
    # Also while the pool's first workers count as being forked (a job's first 2 s): before, the config the
    # execution waited for gave up after 50 ms and compiled here whenever the ready workers were busy.
    grace = rows["first_in_grace"]
    assert grace["in_grace"] and grace["failures"] == 0 and grace["first"] is not None
    assert set(grace["places"].values()) == {"workers"}
    assert grace["counts"] == {"workers": grace["configs"], "here": 0, "ranks": 0, "cache": 0}


def test_a_small_key_met_while_the_bulk_workers_are_busy_compiles_at_once_on_the_front_workers(tmp_path):
    """FLA's chunk_bwd_kernel_dqkwg (6 configs, met 2 s into the step) waited 0.34 to 0.46 s for a place, all 16
    held by the large keys met before it, and its 6 s compiles shared the cores with theirs (RESULTS.md section 51)."""
    row = _run(("front",), str(tmp_path / "triton-cache"))["front"]
    assert front_workers(4) == 2 and len(row["pids"]) == 6
    assert row["held"] == [False] * 4  # a config that waited for a place takes bulk workers only
    assert row["front_nice"] == [min(row["own_nice"] + FRONT_NICE, 19)] * 2
    assert row["bulk_nice"] == [min(row["own_nice"] + BULK_NICE, 19)] * 4
    small, large = row["small"], row["large"]
    assert small["done_while_held"] and small["ready_while_held"] == [0, 1] and small["by_workers"] == [0, 1]
    # The large key's first (its cheapest, BLOCK 16) compiles on a front worker; the two others wait for a place.
    assert large["order"][0] == 0 and not large["done_while_held"] and large["ready_while_held"] == [0]
    assert large["by_workers"] == [0, 1, 2] and large["counts"] == {"workers": 3, "here": 0, "ranks": 0, "cache": 0}


def test_importing_the_package_starts_the_compiler_hash_and_the_zygote_unless_interpreting():
    """A function decorated just before its first call waited 0.45 s for the hash (RESULTS.md, section 36), and met
    its first keys before the zygote it started was ready: both start at the package's import now (the hash on a
    daemon thread: no exit waits for it). Not under the interpreter, which compiles nothing; no zygote when
    TRITON_CTX_TUNE_COMPILE_WORKERS=0."""
    code = ("import importlib, json, triton_ctx_tune; from triton_ctx_tune.runtime import compat\n"
            "from triton_ctx_tune.compile import compile_workers\n"
            "t = compat._priming.get('hash')\n"
            "out = {'started': sorted(compat._priming), 'daemon': t.daemon if t else None,\n"
            "       'zygote': compile_workers.zygote_state() is not None}\n"
            "zygote_pid = compile_workers.get_zygote().pid if out['zygote'] else None\n"
            "if t: t.join()\n"
            "homes = [importlib.import_module(m) for m in ('triton.runtime.cache', 'triton.compiler.compiler')]\n"
            "key = [m.triton_key for m in homes if hasattr(m, 'triton_key')][0]\n"
            "out['cached'] = key.cache_info().currsize\n"
            "print(json.dumps(out)); print(json.dumps(zygote_pid))")
    rows = {}
    for name, extra in (("compiling", {"TRITON_INTERPRET": "0"}), ("interpreter", {"TRITON_INTERPRET": "1"}),
                        ("workers off", {"TRITON_INTERPRET": "0", "TRITON_CTX_TUNE_COMPILE_WORKERS": "0"})):
        *_, row, zygote = _fresh_process(code, ("TRITON_CTX_TUNE_COMPILE_WORKERS",), **extra)
        rows[name] = json.loads(row)
        if (pid := json.loads(zygote)) is not None:  # the exit took it along (killed while still importing)
            assert _all_gone([pid]), "the zygote outlived the process that imported the package"
    assert rows["compiling"] == {"started": ["hash"], "daemon": True, "zygote": True, "cached": 1}
    assert rows["interpreter"] == {"started": [], "daemon": None, "zygote": False, "cached": 0}
    assert rows["workers off"] == {"started": ["hash"], "daemon": True, "zygote": False, "cached": 1}


def test_a_process_prepared_as_the_zygote_compiles_its_first_config_without_importing_anything():
    """Each worker's first compile paid for importing Triton's code generator (0.13 to 0.15 s instead of 0.07 s
    here): the zygote imports it before it forks (compat.preload_compiler), as it primes the compiler hash. A
    real compile for sm_90 in a fresh process prepared as the zygote is; a Triton that imports more at a compile
    fails this, and preload_compiler is where it goes."""
    code = ("import json, sys, tempfile, triton, triton.backends\n"
            "from triton.backends.compiler import GPUTarget\n"
            "from triton.compiler import ASTSource\n"
            "from triton_ctx_tune.runtime import compat\n"
            "from tests.kernels import add_one_  # (autotuned: .fn is its JITFunction)\n"
            "compat.prime_compiler_hash(); compat.preload_compiler()\n"
            "before = set(sys.modules)\n"
            "src = ASTSource(add_one_.fn, {'x_ptr': '*fp32', 'n': 'i32', 'BLOCK': 'constexpr'}, {'BLOCK': 64})\n"
            "kernel = triton.compile(src, target=GPUTarget('cuda', 90, 32))\n"
            "print(json.dumps({'new': sorted(m for m in set(sys.modules) - before if m.startswith('triton')),\n"
            "                  'cubin': len(kernel.asm['cubin'])}))")
    with tempfile.TemporaryDirectory() as cache:
        lines = _fresh_process(code, ("TRITON_INTERPRET",), TRITON_CACHE_DIR=cache, TRITON_CTX_TUNE_COMPILE_WORKERS="0")
    row = json.loads(lines[-1])
    assert row["new"] == []
    assert row["cubin"] > 0


def test_the_execution_launches_its_first_config_only_once_the_launcher_being_built_is(tmp_path):
    """Triton 3.4 to 3.6 build a C launcher per kernel signature at a binary's first load. The build starts when the
    key's configs are described (compat.prebuild_launcher); the execution's first launch used to wait for it only
    when the first config ready was the one it had asked for first, and otherwise ran the C compiler again on its
    path (the example's first call on 2 H200s: 0.5 to 0.8 s per signature, RESULTS.md section 39)."""
    row = _run(("launcher_wait",), str(tmp_path / "triton-cache"))["launcher_wait"]
    assert row["failures"] == 0 and row["first"] in range(row["configs"])
    assert row["after_build"] is True
    assert row["launcher_wait_s"] >= 0.4  # the build ended half a second after a config was ready


def test_a_keys_threads_run_ptxas_for_the_backends_hash_once(tmp_path):
    """Every compile's cache key holds the backend's hash, for CUDA the version `ptxas --version` prints (lru_cached):
    the threads describing a fresh process's first key each missed it and ran ptxas. Precompile computes it once
    before they start (compat.prime_backend_hash)."""
    row = _run(("ptxas_once",), str(tmp_path / "triton-cache"))["ptxas_once"]
    assert row["before"] == 0  # nothing in this process had asked yet
    assert row["after"] == 1
    assert row["failures"] == 0 and row["configs"] == 48


def test_configs_that_make_one_ptx_run_ptxas_once_on_the_node_and_each_keeps_its_own_entry(tmp_path):
    """Configs that differ only in num_stages, on a kernel with no loop, compile to one PTX: five workers compiling
    five configs at once ran ptxas on it once, and the other three of its configs took its cubin
    (compile/shared_ptxas.py). The config on 4 warps is another PTX and ran its own."""
    row = _run(("shared_ptxas",), str(tmp_path / "triton-cache"))["shared_ptxas"]
    assert row["failures"] == 0 and row["by_workers"] == [0, 1, 2, 3, 4]
    assert len(row["shared_ptxas"]) == 3 and set(row["shared_ptxas"]) < {0, 1, 2, 4}
    bins = row["binaries"]
    assert sorted(bins) == ["2w1s", "2w2s", "2w3s", "2w4s", "4w1s"]  # each config's own entry, its num_stages
    assert bins["2w1s"] == bins["2w2s"] == bins["2w3s"] == bins["2w4s"] != bins["4w1s"]
    assert len(row["memo"]) == 2  # one cubin per PTX left for the node
    # Configs 1 and 2 launch what config 0 launches: timed as config 0, not failed (precompile.same_binaries).
    # Config 4 has config 0's binary but a pre_hook of its own: its launch differs, and it is timed.
    assert row["same_binary"] == {str(i): "the same binary as config 0: they differ only in num_stages, which changes "
                                          "nothing this kernel compiles to, so config 0's time is its time"
                                  for i in (1, 2)}


def test_decorating_imports_the_code_generator_that_the_first_description_would():
    """A fresh process's first description of a config imported Triton's code generator, on one thread while the
    key's other threads waited: the decoration's priming thread imports it now (compat._prime_driver)."""
    code = ("import json, sys, triton_ctx_tune\n"
            "from triton_ctx_tune.runtime import compat\n"
            "out = {'import': 'triton.compiler.code_generator' in sys.modules}\n"
            "@triton_ctx_tune.contextual_autotune()\n"
            "def f():\n"
            "    pass\n"
            "compat._priming['driver'].join()\n"
            "out['decoration'] = 'triton.compiler.code_generator' in sys.modules\n"
            "print(json.dumps(out))")
    lines = _fresh_process(code, ("TRITON_INTERPRET", "TRITON_CTX_TUNE_COMPILE_WORKERS"))
    assert json.loads(lines[-1]) == {"import": False, "decoration": True}
