"""A tuning process that compiles for an H100 without a GPU: the parent side of the compile-worker tests.

Run without TRITON_INTERPRET, it installs compat's compile-only driver for GPUTarget("cuda", 90, 32),
so Triton really compiles (to cubins in TRITON_CACHE_DIR, with the wheel's ptxas) in the real worker
processes and in this process. Only the load of a binary onto a GPU, which needs one, is skipped.
Prints one JSON line per scenario.

    python tests/workers_parent.py SCENARIO...
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton.backends.compiler import GPUTarget  # noqa: E402

from triton_ctx_tune.runtime import compat  # noqa: E402

compat.use_compile_only_driver(GPUTarget("cuda", 90, 32))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests import kernels as K  # noqa: E402
from tests import worker_kernels as W  # noqa: E402
from tests.kernels import block_configs  # noqa: E402
from triton_ctx_tune.compile import precompile as P  # noqa: E402
from triton_ctx_tune.compile.compile_workers import get_pool, start_compile_workers  # noqa: E402
from triton_ctx_tune.engine.state import KeyState  # noqa: E402
from triton_ctx_tune.runtime.collectives import Collectives  # noqa: E402

P.load_binary = lambda kernel: None  # loading onto a GPU is the one step this machine cannot take
CACHE = Path(os.environ["TRITON_CACHE_DIR"])


@triton.autotune(configs=block_configs([16, 32]), key=["n"])
@triton.jit
def main_add_one_(x_ptr, n, BLOCK: tl.constexpr):  # in __main__: a fresh process cannot import it
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w, num_stages=st) for b in (16, 32, 64, 128)
                          for w in (1, 2, 4, 8) for st in (1, 2, 3)], key=["n"])
@triton.jit
def many_configs_add_one_(x_ptr, n, BLOCK: tl.constexpr):  # 48 configs: longer than the zygote's start
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 5, mask=offs < n)


def _noop_hook(nargs: dict[str, Any]) -> None:
    return None


# Five configs, four of them one PTX: the kernel has no loop, so num_stages changes nothing it compiles to. The
# fifth has a pre_hook: its binary is the first's, its launch is not.
@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2, num_stages=st) for st in (1, 2, 3)]
                 + [triton.Config({"BLOCK": 64}, num_warps=4, num_stages=1),
                    triton.Config({"BLOCK": 64}, num_warps=2, num_stages=4, pre_hook=_noop_hook)], key=["n"])
@triton.jit
def stages_blind_add_one_(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 7, mask=offs < n)


def _local_kernel() -> Any:
    @triton.autotune(configs=block_configs([16, 32]), key=["n"])
    @triton.jit
    def local_add_one_(x_ptr, n, BLOCK: tl.constexpr):  # built in a function: nowhere to import it from
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 3, mask=offs < n)
    return local_add_one_


class LocalRanks(Collectives):
    """Two local ranks of one node as this rank (LOCAL_RANK) sees them; the other rank fails nothing."""

    def __init__(self) -> None:
        super().__init__(False)
        self.world = 2

    @property
    def active(self) -> bool:
        return True

    def share_failures(self, failures: dict[int, str], n: int, what: str) -> dict[int, str]:
        return dict(failures)


def cubins() -> int:
    return len(list(CACHE.glob("*/*.cubin")))


MISSES: list[str] = []  # kernels this process compiled itself (Triton's disk cache did not have them)


def _listen(*, src: Any, cache_hit: bool, **_: Any) -> None:
    if not cache_hit:
        MISSES.append(src.name)


triton.knobs.compilation.listener = _listen


def key_state(at: Any, args: tuple, kwargs: dict[str, Any]) -> KeyState:
    """A key of `at` for these arguments, as the executor makes one (one warm-up, one timed slot)."""
    return KeyState(autotuner=at, key=compat.tuning_key(at, args, kwargs), configs=list(at.configs), n_warmup=1,
                    n_repeat=1, kernel=compat.kernel_name(at))


def tune(at: Any, n: int, comm: Collectives | None = None, timeout_s: float = math.inf, workers: int = 2,
         args: tuple | None = None, **kwargs: Any) -> dict[str, Any]:
    args = (torch.zeros(n), n) if args is None else args
    kwargs = {"grid": (1,), "warmup": False, **kwargs}
    state = key_state(at, args, kwargs)
    before, misses = cubins(), len(MISSES)
    done = P.precompile(state, args, kwargs, comm or Collectives(False), threads=2, timeout_s=timeout_s,
                        workers=workers)
    return {"mine": done.mine, "by_workers": done.by_workers, "failures": {str(i): r for i, r in done.failures.items()},
            "rejected": {str(i): r for i, r in done.rejected.items()},
            "new_cubins": cubins() - before, "counts": done.counts(), "compiled_here": len(MISSES) - misses,
            "undescribed": {str(i): r for i, r in done.undescribed.items()}, "stolen": done.stolen,
            "configs": len(state.configs), "unusable": (done.workers or {}).get("unusable", {}),
            "compile_s": {str(i): s for i, s in done.compile_s.items()},
            "cpu_s": {str(i): s for i, s in done.cpu_s.items()}}


def parent_hits(at: Any, n: int, blocks: list[int], **kwargs: Any) -> int:
    """New cubins when this process compiles those configs itself: 0 if the workers' keys were the same."""
    before = cubins()
    x = torch.zeros(n)
    for c in at.configs:
        if c.kwargs["BLOCK"] in blocks:
            compat.compile_only(at, [c], (x, n), {"grid": (1,), **kwargs})
    return cubins() - before


