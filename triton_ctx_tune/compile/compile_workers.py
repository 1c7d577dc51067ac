"""Long-lived compile worker processes: Triton compilation at the speed of the node's cores, by default.

Triton's front end holds the GIL, so threads in one process compile about one config at a time. A process per
compile, or a worker started at the first tuning call, spends its first seconds importing torch, and W ranks x N
workers importing at once competed with the ranks' own compiles (measured on 2 H200s: the FLA step 30 s instead of
25 s). So each rank starts one small server, the zygote, when this package is imported (or a tuned function decorated),
long before its first call: it imports triton and the modules of this package that compile (not torch: ready in about
0.5 s), primes Triton's compiler hash, imports its code generator, and then forks a worker in milliseconds whenever
the pool asks for one (a fork server, as multiprocessing's 'forkserver' with preloaded modules, but without
re-running the parent's main script). The zygote initialises no GPU and imports nothing of the user's library: a worker
gets each config as compat.describe_compile describes it (the kernel's source, its JIT dependencies and globals, and
the signature, constexprs, attributes, options and target that Triton's own compile-only launch would pass to
compile()), and compiles it for the parent's GPU target (compat.compile_described) under the parent's cache key; the
binary lands in Triton's disk cache, where the parent's own compile-only launch then finds it. So a kernel defined in
__main__ or inside a function, and a library that touches CUDA at import (FLA asks for the device's name), compile
here too.

Each worker leads its own process group, so a compile that runs past its limit is killed with the
ptxas it started. The zygote reaps its workers and reports how each ended (the crash message names
the signal). Nothing outlives the rank: the zygote exits when its rank does (its socket closes or its
parent pid changes) and kills its workers' groups; a worker exits when its zygote does. atexit
closes the pool without waiting long, and joins the threads that read the zygote and boot workers.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import multiprocessing
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..errors import InvalidOptionError
from ..runtime.compat import (
    LaunchSpec,
    compile_described,
    compile_target,
    config_failure_reason,
    preload_compiler,
    prime_compiler_hash,
    use_compile_only_driver,
)
from . import shared_ptxas

# Seconds a new worker may take to import torch, triton and this package before it is given up on.
BOOT_TIMEOUT_S = 300.0
# A worker that fails to start is not replaced after this many such failures: the pool is broken
# (an environment the child cannot import in), and the threads compile instead.
MAX_BOOT_FAILURES = 3
# Seconds after the pool is made from a ready zygote during which configs wait for its forks to be ready rather
# than compile in the rank's process (a fork from the zygote is ready in milliseconds; a config taken here holds
# the GIL for the whole compile, while the workers would have taken it).
FORK_GRACE_S = 2.0
# How often a compile that may be given up on (run's give_up: a budget's straggler) looks again.
GIVE_UP_POLL_S = 0.05
# Niceness above the rank's: a front worker's, below the rank's own threads (on the cores the rank leaves idle; not
# the zygote: its imports are on the first call's path, and it is one process); a bulk worker's, lower again, so that
# where a front compile shares a core with bulk ones it gets most of it (CFS weights 335 against 36).
FRONT_NICE = 5
BULK_NICE = 15

_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds triton_ctx_tune/
# The package is entered through a stand-in for its __init__, which imports torch (1 to 2 s): the zygote needs
# triton and the modules below only, and it is on the first call's path until it is ready.
_BOOT = ("import sys, types; root = sys.argv[1]; sys.path.insert(0, root); "
         "package = types.ModuleType('triton_ctx_tune'); package.__path__ = [root + '/triton_ctx_tune']; "
         "sys.modules['triton_ctx_tune'] = package; "
         "from triton_ctx_tune.compile.compile_workers import zygote; zygote(int(sys.argv[2]), int(sys.argv[3]))")
_MESSAGE_BYTES = 1 << 16  # a fork request (target, preload, sys.path) or a notice, pickled


class Excluding(str):
    """A failure of the compile itself, not of the config (a timeout, a crashed worker, the exit): it excludes
    the config at once, since compiling it again on the launch path could hang or crash the function. Any other
    precompile failure is a rejection, which the config's launch checks (precompile.py)."""


