"""Long-lived compile worker processes: Triton compilation at the speed of the node's cores.

Triton's front end holds the GIL, so threads in one process compile about one config at a time,
and a process started per compile spends its life importing torch. So each process that tunes
keeps a pool of worker processes, started once (at its first precompilation, or earlier with
start_compile_workers()) and reused by every later key. A worker compiles a config described by
compat.describe_compile for the parent's GPU target without touching a GPU; the binary lands in
Triton's disk cache, where the parent's own compile-only launch then finds it.

Workers are plain `python -c` processes with two pipes, not multiprocessing's: its 'spawn'
re-imports the parent's main script in every child (and runs it, when it has no main guard), and
'fork' would copy a CUDA context. Each worker leads its own process group, so a compile that runs
past its limit is killed with the ptxas it started, and exits by itself when the parent dies
(its request pipe closes or its parent pid changes). atexit closes the pool without waiting long.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..runtime.compat import (LaunchSpec, compile_described, compile_target, config_failure_reason, prime_compiler_hash,
                     use_compile_only_driver)
from ..errors import InvalidOptionError

# Seconds a new worker may take to import torch, triton and this package before it is given up on.
BOOT_TIMEOUT_S = 300.0
# A worker that fails to start is not replaced after this many such failures: the pool is broken
# (an environment the child cannot import in), and the threads compile instead.
MAX_BOOT_FAILURES = 3

_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds triton_ctx_tune/
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from triton_ctx_tune.compile.compile_workers import serve; "
         "serve(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))")


@dataclass(frozen=True)
class Outcome:
    """What a worker made of one config: compiled (failure None), or a failure of that config."""
    failure: str | None
    pid: int


def default_workers() -> int:
    """One worker per core this rank may use, the node's cores shared among its local ranks."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(32, cores // max(local_world, 1)))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "an unknown status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class _Worker:
    def __init__(self, target: Any, preload: tuple[str, ...] = ()) -> None:
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, _ROOT, str(to_child_r), str(to_parent_w), str(os.getpid())],
                pass_fds=(to_child_r, to_parent_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(to_child_r)
            os.close(to_parent_w)
        self.requests = Connection(to_child_w, readable=False)
        self.replies = Connection(to_parent_r, writable=False)
        self.requests.send({"target": target, "preload": list(preload), "sys_path": list(sys.path)})
        self.state = "booting"  # then "idle", "busy", "dead"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """End the worker and anything it started (ptxas); reap it."""
        for conn in (self.requests, self.replies):
            conn.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.state = "dead"


class WorkerPool:
    """Up to `size` worker processes; compile() hands one config to an idle one and waits for it."""

    def __init__(self, size: int, preload: tuple[str, ...] = ()) -> None:
        self.owner = os.getpid()
        self.preload = preload  # kernel modules a worker imports before it says it is ready
        self.target = compile_target()
        self._cond = threading.Condition()
        self._workers: list[_Worker] = []
        self._boot_failures = 0
        self._closed = False
        # Modules a worker could not compile from (why, as the worker said it): their kernels use threads.
        self.unusable: dict[str, str] = {}
        self.undescribed = 0  # configs precompile could not describe to a worker (compat.describe_compile)
        self.grow(size)

    @property
    def size(self) -> int:
        with self._cond:
            return sum(w.state != "dead" for w in self._workers)

    def pids(self) -> list[int]:
        with self._cond:
            return [w.pid for w in self._workers if w.state != "dead"]

    def status(self) -> dict[str, object]:
        """For the precompile log event: how many workers run, and why any kernel module is left to threads."""
        with self._cond:
            return {"ready": sum(w.state in ("idle", "busy") for w in self._workers),
                    "booting": sum(w.state == "booting" for w in self._workers),
                    "boot_failures": self._boot_failures, "unusable": dict(self.unusable)}

    def ready(self) -> int:
        with self._cond:
            return sum(w.state in ("idle", "busy") for w in self._workers)

    def grow(self, size: int) -> None:
        with self._cond:
            for _ in range(size - sum(w.state != "dead" for w in self._workers)):
                self._start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until every live worker has started (tests, benchmarks); False at the deadline."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while any(w.state == "booting" for w in self._workers):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _start(self) -> None:  # under self._cond
        if self._closed or self._boot_failures >= MAX_BOOT_FAILURES:
            return
        worker = _Worker(self.target, self.preload)
        self._workers.append(worker)
        threading.Thread(target=self._boot, args=(worker,), name="ctx-tune-worker-boot", daemon=True).start()

    def _boot(self, worker: _Worker) -> None:
        try:
            ok = worker.replies.poll(BOOT_TIMEOUT_S) and worker.replies.recv() == "ready"
        except (EOFError, OSError):
            ok = False
        with self._cond:
            if worker.state == "booting":
                if ok:
                    worker.state = "idle"
                else:
                    self._boot_failures += 1
                    worker.kill()
            self._cond.notify_all()

    def _acquire(self) -> _Worker | None:
        """An idle worker, waiting for one while any has started; None while none has (compile here instead)."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                for w in self._workers:
                    if w.state == "idle":
                        w.state = "busy"
                        return w
                if not any(w.state == "busy" for w in self._workers):
                    return None
                self._cond.wait()

    def _release(self, worker: _Worker, replace: bool) -> None:
        with self._cond:
            if replace:
                worker.kill()
                self._workers.remove(worker)
                self._start()
            elif worker.state == "busy":
                worker.state = "idle"
            self._cond.notify_all()

    def compile(self, spec: LaunchSpec, timeout_s: float) -> Outcome | None:
        """Compile `spec` in a worker: None when no worker took it (none started yet, or the worker could not
        import or compile it for a reason that is not the config's): then the caller compiles it itself."""
        if spec.module in self.unusable:
            return None
        worker = self._acquire()
        while worker is not None and worker.proc.poll() is not None:
            self._release(worker, replace=True)  # died while idle (killed from outside): not this config's fault
            worker = self._acquire()
        if worker is None:
            return None
        try:
            worker.requests.send(spec)
            answered = worker.replies.poll(None if math.isinf(timeout_s) else max(timeout_s, 0.0))
            kind, text = worker.replies.recv() if answered else ("timeout", "")
        except (EOFError, OSError):
            try:
                code: int | None = worker.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self._release(worker, replace=True)
            return Outcome(f"compile worker crashed: its process ended with {_exit_text(code)} while compiling this "
                           "config (a crash in Triton's compiler); the worker was replaced", worker.pid)
        if kind == "timeout":
            self._release(worker, replace=True)  # killed with its ptxas, not abandoned like a thread
            return Outcome(f"compile timeout: compiling this config took longer than {timeout_s:g} s, so its "
                           "compile worker was killed (raise compile_timeout_s or TRITON_CTX_TUNE_COMPILE_TIMEOUT "
                           "if it is just slow)", worker.pid)
        self._release(worker, replace=False)
        if kind == "error":
            self.unusable.setdefault(spec.module, text)  # it could not import or find the kernel: nor will it later
            return None
        return Outcome(text if kind == "failure" else None, worker.pid)

    def close(self) -> None:
        """Ask every worker to exit, then kill what is left after a short wait: never hangs the exit."""
        if os.getpid() != self.owner:
            return  # a fork of the owner: the workers are not this process's
        with self._cond:
            self._closed = True
            workers = list(self._workers)
            self._cond.notify_all()
        for w in workers:
            try:
                w.requests.close()  # EOF: an idle worker exits at once
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            w.kill()


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def get_pool(size: int, preload: tuple[str, ...] = ()) -> WorkerPool:
    """This process's pool, started at the first call and grown to the largest size asked for.

    `preload`: modules the workers import while they start (the first kernel's, when tuning starts
    them), so that a worker's first job does not pay for importing a kernel library.
    """
    global _pool
    with _pool_lock:
        if _pool is None or _pool.owner != os.getpid():
            _pool = WorkerPool(size, preload)
            atexit.register(_pool.close)
        else:
            _pool.grow(size)
        return _pool


def env_compile_workers() -> int | None:
    """TRITON_CTX_TUNE_COMPILE_WORKERS: a count >= 0 (0: compile on threads only), or None when unset."""
    raw = os.environ.get("TRITON_CTX_TUNE_COMPILE_WORKERS", "")
    value = raw.strip()
    if value == "":
        return None
    if not value.isdigit():
        raise InvalidOptionError("TRITON_CTX_TUNE_COMPILE_WORKERS", raw,
                                 "a number of worker processes >= 0 (0: compile on threads only); unset: none unless "
                                 "start_compile_workers() started them")
    return int(value)


def started_workers() -> int:
    """The size of this process's pool if start_compile_workers() (or a tuning call) started one, else 0."""
    with _pool_lock:
        return _pool.size if _pool is not None and _pool.owner == os.getpid() else 0


def start_compile_workers(size: int | None = None, preload: tuple[str, ...] = ()) -> None:
    """Start this process's compile workers now, so that their start-up overlaps the program's own (model
    construction, data loading) instead of the first tuning call. Optional: tuning starts them when needed.

    `preload`: the modules that define your kernels (e.g. ``("fla.ops.simple_gla",)``), imported by each
    worker while it starts; otherwise a worker imports a kernel's module at its first job.
    """
    from ..runtime.compat import interpret_mode

    # Checked before the interpreter returns early: a bad call must fail on the CPU as on the GPU.
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise InvalidOptionError("size", size, "a number of worker processes >= 0 (0: none), or None for the default")
    if isinstance(preload, str) or not all(isinstance(m, str) for m in preload):
        raise InvalidOptionError("preload", preload, "a tuple of module names, e.g. (\"fla.ops.simple_gla\",)")
    if interpret_mode():
        return  # nothing is compiled under the interpreter
    n = env_compile_workers() if size is None else size
    if n is None:
        n = default_workers()
    if n > 0:
        get_pool(n, tuple(preload))


def shutdown() -> None:
    """Stop this process's workers now (they start again when needed)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()


# ---- the worker's side -------------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(0)  # orphaned mid-compile: nobody will read the answer
        time.sleep(0.5)


def serve(requests_fd: int, replies_fd: int, parent: int) -> None:
    """A worker's life: compile what the parent sends, one config at a time, until its pipe closes."""
    requests = Connection(requests_fd, writable=False)
    replies = Connection(replies_fd, readable=False)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        # Below the ranks' own threads: a worker that starts (imports) while its rank compiles on
        # threads must not slow that rank down; once started it uses cores the rank leaves idle.
        with contextlib.suppress(OSError):
            os.nice(5)
        boot = requests.recv()
        use_compile_only_driver(boot["target"])
        import torch  # noqa: F401,PLC0415  (kernel modules import it: pay for it before the first job)
        if boot.get("sys_path"):
            sys.path[:] = boot["sys_path"]
        for module in boot.get("preload", ()):
            with contextlib.suppress(Exception):  # a job for it will report the reason
                importlib.import_module(module)
        prime_compiler_hash()  # once, before the first job, rather than inside it
        replies.send("ready")
        while True:
            spec = requests.recv()
            try:
                compile_described(spec)
                reply: tuple[str, str] = ("ok", "")
            except Exception as e:
                reason = config_failure_reason(e)
                reply = ("failure", reason) if reason is not None else ("error", f"{type(e).__name__}: {e}")
            replies.send(reply)
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the parent closed the pool or died
    os._exit(0)