def parent_hits_desc(PK: Any, config: Any) -> int:
    """New cubins when this process compiles a descriptor config itself (hooked as its launch would be)."""
    before = cubins()
    x, y = torch.zeros(256), torch.zeros(256)
    compat.compile_only(PK.desc_double, [config], (PK.descriptor(x), y, 256), {"grid": (1,)})
    return cubins() - before


def places(batch: Any) -> dict[str, str]:
    """Where each config of a precompile's batch was compiled: a worker, here, the cache (another key's compile)."""
    return {str(i): p for i, p in sorted(batch.places.items())}


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def default_path() -> dict[str, Any]:
    """No set-up call, no option: the package's import started the zygote (decorating a function would have, had it
    not), and tuning forks the default number of workers from it."""
    from triton_ctx_tune import contextual_autotune
    from triton_ctx_tune.compile import compile_workers as CW
    from triton_ctx_tune.options import TuneOptions

    before = CW.zygote_state()

    @contextual_autotune()
    def op(x: torch.Tensor) -> torch.Tensor:  # never called: decorating is what starts the zygote
        return x

    at_decoration = CW.zygote_state()
    n = TuneOptions().resolved_compile_workers()
    assert CW.get_zygote().wait_ready(240), "the zygote did not start"  # the program's own set-up, meanwhile
    first = tune(K.double_, 1000, workers=n)  # forks the pool, and waits for its workers
    pool = get_pool(n)
    assert pool.wait_ready(240), "workers did not start"
    second = tune(K.limited_add_one_, 100, workers=n, LIMIT=64)  # every worker has started now
    status = pool.status()
    return {"before": before, "at_decoration": at_decoration, "n": n, "status": status, "first": first,
            "second": second, "pids": pool.pids(), "zygote": status["zygote"]["pid"],
            "parents": sorted({ppid(p) for p in pool.pids()})}