@dataclass(frozen=True)
class Outcome:
    """What a worker made of one config: compiled (failure None), or a failure of that config."""
    failure: str | None
    pid: int
    seconds: float = 0.0  # the compile's own time, in the worker (not its wait for another's ptxas run)
    cpu_s: float = 0.0  # the CPU time it took, the worker's and its ptxas's (more workers than cores: below seconds)
    shared_ptxas: bool = False  # its cubin came from another config's ptxas run on the same PTX (shared_ptxas.py)


def _kernel_id(spec: LaunchSpec) -> str:
    kernel = spec.functions[0]
    return f"{kernel.module}.{kernel.qualname}"


def front_workers(size: int) -> int:
    """Front workers beside `size` bulk ones: enough for a key met late (FLA's chunk_bwd_kernel_dqkwg, 6 configs) and
    the first configs of the keys met while its compiles run."""
    return (size + 1) // 2 if size > 0 else 0


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


class _Zygote:
    """This rank's fork server (parent side): one process, started once, that forks every worker."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # keeps message boundaries
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, _ROOT, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours
        self.state = "booting"  # then "ready", "dead"
        self._cond = threading.Condition()
        self._forked: list[int] = []  # pids the zygote answered, not yet taken by fork()
        self._exits: dict[int, int] = {}  # a worker's pid: how it ended (negative: the signal's number)
        self._fork_lock = threading.Lock()  # one fork in flight, so that the next answer is its own
        self._reader = threading.Thread(target=self._read, name="ctx-tune-zygote", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(_MESSAGE_BYTES)
                message = pickle.loads(data) if data else None
            except (OSError, EOFError, pickle.UnpicklingError):
                message = None
            with self._cond:
                if message is None:
                    self.state = "dead"
                elif message[0] == "ready":
                    self.state = "ready"
                elif message[0] == "forked":
                    self._forked.append(message[1])
                elif message[0] == "exited":
                    self._exits[message[1]] = message[2]
                self._cond.notify_all()
            if message is None:
                return

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.state == "booting" and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            return self.state == "ready"

    def fork(self, boot: dict[str, Any], child_end: socket.socket) -> int | None:
        """A new worker on `child_end` (the zygote's fork, told `boot`); None if the zygote is not there."""
        if not self.wait_ready(BOOT_TIMEOUT_S):
            return None
        with self._fork_lock:
            try:
                socket.send_fds(self.sock, [pickle.dumps(boot)], [child_end.fileno()])
            except OSError:
                return None
            with self._cond:
                while not self._forked and self.state == "ready":
                    self._cond.wait()
                return self._forked.pop(0) if self._forked else None

    def exit_code(self, pid: int, timeout_s: float = 0.0) -> int | None:
        """How worker `pid` ended, waiting up to `timeout_s` for the zygote to say; None while it runs."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while pid not in self._exits and self.state != "dead" and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            return self._exits.get(pid)

    def close(self) -> None:
        """Close its socket (it kills what it forked and exits); kill it if it has not after a short wait."""
        if os.getpid() != self.owner:
            return  # a fork of the owner: the zygote is not this process's
        booting = self.state == "booting"
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            # Still importing (a short program that imported this package and exits): it has forked nothing and
            # reads no socket yet, so it is killed at once rather than waited for.
            self.proc.wait(timeout=0.0 if booting else 2.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        # The shutdown ended its recv. Joined here (close runs at exit) so that it is not still
        # running when the interpreter finalizes.
        self._reader.join(timeout=2.0)


class _Worker:
    def __init__(self, conn: Connection, front: bool = False) -> None:
        self.conn = conn  # both ways: configs to compile out, outcomes back
        self.front = front  # a front worker (WorkerPool), at the rank's priority; else a bulk one, at BULK_NICE
        self.pid: int | None = None  # once the zygote has forked it
        self.state = "booting"  # then "idle", "busy", "dead"
        self.boot: threading.Thread | None = None  # the thread that has the zygote fork it and waits for it

    def kill(self) -> None:
        """End the worker and anything it started (ptxas); the zygote reaps it."""
        self.conn.close()
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)  # it leads its own group (setsid after the fork)
        self.state = "dead"


class WorkerPool:
    """`size` bulk worker processes and `front` front ones; run() hands one config to an idle one and waits for it.

    Bulk workers take the configs that waited for a place in precompile's gate (one per place), at a lower CPU
    priority (BULK_NICE). Front workers take the configs that start at once: a key's first config, which an execution
    waits for, and every config of a small key. Such a key met late (FLA's chunk_bwd_kernel_dqkwg, 6 configs, 2 s
    into the step) found every place held by the large keys met before it, and its 6 s compiles, the step's longest,
    started 0.35 to 0.45 s late and ran at a bulk compile's share of a core (RESULTS.md section 51)."""

    def __init__(self, size: int, zygote: _Zygote, preload: tuple[str, ...] = (), front: int = 0) -> None:
        self.owner = os.getpid()
        self.preload = preload  # kernel modules the zygote imports before it forks the workers
        self.target = compile_target()
        self.zygote = zygote
        self._cond = threading.Condition()
        self._workers: list[_Worker] = []
        self._boot_failures = 0
        self._closed = False
        self._urgent = 0  # callers of acquire(urgent=True) waiting now
        # Kernels a worker could not rebuild (why, as the worker said it): they compile in the rank's process.
        self.unusable: dict[str, str] = {}
        self.made = time.monotonic()
        self.grow(size, front)

    @property
    def size(self) -> int:
        """Live bulk workers (the gate's places)."""
        with self._cond:
            return self._live(front=False)

    @property
    def front(self) -> int:
        """Live front workers."""
        with self._cond:
            return self._live(front=True)

    def _live(self, front: bool) -> int:  # under self._cond
        return sum(w.state != "dead" and w.front == front for w in self._workers)

    def pids(self) -> list[int]:
        with self._cond:
            return [w.pid for w in self._workers if w.state != "dead" and w.pid is not None]

    def status(self) -> dict[str, object]:
        """For the precompile log event: how many workers run, and why any kernel module is left to threads."""
        with self._cond:
            return {"ready": self._count("idle", "busy"), "front": self._live(front=True),
                    "booting": self._count("booting"),
                    "boot_failures": self._boot_failures, "unusable": dict(self.unusable),
                    "zygote": {"pid": self.zygote.pid, "state": self.zygote.state}}

    def _count(self, *states: str) -> int:  # under self._cond
        return sum(w.state in states for w in self._workers)

    def ready(self) -> int:
        with self._cond:
            return self._count("idle", "busy")

    def forking(self) -> bool:
        """Whether workers are being forked from a ready zygote, within FORK_GRACE_S of the pool's making or
        growth: they are ready in milliseconds, so a config waits for them rather than compile here."""
        return self.zygote.state == "ready" and time.monotonic() - self.made < FORK_GRACE_S

    def grow(self, size: int, front: int = 0) -> None:
        """At least `size` bulk and `front` front workers."""
        with self._cond:
            for kind, wanted in ((False, size), (True, front)):
                for _ in range(wanted - self._live(front=kind)):
                    self._start(front=kind)

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until every live worker has started (tests, benchmarks); False at the deadline."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._count("booting"):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _start(self, front: bool) -> None:  # under self._cond
        if self._closed or self._boot_failures >= MAX_BOOT_FAILURES:
            return
        ours, theirs = socket.socketpair()
        worker = _Worker(Connection(ours.detach()), front)
        self._workers.append(worker)
        worker.boot = threading.Thread(target=self._boot, args=(worker, theirs), name="ctx-tune-worker-boot",
                                       daemon=True)
        worker.boot.start()

    def _boot(self, worker: _Worker, child_end: socket.socket) -> None:
        try:
            pid = self.zygote.fork({"target": self.target, "preload": list(self.preload), "sys_path": list(sys.path),
                                    "nice": FRONT_NICE if worker.front else BULK_NICE}, child_end)
        finally:
            child_end.close()  # the worker holds its own copy now
        with self._cond:
            worker.pid = pid
            if worker.state == "dead" and pid is not None:
                worker.kill()  # the pool closed (or gave up on it) while the zygote forked it
        try:
            ok = pid is not None and worker.conn.poll(BOOT_TIMEOUT_S) and worker.conn.recv() == "ready"
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

    def live(self) -> bool:
        """Whether any worker is ready or starting: False once the pool is closed or broken."""
        with self._cond:
            return not self._closed and self._count("idle", "busy", "booting") > 0

    def acquire(self, wait_s: float, urgent: bool = False, front: bool = False) -> tuple[_Worker, int] | None:
        """An idle worker and its pid, waiting up to `wait_s` for one; None if none came (or the pool is closed
        or has no live worker). While an `urgent` caller waits (the config an execution waits for), other
        callers leave idle workers to it. A `front` caller takes a front worker, else a bulk one; any other, a bulk
        one only (a front worker left idle is one that a key met later starts on at once)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            self._urgent += urgent
            try:
                return self._acquire(deadline, urgent, front)
            finally:
                self._urgent -= urgent
                self._cond.notify_all()

    def _acquire(self, deadline: float, urgent: bool, front: bool) -> tuple[_Worker, int] | None:  # under self._cond
        while True:
            if self._closed:
                return None
            mine = urgent or not self._urgent
            idle = [w for w in self._workers if mine and w.state == "idle" and (front or not w.front)]
            for w in sorted(idle, key=lambda w: not w.front):  # (a front caller's own kind first)
                pid = w.pid
                if pid is None:
                    continue  # (idle means it booted, so it has a pid)
                if self.zygote.exit_code(pid) is not None:  # died while idle (killed from outside)
                    w.kill()
                    self._workers.remove(w)
                    self._start(w.front)
                    continue
                w.state = "busy"
                return w, pid
            left = deadline - time.monotonic()
            if left <= 0 or not self._count("idle", "busy", "booting"):
                return None
            self._cond.wait(min(left, 0.5))

    def _release(self, worker: _Worker, replace: bool) -> None:
        with self._cond:
            if replace:
                worker.kill()
                if worker in self._workers:
                    self._workers.remove(worker)
                self._start(worker.front)
            elif worker.state == "busy":
                worker.state = "idle"
            self._cond.notify_all()

    def usable(self, spec: LaunchSpec) -> bool:
        return _kernel_id(spec) not in self.unusable

    def run(self, acquired: tuple[_Worker, int], spec: LaunchSpec, timeout_s: float,
            give_up: Callable[[float], str | None] | None = None) -> Outcome | None:
        """Compile `spec` on the acquired worker (released after). None when the worker could not compile it for
        a reason that is not the config's (it could not rebuild the kernel): then the caller compiles it.
        `give_up(seconds so far)`, asked as it waits: a reason to stop (the worker is killed, as at a timeout)."""
        worker, pid = acquired
        began = time.monotonic()
        try:
            worker.conn.send(spec)
            if give_up is None:
                answered = worker.conn.poll(None if math.isinf(timeout_s) else max(timeout_s, 0.0))
            else:
                while not (answered := worker.conn.poll(GIVE_UP_POLL_S)):
                    waited = time.monotonic() - began
                    if waited >= timeout_s:
                        break
                    if (reason := give_up(waited)) is not None:
                        self._release(worker, replace=True)
                        return Outcome(Excluding(reason), pid, waited)
            kind, text, seconds, shared, cpu_s = worker.conn.recv() if answered else ("timeout", "", timeout_s, 0, 0.0)
        except (EOFError, OSError):
            code = self.zygote.exit_code(pid, timeout_s=5.0)
            self._release(worker, replace=True)
            return Outcome(Excluding(f"compile worker crashed: its process ended with {_exit_text(code)} while "
                                     "compiling this config (a crash in Triton's compiler); the worker was replaced"),
                           pid)
        if kind == "timeout":
            self._release(worker, replace=True)  # killed with its ptxas, not abandoned like a thread
            return Outcome(Excluding(f"compile timeout: compiling this config took longer than {timeout_s:g} s, "
                                     "so its compile worker was killed (raise compile_timeout_s or "
                                     "TRITON_CTX_TUNE_COMPILE_TIMEOUT if it is just slow)"), pid, timeout_s)
        self._release(worker, replace=False)
        if kind == "error":
            self.unusable.setdefault(_kernel_id(spec), text)  # it could not rebuild the kernel: nor will it later
            return None
        return Outcome(text if kind == "failure" else None, pid, seconds, cpu_s, shared > 0)

    def compile(self, spec: LaunchSpec, timeout_s: float) -> Outcome | None:
        """Compile `spec` in a worker, waiting for one while any is ready or starting; None when no worker took it
        (none is live, or it could not rebuild the kernel): then the caller compiles it itself."""
        if not self.usable(spec):
            return None
        acquired = self.acquire(BOOT_TIMEOUT_S)
        return None if acquired is None else self.run(acquired, spec, timeout_s)

    def close(self) -> None:
        """Ask every worker to exit, then kill what is left after a short wait: never hangs the exit."""
        if os.getpid() != self.owner:
            return  # a fork of the owner: the workers are not this process's
        with self._cond:
            self._closed = True
            workers = list(self._workers)
            self._cond.notify_all()
        for w in workers:
            with contextlib.suppress(OSError):
                w.conn.close()  # EOF: an idle worker exits at once
        deadline = time.monotonic() + 2.0
        for w in workers:
            if w.pid is not None:
                self.zygote.exit_code(w.pid, timeout_s=max(0.0, deadline - time.monotonic()))
            w.kill()
        # A killed worker's end closes, which ends its boot thread's wait; joined (briefly) so that
        # none is still running when the interpreter finalizes (close runs at exit).
        deadline = time.monotonic() + 2.0
        for w in workers:
            if w.boot is not None and w.boot is not threading.current_thread():
                w.boot.join(timeout=max(0.0, deadline - time.monotonic()))


_pool: WorkerPool | None = None
_zygote: _Zygote | None = None
_pool_lock = threading.Lock()


def get_zygote() -> _Zygote:
    """This process's zygote, started at the first call (it takes a few seconds to be ready, in the background)."""
    with _pool_lock:
        return _live_zygote()


def _live_zygote() -> _Zygote:  # under _pool_lock
    global _zygote
    if _zygote is None or _zygote.owner != os.getpid() or _zygote.state == "dead":
        _zygote = _Zygote()
        atexit.register(_zygote.close)
    return _zygote


def prestart(at_import: bool = False) -> None:
    """Start the zygote now, when the package is imported (`at_import`) or a function decorated: its imports and
    its hash then overlap the program's own set-up (model construction, data loading), not the first tuning call's
    compiles. A function decorated just before its first call, with the zygote started then, had its first keys
    met before any worker was ready (1 s in on a loaded 2-H200 host), and their first configs compiled in the
    rank's process.

    Not in a multiprocessing child (a DataLoader worker that re-imports the program): it never tunes. Not at import
    when TRITON_CTX_TUNE_COMPILE_WORKERS turns the workers off (or is not valid: the option's check names it).
    """
    if multiprocessing.parent_process() is not None:
        return
    if at_import:
        try:
            if env_compile_workers() == 0:
                return
        except InvalidOptionError:
            return
    get_zygote()


def get_pool(size: int, preload: tuple[str, ...] = ()) -> WorkerPool:
    """This process's pool, started at the first call and grown to the largest size asked for.

    `preload`: modules the zygote imports before it forks the workers (the first kernel's, when tuning
    starts them), so that no worker's first job pays for importing a kernel library.
    """
    global _pool
    with _pool_lock:
        if _pool is None or _pool.owner != os.getpid():
            _pool = WorkerPool(size, _live_zygote(), preload, front_workers(size))
            atexit.register(_pool.close)
        else:
            _pool.grow(size, front_workers(size))
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


def zygote_state() -> str | None:
    """"booting", "ready" or "dead" for this process's zygote; None if none was started (tests, the log)."""
    with _pool_lock:
        return _zygote.state if _zygote is not None and _zygote.owner == os.getpid() else None


def start_compile_workers(size: int | None = None, preload: tuple[str, ...] = ()) -> None:
    """Start this process's compile workers now, rather than at the first tuning call. Optional: decorating
    a tuned function already starts the zygote they are forked from, and tuning forks them when needed.
    Call it after torch.cuda.set_device: the workers compile for the current device's target.

    `preload`: the modules that define your kernels (e.g. ``("fla.ops.simple_gla",)``), imported once by the
    zygote before it forks the workers; otherwise the first tuning call has it import the first kernel's.
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
    """Stop this process's workers and its zygote now (they start again when needed)."""
    global _pool, _zygote
    with _pool_lock:
        pool, _pool = _pool, None
        zygote, _zygote = _zygote, None
    if pool is not None:
        pool.close()
    if zygote is not None:
        zygote.close()


# ---- the zygote's and the workers' side ------------------------------------------------------


def zygote(control_fd: int, parent: int) -> None:
    """The zygote's life: import once, then fork a worker per request until the rank closes its socket."""
    sock = socket.socket(fileno=control_fd)
    children: set[int] = set()
    prepared: dict[str, Any] | None = None  # the last fork request _prepare() carried out
    try:
        # Not torch: a worker compiles from source (compat.compile_described), and a kernel module that the pool
        # preloads imports it in _prepare, once, before the forks.
        import triton.backends  # noqa: F401,PLC0415  (every backend's compiler, for whichever target comes)
        prime_compiler_hash()  # inherited by every fork
        preload_compiler()  # and so is this: otherwise each worker's first compile imports it
        shared_ptxas.install()  # the workers of the node's ranks run ptxas once per PTX
        sock.send(pickle.dumps(("ready",)))
        while os.getppid() == parent:
            readable, _, _ = select.select([sock], [], [], 0.5)
            _reap(sock, children)
            if not readable:
                continue
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 1)
            if not data:
                break  # the rank closed the pool, or died
            request = pickle.loads(data)
            nice = request.pop("nice", FRONT_NICE)
            if request != prepared:  # a pool's forks all ask the same: set up once, not before each fork
                _prepare(request)
                prepared = request
            pid = os.fork()
            if pid == 0:
                sock.close()
                _worker(fds[0], nice)  # never returns
            for fd in fds:
                os.close(fd)
            children.add(pid)
            sock.send(pickle.dumps(("forked", pid)))
    except (OSError, EOFError, KeyboardInterrupt):
        pass  # the rank is gone
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    os._exit(0)


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        sock.send(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def _prepare(boot: dict[str, Any]) -> None:
    """In the zygote, before a fork: what every worker needs, done once here rather than in each of them
    (the preloaded kernel library, FLA say, took seconds per worker, all of them importing at once)."""
    use_compile_only_driver(boot["target"])  # the rank's device's target, known only once the rank asks
    if boot.get("sys_path"):
        sys.path[:] = boot["sys_path"]
    for module in boot.get("preload", ()):
        if module not in sys.modules:
            with contextlib.suppress(Exception):  # a job for it will report the reason
                importlib.import_module(module)


def _worker(fd: int, nice: int) -> None:
    try:
        os.setsid()  # its own group: a timeout kills it with the ptxas it started
        with contextlib.suppress(OSError):
            os.nice(nice)  # (FRONT_NICE, BULK_NICE: the ptxas it starts inherits it)
        conn = Connection(fd)
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
        conn.send("ready")
        while True:
            spec = conn.recv()
            began, cpu = time.perf_counter(), os.times()
            try:
                compile_described(spec)
                reply: tuple[str, str] = ("ok", "")
            except Exception as e:  # noqa: BLE001 (whatever failed, the worker reports it and takes the next)
                reason = config_failure_reason(e)
                reply = ("failure", reason) if reason is not None else ("error", f"{type(e).__name__}: {e}")
            shared, waited_s = shared_ptxas.since_last()
            now = os.times()
            cpu_s = sum(getattr(now, f) - getattr(cpu, f)
                        for f in ("user", "system", "children_user", "children_system"))
            conn.send((*reply, time.perf_counter() - began - waited_s, shared, cpu_s))
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the pool closed it, or the rank died
    finally:
        os._exit(0)


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(0)  # the zygote is gone (so is the rank): nobody will read the answer
        time.sleep(0.5)