def cold_start() -> dict[str, Any]:
    """A function decorated just before its first call: the zygote is still starting when the first key's
    configs start. The execution waits for one config (config 0 compiled in this process at once while no worker
    is ready); the others wait for the workers (at most one more at a time here) instead of all compiling here,
    GIL-bound (issue 37)."""
    from triton_ctx_tune.compile import compile_workers as CW

    CW.shutdown()  # the zygote this package's import started is ready by now: this scenario is one still booting
    CW.get_zygote()  # as decorating just before the call does, had the import not started one; not waited for
    at = many_configs_add_one_
    x = torch.zeros(100)
    args, kwargs = (x, 100), {"grid": (1,), "warmup": False}
    state = key_state(at, args, kwargs)
    zygote_at_start = CW.zygote_state()
    began = time.monotonic()
    compiling = P.start(state, args, kwargs, Collectives(False), threads=2, workers=2)
    first = compiling.first_ready()
    first_s = time.monotonic() - began
    done = compiling.finish(Collectives(False))
    return {"zygote_at_start": zygote_at_start, "first": first, "first_s": first_s,
            "seconds": time.monotonic() - began, "counts": done.counts(), "by_workers": done.by_workers,
            "failures": done.failures, "rejected": done.rejected, "configs": len(state.configs),
            "pids": get_pool(2).pids(), "zygote": get_pool(2).zygote.pid}


def front_first() -> dict[str, Any]:
    """Four bulk workers, two front ones. With every bulk worker held (a large key's compiles), a key of 2 configs
    (no more than the front) compiles both at once on the front workers; of a key of 3, only its first config does,
    and the others wait for a place. Bulk workers run at BULK_NICE above this process, front ones at FRONT_NICE."""
    start_compile_workers(4)
    pool = get_pool(4)
    assert pool.wait_ready(240), "workers did not start"
    kinds = {w.pid: w.front for w in pool._workers if w.state != "dead"}
    nice = {pid: os.getpriority(os.PRIO_PROCESS, pid) for pid in kinds}
    held = [pool.acquire(5.0) for _ in range(4)]  # (not front: bulk workers only)
    out: dict[str, Any] = {"pids": pool.pids(), "zygote": pool.zygote.pid,
                           "own_nice": os.getpriority(os.PRIO_PROCESS, 0),
                           "front_nice": sorted(n for pid, n in nice.items() if kinds[pid]),
                           "bulk_nice": sorted(n for pid, n in nice.items() if not kinds[pid]),
                           "held": sorted(w.front for w, _ in held if w is not None)}
    for name, blocks, n in (("small", [16, 32], 4096), ("large", [16, 32, 64], 97)):
        at = triton.autotune(configs=block_configs(blocks), key=["n"])(K.double_.fn)
        args, kwargs = (torch.zeros(n), n), {"grid": (1,), "warmup": False}
        compiling = P.start(key_state(at, args, kwargs), args, kwargs, Collectives(False), threads=5, workers=4)
        out[name] = {"done_while_held": compiling.wait(60.0 if name == "small" else 3.0),
                     "ready_while_held": sorted(compiling.ready_here()), "order": compiling.mine}
        if name == "large":
            for worker, _ in held:
                pool._release(worker, replace=False)
        done = compiling.finish(Collectives(False))
        out[name].update(by_workers=done.by_workers, counts=done.counts())
    return out


def urgent_first(pool: Any) -> dict[str, Any]:
    """Both workers busy; a config waits for one, then the config an execution waits for (urgent) asks too: the
    first worker to be free goes to the urgent one, although the other asked first."""
    import threading

    held = [pool.acquire(5.0), pool.acquire(5.0)]
    got: list[str] = []

    def ask(who: str, urgent: bool) -> None:
        acquired = pool.acquire(10.0, urgent=urgent)
        got.append(who)
        if acquired is not None:
            time.sleep(0.3)  # it compiles meanwhile
            pool._release(acquired[0], replace=False)

    plain = threading.Thread(target=ask, args=("plain", False))
    plain.start()
    time.sleep(0.2)
    urgent = threading.Thread(target=ask, args=("urgent", True))
    urgent.start()
    time.sleep(0.2)
    pool._release(held[0][0], replace=False)  # one worker is free
    time.sleep(0.1)
    first = list(got)
    pool._release(held[1][0], replace=False)
    plain.join(15)
    urgent.join(15)
    return {"first": first, "order": got}


def first_in_fork_grace(pool: Any) -> dict[str, Any]:
    """Within FORK_GRACE_S of the pool's making (a job's first keys), both workers busy: the config an execution
    waits for takes the next free worker, ahead of the others, rather than compile here at once (FLA's
    chunk_fwd_kernel_o, met 1.1 s in: 0.74 to 0.91 s here against 0.54 s in a worker, on the execution's path)."""
    import threading

    held = [pool.acquire(5.0), pool.acquire(5.0)]
    pool.made = time.monotonic()  # as at its making: its workers count as being forked
    in_grace = pool.forking()
    at, n = K.double_, 2000  # a size no other scenario of this process compiles
    args, kwargs = (torch.zeros(n), n), {"grid": (1,), "warmup": False}
    state = key_state(at, args, kwargs)

    def free(worker: int, after_s: float) -> None:
        # Worker 0 is freed once a config waits for a worker as the urgent one (or after 3 s): a config that
        # gave up on the workers has compiled here by then.
        deadline = time.monotonic() + after_s
        while worker == 0 and not pool._urgent and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(max(0.0, deadline - time.monotonic()) if worker else 0.0)
        pool._release(held[worker][0], replace=False)

    freeing = [threading.Thread(target=free, args=(0, 3.0)), threading.Thread(target=free, args=(1, 4.0))]
    for t in freeing:
        t.start()
    compiling = P.start(state, args, kwargs, Collectives(False), threads=2, workers=2)
    first = compiling.first_ready()
    done = compiling.finish(Collectives(False))
    for t in freeing:
        t.join()
    return {"in_grace": in_grace, "first": first, "places": places(done), "counts": done.counts(),
            "failures": len(done.failures) + len(done.rejected), "configs": len(state.configs)}


def launcher_wait() -> dict[str, Any]:
    """A build of the kernel's launcher is under way (as compat.prebuild_launcher starts one when a key's configs
    are described, on Triton 3.4 to 3.6; here a thread that ends half a second after the first config is ready):
    first_ready() hands the execution a config only once that build has ended, whichever config is ready first.
    Launched before, Triton's load would run the C compiler for it again, on the execution's path."""
    import threading

    at, n = K.double_, 3000  # a size no other scenario of this process compiles
    args = (torch.zeros(n), n)
    kwargs = {"grid": (1,), "warmup": False}
    captured = compat.capture_compile(at, at.configs[0], args, kwargs)
    assert captured is not None
    key = compat._launcher_key(captured[0].signature)
    release, released_at = threading.Event(), []
    builder = threading.Thread(target=release.wait, args=(30.0,), name="ctx-tune-launcher", daemon=True)
    with compat._LAUNCHERS_LOCK:
        compat._LAUNCHERS[key] = builder
    builder.start()
    state = key_state(at, args, kwargs)
    compiling = P.start(state, args, kwargs, Collectives(False), threads=2, workers=2)

    def end_build() -> None:
        with compiling._cond:
            compiling._cond.wait_for(lambda: bool(compiling._ready), 60.0)
        time.sleep(0.5)
        released_at.append(time.monotonic())
        release.set()

    ender = threading.Thread(target=end_build)
    ender.start()
    first = compiling.first_ready()
    returned_at = time.monotonic()
    done = compiling.finish(Collectives(False))
    ender.join()
    with compat._LAUNCHERS_LOCK:
        compat._LAUNCHERS.pop(key, None)
    return {"first": first, "after_build": bool(released_at) and returned_at >= released_at[0],
            "launcher_wait_s": done.phases.get("launcher_wait_s", 0.0), "configs": len(state.configs),
            "failures": len(done.failures) + len(done.rejected)}


def ptxas_once() -> dict[str, Any]:
    """A fresh process's first key, its configs described on 8 threads at once: the backend's hash (for CUDA, what
    `ptxas --version` prints, lru_cached) is computed once, before the threads start (compat.prime_backend_hash),
    not by every thread that missed the cache."""
    from triton.backends.nvidia import compiler as nvidia

    before = nvidia.get_ptxas_version.cache_info().misses
    at, n = many_configs_add_one_, 112
    args, kwargs = (torch.zeros(n), n), {"grid": (1,), "warmup": False}
    done = P.start(key_state(at, args, kwargs), args, kwargs, Collectives(False), threads=8,
                   workers=0).finish(Collectives(False))
    return {"pids": [], "before": before, "after": nvidia.get_ptxas_version.cache_info().misses,
            "failures": len(done.failures) + len(done.rejected), "configs": len(at.configs)}


def shared_ptxas() -> dict[str, Any]:
    """Five workers compile five configs at once, four of which make the same PTX: ptxas runs on it once, and the
    other three configs take its cubin (compile/shared_ptxas.py). Every config's binary is in Triton's cache under its
    own key, with its own num_stages in its metadata; the two are left out of the timing as the first's binary."""
    start_compile_workers(5)
    pool = get_pool(5)
    assert pool.wait_ready(240), "workers did not start"
    at, n = stages_blind_add_one_, 64
    args, kwargs = (torch.zeros(n), n), {"grid": (1,), "warmup": False}
    done = P.precompile(key_state(at, args, kwargs), args, kwargs, Collectives(False), threads=4, timeout_s=120.0,
                        workers=5)
    binaries = {}
    for meta in CACHE.glob("*/stages_blind_add_one_.json"):
        m = json.loads(meta.read_text())
        cubin = meta.with_suffix(".cubin").read_bytes()
        binaries[f"{m['num_warps']}w{m['num_stages']}s"] = hashlib.sha256(cubin).hexdigest()
    return {"pids": pool.pids(), "by_workers": done.by_workers, "shared_ptxas": done.shared_ptxas,
            "same_binary": {str(i): r for i, r in done.same_binary.items()},
            "failures": len(done.failures) + len(done.rejected), "binaries": binaries,
            "memo": sorted(p.name for p in (CACHE / "ctx_tune_ptxas").glob("*.out"))}


LIMIT_BESIDE_S = 60.0  # the "deadline" scenario's compile limit: the straggler cutoff must come first


def scenario(name: str) -> dict[str, Any]:
    if name == "default":
        return default_path()
    if name == "cold":
        return cold_start()
    if name == "ptxas_once":
        return ptxas_once()
    if name == "front":
        return front_first()
    if name == "shared_ptxas":
        return shared_ptxas()
    # As a training script would during its set-up; later scenarios find the same pool.
    start_compile_workers(2, preload=("tests.preload_marker",))
    pool = get_pool(2)
    assert pool.wait_ready(240), "workers did not start"
    pids = pool.pids()
    if name == "reuse":
        first = tune(K.limited_add_one_, 100, LIMIT=64)
        second = tune(K.double_, 1000)
        # Heuristics outside the autotuner (as flash-linear-attention writes its kernels): the module
        # exports the heuristics, and the worker finds the JIT function two `.fn` hops inside it.
        outer = tune(K.heur_outer_add_.fn, 64, SHIFT=1.0)
        return {"pids": pids, "pids_after": pool.pids(), "zygote": pool.zygote.pid, "first": first, "second": second,
                "outer": outer,
                "parent_new_cubins": parent_hits(K.limited_add_one_, 100, [16, 32, 64], LIMIT=64)
                + parent_hits(K.double_, 1000, [16, 32, 64])}
    if name == "split":
        return {"pids": pids, "pids_after": pool.pids(), "result": tune(K.early_pruned_add_one_, 64, LocalRanks())}
    if name == "timeout":
        start = time.monotonic()
        out = tune(W.hanging_add_one_, 96, timeout_s=8.0)
        seconds = time.monotonic() - start
        assert pool.wait_ready(240), "the replacement worker did not start"  # forked in the background
        return {"pids": pids, "pids_after": pool.pids(), "result": out, "seconds": seconds}
    if name in ("deadline", "deadline_alone"):
        # A seconds budget's first rung (budget.STRAGGLERS: 3x the median compile, once half have compiled): config 2
        # (BLOCK 64) hangs in its worker. Beside configs that compile, it is left out as a straggler and its worker
        # killed; alone, nothing has compiled, so it is not, and only the worker's own limit (8 s) ends it. Beside
        # others, the limit is far above the cutoff: on a loaded 2-core CI machine a compile here took 2.7 s, so
        # 3x the median passed an 8 s limit and the timeout, not the cutoff, ended the straggler.
        at = W.hanging_add_one_
        if name == "deadline_alone":
            at = triton.autotune(configs=[c for c in at.configs if c.kwargs["BLOCK"] == 64], key=["n"])(at.fn)
        # n = 97 (not a multiple of 16): other binaries than the "timeout" scenario's, so that these compile. A
        # second key, n = 113, specializes alike: it waits for the first key's compiles, and fails as they do.
        started, keys = time.monotonic(), []
        for n in (97,) if name == "deadline_alone" else (97, 113):
            args, kwargs = (torch.zeros(n), n), {"grid": (1,), "warmup": False}
            state = key_state(at, args, kwargs)
            keys.append(P.start(state, args, kwargs, Collectives(False), threads=2, workers=2,
                                timeout_s=8.0 if name == "deadline_alone" else LIMIT_BESIDE_S, stragglers=3.0))
        done, *twin = [k.finish(Collectives(False)) for k in keys]
        seconds = time.monotonic() - started
        return {"pids": pids, "seconds": seconds, "failures": {str(i): r for i, r in done.failures.items()},
                "by_workers": done.by_workers, "counts": done.counts(), "places": places(done),
                "twin": [{"failures": {str(i): r for i, r in t.failures.items()}, "counts": t.counts(),
                          "places": places(t)}
                         for t in twin]}
    if name == "stragglers_fill_workers":
        # Two stragglers (BLOCK 64 on 1 and 2 warps) among six configs, on two workers: handed out slowest first,
        # they held both workers before half of the rung had compiled, and only the compile limit ended them.
        at, n = W.hanging_twice_add_one_, 99
        args, kwargs = (torch.zeros(n), n), {"grid": (1,), "warmup": False}
        started = time.monotonic()
        done = P.start(key_state(at, args, kwargs), args, kwargs, Collectives(False), threads=2, workers=2,
                       timeout_s=LIMIT_BESIDE_S, stragglers=3.0).finish(Collectives(False))
        return {"pids": pids, "seconds": time.monotonic() - started, "counts": done.counts(),
                "failures": {str(i): r for i, r in done.failures.items()}, "places": places(done),
                "blocks": {str(i): [c.kwargs["BLOCK"], c.num_warps] for i, c in enumerate(at.configs)}}
    if name == "crash":
        result = tune(W.crashing_add_one_, 96)
        assert pool.wait_ready(240), "the replacement worker did not start"
        return {"pids": pids, "result": result, "pids_after": pool.pids()}
    if name == "fallback":
        return {"pids": pids, "main": tune(main_add_one_, 64), "local": tune(_local_kernel(), 64),
                "threads_only": tune(K.single_config_add_one_, 64, workers=0)}
    if name == "steal":
        # Local rank 1 of 2, its share (configs 1, 3) done before the step's end: its workers go on with the
        # other rank's configs (last first: 2, then 0) instead of idling until finish().
        at = K.early_pruned_add_one_
        x = torch.zeros(64)
        args, kwargs = (x, 64), {"grid": (1,), "warmup": False}
        state = key_state(at, args, kwargs)
        comm = LocalRanks()
        before, misses = cubins(), len(MISSES)
        compiling = P.start(state, args, kwargs, comm, threads=2, workers=2)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not compiling.done or compiling._thread.is_alive()):
            time.sleep(0.05)  # the execution would go on meanwhile; the step's end is later
        stolen_before_finish = cubins() - before
        done = compiling.finish(comm)
        return {"pids": pids, "mine": done.mine, "stolen": done.stolen, "counts": done.counts(),
                "by_workers": done.by_workers, "places": places(done),
                "cubins_before_finish": stolen_before_finish, "new_cubins": cubins() - before,
                "compiled_here": len(MISSES) - misses, "configs": len(state.configs)}
    if name == "twins":
        # Two keys of one kernel whose arguments specialize alike (n = 96 and 160: both multiples of 16), met one
        # after the other as one execution meets them: the same 48 binaries. Each is compiled once, by whichever
        # key claims it first; the other key waits for it and finds it in the cache.
        at = many_configs_add_one_
        before, misses = cubins(), len(MISSES)
        states, compiling = [], []
        for n in (96, 160):
            args, kwargs = (torch.zeros(n), n), {"grid": (1,), "warmup": False}
            state = key_state(at, args, kwargs)
            states.append(state)
            compiling.append(P.start(state, args, kwargs, Collectives(False), threads=2, workers=2))
        done = [c.finish(Collectives(False)) for c in compiling]
        return {"pids": pids, "keys": [str(s.key) for s in states], "counts": [d.counts() for d in done],
                "failures": [len(d.failures) + len(d.rejected) for d in done], "new_cubins": cubins() - before,
                "compiled_here": len(MISSES) - misses, "configs": len(at.configs)}
    if name == "node_rank":
        # One of two processes of a node (tests/test_compile_workers.py starts both, sharing TRITON_CACHE_DIR),
        # each compiling all 48 configs of one key's rung, as every rank prefetches a budget's rung: each binary
        # is compiled once on the node (NodeClaims), by whichever process takes its lock first.
        at = many_configs_add_one_
        args, kwargs = (torch.zeros(96), 96), {"grid": (1,), "warmup": False}
        state = key_state(at, args, kwargs)
        barrier = Path(os.environ["NODE_BARRIER"])
        (barrier / str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # both processes' workers are ready: they start together
        misses = len(MISSES)
        done = P._compile(state, list(range(len(at.configs))), args, kwargs, 2, 120.0, pool, load=False)
        where = list(done.places.values())
        return {"pids": pids, "counts": {p: where.count(p) for p in (P.WORKER, P.HERE, P.CACHE)},
                "failures": len(done.failures) + len(done.rejected),
                "compiled_here": len(MISSES) - misses, "configs": len(at.configs)}
    if name == "helpers":
        from tests import helper_kernels as HK
        return {"pids": pids, "result": tune(HK.helpers_double_, 32)}
    if name == "descriptor":
        # A host TensorDescriptor whose block_shape each config's pre_hook sets: the hooked copy's signature is
        # what travels to the worker (compat.hooked_launch_args, then Triton's own specialization of it).
        from tests import prehook_kernels as PK
        x, y = torch.zeros(256), torch.zeros(256)
        return {"pids": pids, "result": tune(PK.desc_double, 256, args=(PK.descriptor(x), y, 256)),
                "parent_new_cubins": sum(parent_hits_desc(PK, c) for c in PK.desc_double.configs)}
    if name == "cuda_import":
        # A kernel library that asks the GPU for its name at import (as FLA does): it raises in any process but
        # this one, so a worker that imported it could not compile. The workers get the kernel as source.
        os.environ["CUDA_TOUCH_PARENT"] = str(os.getpid())
        from tests import cuda_touch_kernels as C
        return {"pids": pids, "result": tune(C.touchy_add_one_, 64), "gpu_name": C.GPU_NAME}
    if name == "urgent":
        return {"pids": pids, **urgent_first(pool)}
    if name == "first_in_grace":
        return {"pids": pids, **first_in_fork_grace(pool)}
    if name == "launcher_wait":
        return {"pids": pids, **launcher_wait()}
    if name == "hold":
        print(json.dumps({"pids": pids, "parent": os.getpid(), "zygote": pool.zygote.pid}), flush=True)
        time.sleep(3600)  # the test kills this process
    raise SystemExit(f"unknown scenario {name}")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps({"scenario": arg, **scenario(arg)}), flush=True)
