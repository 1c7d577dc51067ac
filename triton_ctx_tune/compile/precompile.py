"""Compile every config of a new (kernel, key) before its first slot, in parallel.

Triton compiles one config per launch, inside the re-executed function: on a cold cache that
is over 90% of tuning time, and compile stalls between timed slots let the GPU clocks drop.
Here all configs are compiled at once, so binaries land in Triton's cache and the slots'
launches hit it. Triton's front end holds the GIL, so the compiling is done by this rank's
compile worker processes (compile_workers.py), one config each at a time; a thread per worker
describes the config (compat.describe_compile: the kernel's source and what Triton's compile()
takes), hands it over and then runs Triton's own compile-only path (`run(warmup=True)`) here, a
disk-cache hit by then. A config waits for a worker while any is ready or starting; this process
compiles one itself only where no worker can: while none is ready yet (one config at a time,
HERE_SLOT; and the config an execution waits for, at once), the config an execution waits for when
no worker is free within FIRST_WAIT_S (it takes the next free worker ahead of the others), a config
it cannot describe, compile_workers=0, or the interpreter. Each config's place (workers, here, cache)
and compile time go to the precompile event. A binary that another key or batch of this process is compiling
now is waited for and loaded from the cache, not compiled again beside it (IN_FLIGHT), and so is one that
another process of the node is compiling (NODE_CLAIMS, a lock file per binary); a config waiting so gives its
place in the compile gate back meanwhile. A rank whose share is done goes on, until the step's end, with the
other local ranks' configs (stolen: they only warm the shared cache). Ranks on
one node split the configs (config i goes to local rank i % local_world) and meet in one bounded
all-gather, after which each loads the others' binaries from the shared Triton cache; a second
all-gather shares what failed in that load.

A config whose compilation runs past compile_timeout_s is a failure like a compile error: its
worker process is killed (a thread that compiles itself is abandoned: left to finish on its own,
never waited for), and so is one whose worker crashes; the gathers make the config invalid on
every rank.

No other thread started here outlives its work: run_with_deadline joins its threads before it
returns, the background one ends with its share (or, once finish() stopped its stealing, with the
stolen configs a worker still had in hand), and at exit an atexit hook stops the ones a call left
running (it raised before finish()) and waits for them, before the interpreter finalizes (a daemon
thread that is still running there is ended inside the runtime, not let return).

A key met in the middle of an execution holds that execution up only until one config can run:
`start()` compiles this rank's share in the background, without any collective, and the execution
goes on with whichever of them compiles first (`first_ready()`), so it never waits on one config
that happens to compile slowly (a long ptxas run). `Precompiling.finish()` is the collective half,
called by every rank at the same point: the end of the step that met the key, after the ranks have
agreed on what they met. So the keys one execution meets compile side by side instead of each
waiting for the one before, and a key's slowest config no longer stalls the whole function.
"""
from __future__ import annotations

import atexit
import hashlib
import itertools
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ..engine.state import KeyState
from ..runtime.collectives import Collectives
from ..runtime.compat import (
    SAME_BINARY,
    Described,
    LaunchSpec,
    SignatureUnknown,
    await_launcher,
    binary_digest,
    compile_only,
    config_but_stages,
    config_failure_reason,
    describe_compile,
    interpret_mode,
    load_binary,
    prime_backend_hash,
    prime_compiler_hash,
    prime_interpreter,
    same_binary,
    tile_stages_warps,
)
from . import node_lock
from .compile_workers import Excluding, WorkerPool, get_pool

# A thread that hands its config to a worker waits this much longer than compile_timeout_s, so that
# a compile that hangs in the worker is ended by the worker's own limit, which kills it.
WORKER_GRACE_S = 10.0
# ... and this much longer than a budget's straggler cutoff (run's give_up ends that compile first).
GIVE_UP_GRACE_S = 1.0
# At exit, how long the atexit hook waits for compile threads to end their config in hand.
EXIT_WAIT_S = 10.0
EXIT_REASON = Excluding("not compiled: the process is exiting")
STOPPED = "not compiled: stopped"  # a batch's stop was set (stolen configs at the step's end)

# Set by the atexit hook: compile threads take no further config, waits for a place end.
_EXITING = threading.Event()
_threads: set[threading.Thread] = set()  # compile threads started here that have not ended
_abandoned: set[threading.Thread] = set()  # of those, the ones left in a compile past its deadline
_threads_lock = threading.Lock()


def _start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread that the atexit hook knows of until it ends."""
    def run() -> None:
        try:
            target()
        finally:
            with _threads_lock:
                _threads.discard(thread)
                _abandoned.discard(thread)

    # A daemon: an abandoned compile must not hold up the exit (non-daemon threads are joined before
    # atexit hooks run, with no limit); every other one is joined by its caller or by _stop_threads.
    thread = threading.Thread(target=run, name=name, daemon=True)
    with _threads_lock:
        _threads.add(thread)
    thread.start()
    return thread


@atexit.register
def _stop_threads() -> None:
    _EXITING.set()
    GATE.wake()
    deadline = time.monotonic() + EXIT_WAIT_S
    with _threads_lock:
        waiting = [t for t in _threads if t not in _abandoned]
    for thread in waiting:
        thread.join(max(0.0, deadline - time.monotonic()))


# Where a config was compiled (Compiled.places): a compile worker, this process (a thread of its own, under
# the GIL), another local rank (one of their share, found in the shared cache at the step's end), or nowhere,
# since Triton's cache had it already (this process's memory or the disk cache).
WORKER, HERE, RANKS, CACHE = "workers", "here", "ranks", "cache"
PLACES = (WORKER, HERE, RANKS, CACHE)


@dataclass
class Compiled:
    mine: list[int]  # config indices this rank compiled
    seconds: float
    failures: dict[int, str] = field(default_factory=dict)  # config index -> reason (any rank's): excluded
    # Configs precompile could not build (any rank's): their launch compiles them again, with the real
    # arguments, and only a failure there excludes them (precompile may have built the wrong signature).
    rejected: dict[int, str] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)  # not precompiled here, and why: they compile at launch
    by_workers: list[int] = field(default_factory=list)  # config indices a worker process compiled
    workers: dict[str, Any] = field(default_factory=dict)  # the pool's state (WorkerPool.status), {} without one
    ran_meanwhile: list[int] = field(default_factory=list)  # configs the step that met the key launched meanwhile
    # Every config this rank compiled or loaded (its share, then the others'): where, and its own compile time.
    places: dict[int, str] = field(default_factory=dict)
    compile_s: dict[int, float] = field(default_factory=dict)
    cpu_s: dict[int, float] = field(default_factory=dict)  # ... and the CPU time it took (Batch.cpu_s)
    undescribed: dict[int, str] = field(default_factory=dict)  # configs no worker could take, and why
    stolen: list[int] = field(default_factory=list)  # other ranks' configs this rank's workers compiled early
    started: float = 0.0  # perf_counter: when the key's first launch started its compiles
    ended: float = 0.0  # perf_counter: when its last config was compiled (or found in the cache)
    # Where this process spent the key's time (seconds, summed over configs; Batch.phases), then finish()'s
    # own steps: wait (its share still compiling), load, gather, rest (the others' binaries from the cache).
    phases: dict[str, float] = field(default_factory=dict)
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)  # this rank's share: Batch.spans
    shared_ptxas: list[int] = field(default_factory=list)  # its share's configs whose cubin another's ptxas made
    # Configs whose launch is another's (same_binaries), on some rank: excluded like failures, timed as that one.
    same_binary: dict[int, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {p: sum(1 for v in self.places.values() if v == p) for p in PLACES}


class _HereSlot:
    """One config at a time compiles in this process while no worker is ready (Triton's front end holds the GIL:
    a second would only slow the first, and the execution's own thread). A config taken here stays here, so
    none is taken while a worker is ready: the workers drain the queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def try_take(self) -> bool:
        return self._lock.acquire(blocking=False)

    def give_back(self) -> None:
        self._lock.release()


HERE_SLOT = _HereSlot()
# How often a config waiting for a worker looks again whether it may compile here instead.
POLL_S = 0.05
# How long the config an execution waits for waits for a worker (ahead of the others) before compiling here.
FIRST_WAIT_S = 0.5


class InFlight:
    """The binaries being compiled in this process now, by their cache key: a second request for one of them
    (another key of the same kernel whose specialization is the same, a rung prefetched while the first key's
    precompile still compiles it) waits for that compile and then finds it in Triton's disk cache, instead of
    compiling it again beside it. On the GEMM space's three shapes, the second and third keys compiled the first
    rung's two slowest configs again, each from its own start: their first rungs ended 0.9 and 1.1 s after the
    first key's. A compile that failed in a worker (an error, a timeout, a budget's straggler) fails its waiters
    alike: the same binary would fail, or straggle, again."""

    @dataclass
    class Compile:
        done: threading.Event = field(default_factory=threading.Event)
        failure: Any = None  # why its worker did not compile it; None once compiled (or given back unfinished)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compiling: dict[Any, InFlight.Compile] = {}

    def claim(self, key: Any) -> InFlight.Compile | None:
        """None: the caller compiles `key` and must release() it; else the compile under way, to wait() for."""
        with self._lock:
            under_way = self._compiling.get(key)
            if under_way is None:
                self._compiling[key] = InFlight.Compile()
            return under_way

    def release(self, key: Any, failure: Any = None) -> None:
        with self._lock:
            under_way = self._compiling.pop(key, None)
        if under_way is not None:
            under_way.failure = failure
            under_way.done.set()

    def wait(self, under_way: InFlight.Compile, stop: threading.Event | None = None) -> None:
        """Until that compile ends (or this process exits, or `stop` is set)."""
        while not under_way.done.wait(POLL_S):
            if _EXITING.is_set() or (stop is not None and stop.is_set()):
                return


IN_FLIGHT = InFlight()


class NodeClaims:
    """The binaries another process of this node (another local rank) is compiling now: a lock file per binary in
    Triton's cache dir, held (flock) while its worker compiles it. IN_FLIGHT is per process; a budgeted key's rung
    compiles on every rank (prefetch: no collective splits it), so two ranks of a node compiled each of its
    binaries twice, side by side. A config whose lock another process holds waits for it, then finds the binary
    in the cache. Where no lock can be taken (a cache dir without flock), each process compiles its own, as
    before. The OS drops a lock whose process died."""

    BUSY = object()  # take(): another process holds it
    DIR = "ctx_tune_compiling"

    def take(self, key: Any, cache_dir: str) -> int | object | None:
        """The held lock's file descriptor (release() it once compiled), BUSY, or None (no lock here: compile)."""
        fd = node_lock.open_lock(os.path.join(cache_dir, self.DIR), hashlib.sha256(repr(key).encode()).hexdigest()[:32])
        if fd is None:
            return None
        taken = node_lock.take(fd, wait=False)
        if taken is False:
            os.close(fd)
            return self.BUSY
        return fd if taken else None

    def wait(self, key: Any, cache_dir: str, limit_s: float, stop: threading.Event | None = None) -> None:
        """Until no process holds `key`'s lock (or `limit_s` passed, this process exits, or `stop` is set)."""
        deadline = time.monotonic() + limit_s
        while (held := self.take(key, cache_dir)) is self.BUSY:
            if time.monotonic() >= deadline or _EXITING.is_set() or (stop is not None and stop.is_set()):
                return
            time.sleep(POLL_S)
        if isinstance(held, int):
            self.release(held)

    def release(self, fd: int) -> None:
        node_lock.release(fd)


NODE_CLAIMS = NodeClaims()

# How long each (autotuner, config) took to compile in this process, by id (both live as long as the process's
# kernels): the compile time of a config another key compiled, when this key finds it in the cache.
COMPILED_S: dict[tuple[int, int], float] = {}


def local_share(n_configs: int, comm: Collectives) -> list[int]:
    """The configs this rank compiles: all of them alone, its round-robin share among local ranks."""
    if not comm.active:
        return list(range(n_configs))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return [i for i in range(n_configs) if i % local_world == local_rank]


def compile_weight(config: Any) -> float:
    """A guess at how long a config takes to compile, for ordering only: the code one thread runs, its tile (the
    product of its integer meta-parameters of 16 or more) over num_warps, times num_stages. ptxas's time grows
    with the code per thread, so fewer warps over the same tile compile longer: FLA's chunk_bwd_kernel_dqkwg
    (no tile in its configs) took 5.9 to 7.1 s at 2 warps and 1.3 to 1.4 s at 4 on an H200. Against the compile
    times recorded on the FLA step and the MLP op (RESULTS.md section 51), its rank correlation per key is 0.64 to
    0.94; the tile times warps that it replaces had -0.78 to 0.70 (the budget keeps it: budget.tile_weight)."""
    tile, stages, warps = tile_stages_warps(config)
    return tile * stages / warps


def compile_order(configs: list[Any], indices: list[int], cheapest_first: bool = False) -> list[int]:
    """The order in which a rank hands `indices` out: the cheapest first, since an execution waits for the first
    one ready (first_ready), then the rest slowest first, so that the longest compiles do not start last and
    end the key's compile alone (longest processing time first). `cheapest_first`: all of them cheapest first (a
    budget's first rung, which does not wait for stragglers: slowest first, as many stragglers as workers held
    every worker before any config had compiled, so the cutoff, which needs half of the rung compiled, never
    came, and the rung waited for the compile limit)."""
    if len(indices) <= 1 or interpret_mode():  # (the interpreter compiles nothing: the config list's order)
        return list(indices)
    # (a tie goes to more warps as the cheaper: less code per thread)
    ranked = sorted(indices, key=lambda i: (compile_weight(configs[i]), -tile_stages_warps(configs[i])[2], i))
    return ranked if cheapest_first else [ranked[0], *reversed(ranked[1:])]


def default_threads() -> int:
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(32, (os.cpu_count() or 1) // max(local_world, 1)))


def _device() -> int | None:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


@dataclass
class Batch:
    """What compiling some configs gave: kernels, and per config why not."""
    kernels: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)  # excluded: compile_workers.Excluding
    rejected: dict[int, str] = field(default_factory=dict)  # the launch path tries them again
    skipped: dict[int, str] = field(default_factory=dict)  # their signature is known only at launch
    by_workers: list[int] = field(default_factory=list)
    places: dict[int, str] = field(default_factory=dict)  # where each config compiled: PLACES
    compile_s: dict[int, float] = field(default_factory=dict)  # each config's own compile time
    # ... and the CPU seconds it took: a worker's own and its ptxas's; a compile here counts its wall time (it holds
    # the GIL). With more workers than cores the compile times sum to more than the cores gave; these do not.
    cpu_s: dict[int, float] = field(default_factory=dict)
    undescribed: dict[int, str] = field(default_factory=dict)  # configs no worker could take, and why
    ended: float = field(default_factory=time.perf_counter)  # when the last config was settled
    # Summed over configs: describing them (this process, under the GIL), waiting for a worker, the workers'
    # compiles, this process's compile-only launch (a disk-cache hit after a worker; the compile when here).
    phases: dict[str, float] = field(default_factory=dict)
    first_s: float | None = None  # from the start to the first config ready (what an execution waits for)
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)  # perf_counter: a config's place, its end
    shared_ptxas: list[int] = field(default_factory=list)  # by a worker that took another's cubin (shared_ptxas.py)

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds


def _compile(state: KeyState, indices: list[int], args: tuple, kwargs: dict[str, Any], threads: int,
             timeout_s: float, pool: WorkerPool | None = None, device: int | None = None,
             load: bool = True, on_ready: Callable[[int, Any], None] | None = None,
             stop: threading.Event | None = None, later: bool = False, gated: bool = True,
             stragglers: float = math.inf) -> Batch:
    """Compile configs `indices` on up to `threads` threads (and `pool`'s workers); `device` is the
    caller's, since a thread started here (or by start()) begins on device 0; `on_ready(i, kernel)` as each
    config's compile succeeds; `stop`, once set, starts no further config (they count as not compiled);
    `later`: the configs wait in GATE behind every config of any key that is not `later` (stolen ones);
    `gated=False`: they take no place in GATE (a step's end loading what other ranks compiled: it would wait
    behind the background compiles of keys that are still compiling). `stragglers`: once half of the batch (at
    least 2) has compiled, a config still compiling after this many times the batch's median compile fails (its
    worker is killed, as at a timeout; a compile in this process is abandoned): a seconds budget's first rung
    (budget.STRAGGLERS).

    Each config goes to a compile worker when one is ready or starting: its thread waits for a worker rather
    than compiling it here. Here compile: the configs no worker can take (compat.describe_compile says why),
    every config when there is no pool, and, while no worker is ready yet, one config at a time (HERE_SLOT;
    the config an execution waits for does not wait for the slot)."""
    if not indices:
        return Batch()
    if pool is not None:
        threads = max(threads, pool.size + 1)  # one thread per worker keeps every worker busy, one compiles here
    job = _BatchCompile(state, indices, args, kwargs, threads, timeout_s, pool,
                        device if device is not None else _device(), on_ready, stop, later, stragglers)
    out, limit_s = job.out, timeout_s + (WORKER_GRACE_S if pool else 0.0)
    if math.isinf(limit_s) and not job.budgeted and (threads <= 1 or len(indices) <= 1):
        results = {i: job.one(i) if not _EXITING.is_set() else (None, EXIT_REASON) for i in indices}  # no bound
    else:
        with job.gated(indices) if gated else nullcontext():
            done, late = run_with_deadline(indices, job.one, threads, limit_s,
                                           gate=job.enter_gate if gated else None,
                                           # (a worker's compile is given up on in pool.run, which kills the worker;
                                           # the thread is abandoned only for a compile in this process)
                                           cutoff=(lambda: job.cutoff() + (GIVE_UP_GRACE_S if pool else 0.0))
                                           if job.budgeted else None)
        results = dict(done)
        straggled = job.cutoff() if job.budgeted else math.inf
        for i in late:
            results[i] = (None, EXIT_REASON if _EXITING.is_set() else Excluding(
                job.straggler_reason(straggled) if straggled < limit_s else
                f"compile timeout: compiling this config took longer than {timeout_s:g} s, so it was abandoned "
                "(raise compile_timeout_s or TRITON_CTX_TUNE_COMPILE_TIMEOUT if it is just slow)"))
    out.kernels = {i: k for i, (k, r) in results.items() if r is None and i not in out.skipped}
    for i, (_, reason) in results.items():
        if reason is not None:
            (out.failures if isinstance(reason, Excluding) else out.rejected)[i] = reason
    if load:
        out.rejected.update(_load(out.kernels))
    for i in [*out.failures, *out.rejected, *out.skipped]:
        out.places.pop(i, None)
    out.by_workers = sorted(i for i, p in out.places.items() if p == WORKER)
    out.ended = time.perf_counter()
    return out


def straggler_cutoff(compiled_s: Iterable[float], size: int, stragglers: float) -> float:
    """`stragglers` times the half-th fastest of a batch of `size` configs' compile seconds, once half of it (at least
    two) has compiled; inf before (a budget's first rung: _BatchCompile.cutoff)."""
    half = max(2, (size + 1) // 2)
    seconds = sorted(compiled_s)
    return stragglers * seconds[half - 1] if len(seconds) >= half else math.inf


@dataclass
class _Held:
    """What one config's thread holds while its worker compiles the binary (released when the config settles)."""
    binary: Any = None  # claimed in this process (IN_FLIGHT): other keys' configs of the same binary wait for it
    node_lock: int | None = None  # ... and on the node (NODE_CLAIMS): other ranks' configs wait for it

    def release(self) -> None:
        if self.node_lock is not None:
            NODE_CLAIMS.release(self.node_lock)
            self.node_lock = None
        if self.binary is not None:
            IN_FLIGHT.release(self.binary)
            self.binary = None


class _BatchCompile:
    """The state that one _compile call's threads share: each runs one() for a config at a time."""

    def __init__(self, state: KeyState, indices: list[int], args: tuple, kwargs: dict[str, Any], threads: int,
                 timeout_s: float, pool: WorkerPool | None, device: int | None,
                 on_ready: Callable[[int, Any], None] | None, stop: threading.Event | None, later: bool,
                 stragglers: float) -> None:
        self.state, self.args, self.kwargs, self.threads = state, args, kwargs, threads
        self.timeout_s, self.pool, self.device, self.on_ready, self.stop = timeout_s, pool, device, on_ready, stop
        self.later, self.stragglers = later, stragglers
        self.out = Batch()
        self.first = indices[0] if on_ready is not None else None  # what a waiting execution runs first
        # Configs that start at once, on front workers (compile_workers.WorkerPool), without a place in GATE: the
        # first, and every config of a batch no larger than the front (a small key's, met late in a step).
        front = pool.front if pool is not None and not later else 0
        self.at_once = set(indices) if 0 < len(indices) <= front else {self.first} - {None}
        self.started = time.perf_counter()
        self.budgeted = math.isfinite(stragglers) and len(indices) > 1
        self.size = len(indices)
        self.gate_places: dict[int, Place] = {}
        # Configs another key's batch compiled (this one waited for it, or found it in the cache after): they count
        # towards the half that arms the straggler cutoff, as this batch's own compiles do. Two keys of one kernel
        # that split the rung's binaries between them each saw only their own half otherwise, and neither cut its
        # straggler off.
        self.compiled_elsewhere_s: dict[int, float] = {}

    # ---- the gate, and the straggler cutoff ----------------------------------------------------------------

    @property
    def gate_size(self) -> int:
        return len(self.state.configs) + (CompileGate._LATER if self.later else 0)

    @contextmanager
    def gated(self, indices: list[int]) -> Iterator[None]:
        """Announce to GATE the configs that will ask it for a place (all but those that start at once), so that its
        order counts them as left before their threads ask; at the end, take back those that never asked."""
        expected = sum(1 for i in indices if i not in self.at_once)
        GATE.expect(expected, self.gate_size, id(self.state))
        try:
            yield
        finally:
            GATE.expect(-(expected - len([i for i in self.gate_places if i not in self.at_once])), self.gate_size,
                        id(self.state))

    def enter_gate(self, i: int) -> Place:
        place = self.gate_places[i] = GATE.enter(i in self.at_once, self.threads, self.gate_size,
                                                 key=id(self.state))
        return place

    def _stepped_out(self, i: int) -> Any:
        """Config i's gate place given back while it waits for another compile of its binary (Place)."""
        place = self.gate_places.get(i)
        return place.stepped_out() if place is not None else nullcontext()

    def cutoff(self) -> float:
        """`stragglers` times the batch's median compile: its half-th fastest, once half of it has compiled. The
        configs compiled first are the fastest when they start at once or cheapest first (compile_order), so this
        is the batch's median, not the median of the half compiled so far (its 25th percentile)."""
        # (copies: compile threads add to them meanwhile)
        return straggler_cutoff({**dict(self.compiled_elsewhere_s), **dict(self.out.compile_s)}.values(), self.size,
                                self.stragglers)

    def straggler_reason(self, seconds: float) -> str:
        return (f"not explored: still compiling after {seconds:.2g} s, {self.stragglers:g}x the median compile of "
                "the budget's first rung (it does not wait for stragglers)")

    def _straggling(self, waited_s: float) -> str | None:
        """A worker's compile past the cutoff: given up on, its worker killed (no thread is left waiting on it)."""
        limit = self.cutoff()
        return self.straggler_reason(limit) if waited_s >= limit else None

    # ---- one config ---------------------------------------------------------------------------------------

    def one(self, i: int) -> tuple[Any, str | None]:
        """(config i's kernel, None) once compiled, else (None, why not)."""
        entered = time.perf_counter()  # its place in the gate taken: it starts to be described
        try:
            return self._settle(i)
        finally:
            self.out.spans[i] = (entered, time.perf_counter())

    def _halted(self) -> str | None:
        if _EXITING.is_set():
            return EXIT_REASON
        return STOPPED if self.stop is not None and self.stop.is_set() else None

    def _describe(self, i: int, ship: bool = True) -> Described:
        return describe_compile(self.state.autotuner, self.state.configs[i], self.args, self.kwargs, ship=ship)

    def _compiled(self, i: int, seconds: float, cpu_s: float | None = None) -> None:
        self.out.compile_s[i] = COMPILED_S[self._compiled_key(i)] = seconds
        self.out.cpu_s[i] = seconds if cpu_s is None else cpu_s

    def _compiled_key(self, i: int) -> tuple[int, int]:
        """Config i's key in COMPILED_S."""
        return id(self.state.autotuner), id(self.state.configs[i])

    def _settle(self, i: int) -> tuple[Any, str | None]:
        out, pool = self.out, self.pool
        if self.device is not None:
            torch.cuda.set_device(self.device)  # Triton picks the target from this thread's current device
        if self.stop is not None and self.stop.is_set():
            return None, STOPPED
        held = _Held()
        try:
            if not interpret_mode():  # (the interpreter compiles nothing: no cache to find, nothing to describe)
                began = time.perf_counter()
                described = self._describe(i, ship=pool is not None)
                out.add("describe_s", time.perf_counter() - began)
                if described.spec is not None and pool is not None:
                    described, halted = self._claim(i, described, held)
                    if halted is not None:
                        return None, halted
                if described.cached:
                    out.places[i] = CACHE
                    if (seconds := COMPILED_S.get(self._compiled_key(i))) is not None:
                        self.compiled_elsewhere_s[i] = seconds
                elif described.spec is not None and pool is not None:
                    failure = self._by_worker(i, described.spec)
                    if failure is not None:
                        if held.binary is not None and failure is not EXIT_REASON and failure != STOPPED:
                            IN_FLIGHT.release(held.binary, failure)  # the binary's own failure: its waiters' too
                            held.binary = None
                        return None, failure
                elif described.reason is not None and pool is not None:
                    out.undescribed[i] = described.reason
            # The waited-for config compiling here holds HERE_SLOT if it is free: no other config joins it under
            # the GIL while the execution waits for it.
            slot = i == self.first and i not in out.places and HERE_SLOT.try_take()
            began = time.perf_counter()
            try:
                kernel = compile_only(self.state.autotuner, [self.state.configs[i]], self.args, self.kwargs)[0]
            finally:
                if slot:
                    HERE_SLOT.give_back()
            out.add("parent_s", time.perf_counter() - began)
            if i not in out.places:  # compiled by that launch, on this thread
                out.places[i] = HERE
                self._compiled(i, time.perf_counter() - began)
            if out.first_s is None:
                out.first_s = time.perf_counter() - self.started
            if self.on_ready is not None:
                self.on_ready(i, kernel)
            return kernel, None
        except SignatureUnknown as e:
            out.skipped[i] = f"not precompiled: {e}; it compiles at its first launch"
            return None, None
        except Exception as e:
            reason = config_failure_reason(e)
            if reason is None:
                raise
            return None, reason
        finally:
            held.release()

    def _claim(self, i: int, described: Described, held: _Held) -> tuple[Described, str | None]:
        """Claim config i's binary, in this process (IN_FLIGHT) and then on the node (NODE_CLAIMS), into `held`;
        where another key, batch or rank compiles it now, wait for that compile (out of the gate) and describe it
        again: it is in the cache then. (What describes it now, why this config stops: exiting, stopped, or the
        binary's failure in this process.)"""
        while described.spec is not None and held.binary is None:
            binary = described.spec.binary_key()
            under_way = IN_FLIGHT.claim(binary)
            if under_way is None:
                held.binary = binary
                break
            # Compiling for another key or batch now: wait, then find it in the cache; it fails as it failed there,
            # and if it was given back unfinished (stopped), this config claims it.
            with self._stepped_out(i):
                IN_FLIGHT.wait(under_way, self.stop)
            if (halted := self._halted()) is not None:
                return described, halted
            if under_way.failure is not None:
                return described, under_way.failure
            described = self._describe(i)
        # Node-wide, except the config an execution waits for: it never waits for another rank's compile. A binary
        # another rank compiled is in the cache after; one it did not (it failed there, or the wait ran out) this
        # process compiles itself.
        if held.binary is None or described.spec is None or i == self.first:
            return described, None
        cache_dir = described.spec.cache_dir
        taken = NODE_CLAIMS.take(held.binary, cache_dir)
        if taken is NodeClaims.BUSY:
            with self._stepped_out(i):
                NODE_CLAIMS.wait(held.binary, cache_dir, self.timeout_s, self.stop)
            if (halted := self._halted()) is not None:
                return described, halted
            described = self._describe(i)
            taken = NODE_CLAIMS.take(held.binary, cache_dir) if described.spec is not None else None
        elif isinstance(taken, int) and self._describe(i, ship=False).cached:
            # Another rank compiled it and let go between this config's description and the lock: compiled again
            # here, the node would compile it twice.
            NODE_CLAIMS.release(taken)
            return Described(None, True), None
        held.node_lock = taken if isinstance(taken, int) else None
        return described, None

    def _by_worker(self, i: int, spec: LaunchSpec) -> str | None:
        """Config i by a compile worker: why it failed there (never compiled here: it may hang or crash this
        process), else None, and out.places says whether a worker compiled it (else the caller compiles it here)."""
        pool, out = self.pool, self.out
        assert pool is not None
        while pool.usable(spec):
            if (halted := self._halted()) is not None:
                return halted
            # The config an execution waits for takes the next worker to be free, ahead of every other config, and
            # compiles here only if none is free within FIRST_WAIT_S (POLL_S while the first workers are being
            # forked and none is ready yet: at a cold start): compiling here, under the GIL beside the execution,
            # took FLA's large chunk_bwd_kernel_dqkwg config 7.3 s against 3.8 s in a worker. That holds within
            # the fork grace too: a key met then (FLA's chunk_fwd_kernel_o, 1.1 s in) found every ready worker busy
            # and compiled here in 0.74 to 0.91 s against 0.54 s in a worker, on the execution's path.
            waited = time.perf_counter()
            acquired = (pool.acquire(FIRST_WAIT_S if pool.ready() else POLL_S if pool.forking() else 0.0, urgent=True,
                                     front=True) if i == self.first else
                        pool.acquire(POLL_S, urgent=i in self.at_once, front=i in self.at_once))
            out.add("wait_s", time.perf_counter() - waited)
            if acquired is None and i == self.first:
                return None
            if acquired is not None:
                outcome = pool.run(acquired, spec, self.timeout_s,
                                   give_up=self._straggling if self.budgeted else None)
                if outcome is None:
                    return None  # the worker could not rebuild the kernel: here, counted
                self._compiled(i, outcome.seconds, outcome.cpu_s)
                out.add("worker_s", outcome.seconds)
                if outcome.failure is not None:
                    return outcome.failure
                out.places[i] = WORKER
                if outcome.shared_ptxas:
                    out.shared_ptxas.append(i)
                return None
            if pool.ready() == 0 or not pool.live():
                if not pool.live():
                    return None
                if not pool.forking() and HERE_SLOT.try_take():
                    try:
                        began = time.perf_counter()
                        compile_only(self.state.autotuner, [self.state.configs[i]], self.args, self.kwargs)
                        self._compiled(i, time.perf_counter() - began)
                        out.places[i] = HERE
                    finally:
                        HERE_SLOT.give_back()
                    return None
        return None


def _load(kernels: dict[int, Any]) -> dict[int, str]:
    """Load compiled kernels onto the device (the caller's thread: it touches the CUDA context)."""
    failures: dict[int, str] = {}
    for i, kernel in kernels.items():
        try:
            load_binary(kernel)
        except Exception as e:
            reason = config_failure_reason(e)
            if reason is None:
                raise
            failures[i] = reason
    return failures


T = TypeVar("T")


class CompileGate:
    """The process's order for compiles in the background, over every key at once: a key's first config
    (the one its execution waits for in first_ready) starts at once, as do all of a small key's (_BatchCompile.
    at_once: on front workers); the others share `width - 1` places.

    Each key used to compile on threads of its own, all side by side: a key met late in an execution
    waited behind the earlier keys' configs (FLA's step, 159 configs, on one H200: 19.6 s in the first
    online call). Now every key met waits for its own first config, compiled beside at most `width - 1`
    others. The rest go fewest waiting first: the key with the fewest configs not yet placed, then the smaller
    key, then in the order asked. Online, a key is decided only once all its configs are compiled, so a key
    of 6 configs met after three of 48 no longer waits for their 141 (FLA's chunk_bwd_kernel_dqkwg: undecided
    after 300 calls). Counting what is left rather than the key's size, a large key's last config is not held
    behind a small key met after it: the MLP op's GEMM config 1 (0.33 s) waited for GELU's 7 configs, met 0.35 s
    in, and ended the key's compile 0.1 s after its other configs (RESULTS.md section 50).

    What is left counts the configs a batch has announced (expect()) and not yet queued, as well as those queued:
    a batch asks for places on at most one thread per worker, so a key of 48 configs that holds most places has
    few of them queued at any time. Counted by what was queued alone, FLA's chunk_fwd_kernel_h (48 configs, about
    25 left) went ahead of chunk_bwd_kernel_dqkwg's 5, met 1 s after it, and dqkwg's 6 s compiles started 0.8 to
    1.2 s late (RESULTS.md section 51)."""

    _LATER = 1 << 30  # a `size` at least this: behind every other config (another rank's share, stolen)

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rest = 0
        self._waiting: dict[int, tuple[int, object]] = {}  # ticket number: (size, key)
        self._queued: Counter[tuple[int, object]] = Counter()  # per band and key, its configs waiting here
        self._expected: Counter[tuple[int, object]] = Counter()  # ... and those announced, not yet queued
        self._first: int | None = None  # the ticket served next
        self._tickets = itertools.count()

    def enter(self, first: bool, width: int, size: int = 0, key: object = None) -> Place:
        """Wait for a place (a first config never waits; `size`: its key's configs; `key`: whose configs are
        counted together); returns it. Its release is idempotent: a compile abandoned at its deadline gives
        its place back, while its thread may never end. At exit it returns at once, without a place (its
        caller compiles nothing)."""
        place = Place(self if not first else None, width)
        if first or not self.take(width, size, key):
            place.held = False
        return place

    def _rank(self, ticket: int) -> tuple[int, int, int, int]:
        size, key = self._waiting[ticket]
        band = self._band(size)
        left = self._queued[band, key] + self._expected[band, key] if key is not None else 1
        return band, left, size, ticket

    def _band(self, size: int) -> int:
        # -1: a config coming back from outside its place, ahead of every other; then the others; then later ones
        return -1 if size < 0 else 1 if size >= self._LATER else 0

    def expect(self, count: int, size: int, key: object) -> None:
        """`count` more of `key`'s configs (its `size`) will ask for a place: counted as left from now; a negative
        count takes back those that never asked (their batch ended first)."""
        with self._cond:
            self._count(self._expected, (self._band(size), key), count)
            self._find_first()
            self._cond.notify_all()

    @staticmethod
    def _count(counter: Counter[tuple[int, object]], counted: tuple[int, object], change: int) -> None:
        counter[counted] += change
        if counter[counted] <= 0:
            del counter[counted]

    def _queue(self, ticket: int, entry: tuple[int, object] | None) -> None:
        """Add a ticket (`entry`: its size and key) or take it out (None), and find the next one served. The
        head is found here, once per change, not by every waiter at every wake-up."""
        if entry is not None:
            self._waiting[ticket] = entry
        size, key = entry if entry is not None else self._waiting.pop(ticket)
        counted = (self._band(size), key)
        self._count(self._queued, counted, 1 if entry is not None else -1)
        if entry is not None and counted in self._expected:
            self._count(self._expected, counted, -1)  # announced: now queued
        self._find_first()

    def _find_first(self) -> None:  # under self._cond, after a change of the queue or of what is left
        self._first = min(self._waiting, key=self._rank) if self._waiting else None

    def take(self, width: int, size: int, key: object = None) -> bool:
        """Wait for a place, in the gate's order (`size` -1: ahead of every config queued); False at exit (no
        place taken)."""
        ticket = next(self._tickets)
        with self._cond:
            self._queue(ticket, (size, key))
            self._cond.notify_all()  # (a new head: the ticket it displaced must see it)
            self._cond.wait_for(lambda: _EXITING.is_set()
                                or (self._rest < max(1, width - 1) and self._first == ticket))
            self._queue(ticket, None)
            self._cond.notify_all()  # the next ticket may have a place too (or, at exit, see it)
            if _EXITING.is_set():
                return False
            self._rest += 1
            return True

    def give(self) -> None:
        """Give back a place that take() returned."""
        with self._cond:
            self._rest -= 1
            self._cond.notify_all()

    def wake(self) -> None:
        """Let every waiter see that the process is exiting."""
        with self._cond:
            self._cond.notify_all()


class Place:
    """A config's place in the CompileGate (none for a key's first config). A config that waits for another
    key's compile of its binary (InFlight) steps out of its place meanwhile: holding it, two keys that split a
    rung's binaries filled the gate with waiters and the configs that would have compiled waited behind them
    (a budget's straggler then was never cut off: too few of the rung had compiled)."""

    def __init__(self, gate: CompileGate | None, width: int) -> None:
        self._gate, self._width = gate, width
        self._lock = threading.Lock()
        self.held = gate is not None
        self._closed = False  # released for good (done, or abandoned at its deadline)

    def __call__(self) -> None:
        """Release it for good (idempotent)."""
        with self._lock:
            self._closed = True
            held, self.held = self.held, False
        if held and self._gate is not None:
            self._gate.give()

    @contextmanager
    def stepped_out(self) -> Iterator[None]:
        """Give the place back for the block's time; take it again after, ahead of every config queued."""
        with self._lock:
            held, self.held = self.held, False
        if not held or self._gate is None:
            yield
            return
        self._gate.give()
        try:
            yield
        finally:
            if self._gate.take(self._width, -1):
                with self._lock:
                    keep = not self._closed
                    self.held = keep
                if not keep:  # abandoned meanwhile: nobody will release it
                    self._gate.give()


GATE = CompileGate()


def run_with_deadline(tasks: list[int], work: Callable[[int], T], threads: int, timeout_s: float,
                      gate: Callable[[int], Callable[[], None]] | None = None,
                      cutoff: Callable[[], float] | None = None) -> tuple[dict[int, T], list[int]]:
    """work(i) for every task on up to `threads` threads: ({task: result}, [tasks that ran out of time]).
    `gate(i)`, if given, waits for task i's place before its deadline starts and returns its release.
    `cutoff()`, if given: a shorter deadline than timeout_s when it says so (read again as tasks settle).

    A task running longer than timeout_s is abandoned: nobody waits for it, and a new thread takes
    its place. A thread cannot be killed, so the threads are daemons: one stuck in a compiler must
    not hold up this call's return, nor the interpreter's exit (ThreadPoolExecutor's workers would:
    they are joined at exit). Every other thread is joined before this returns: one still ending
    when the process exits would be ended inside the interpreter's finalization instead. At exit
    (the atexit hook), no further task starts and the tasks not settled count as late.
    An exception in work() is re-raised here once every task is settled.
    """
    lock = threading.Lock()
    settled = threading.Condition(lock)
    pending = list(reversed(tasks))
    started: dict[int, float] = {}
    results: dict[int, tuple[bool, Any]] = {}
    late: list[int] = []
    places: dict[int, Callable[[], None]] = {}
    spawned: list[threading.Thread] = []
    running_on: dict[int, threading.Thread] = {}  # task: the thread working on it

    def worker() -> None:
        while True:
            with lock:
                if not pending or _EXITING.is_set():
                    settled.notify_all()
                    return
                i = pending.pop()
                running_on[i] = threading.current_thread()
            release = gate(i) if gate is not None else (lambda: None)
            if _EXITING.is_set():
                release()
                with lock:
                    settled.notify_all()
                return
            with lock:
                places[i] = release
                started[i] = time.monotonic()
            try:
                outcome: tuple[bool, Any] = (True, work(i))
            except BaseException as e:  # noqa: BLE001 (handed to the waiting thread, which re-raises it)
                outcome = (False, e)
            release()
            with lock:
                if i in late:
                    return  # abandoned: a replacement thread has taken over the queue
                results[i] = outcome
                settled.notify_all()

    def spawn() -> None:
        spawned.append(_start_thread(worker, "ctx-tune-compile"))

    for _ in range(max(1, min(threads, len(tasks)))):
        spawn()
    with lock:
        while len(results) + len(late) < len(tasks):
            now = time.monotonic()
            running = [i for i in started if i not in results and i not in late]
            limit = min(timeout_s, cutoff()) if cutoff is not None else timeout_s
            for i in running:
                if now - started[i] >= limit:
                    late.append(i)
                    places[i]()
                    with _threads_lock:
                        if running_on[i] in _threads:  # not ended meanwhile
                            _abandoned.add(running_on[i])
                    if pending:
                        spawn()
            abandoned = {running_on[i] for i in late}
            if _EXITING.is_set() and not any(t.is_alive() for t in spawned if t not in abandoned):
                late.extend(i for i in tasks if i not in results and i not in late)
                break
            deadlines = [started[i] + limit - now for i in running if i not in late]
            settled.wait(timeout=min(deadlines + [1.0]) if deadlines else 1.0)
        abandoned = {running_on[i] for i in late if i in started}
    for thread in spawned:
        if thread not in abandoned:
            thread.join()  # its last task is settled: it is on its way out
    errors = [value for ok, value in (results[i] for i in tasks if i in results) if not ok]
    if errors:
        raise errors[0]
    return {i: value for i, (ok, value) in results.items()}, sorted(late)


def _pool(workers: int, state: KeyState) -> WorkerPool | None:
    if workers <= 0:
        return None
    try:
        return get_pool(workers)
    except (RuntimeError, OSError):
        return None  # no GPU driver to name the target, no process to start: the threads compile


class Precompiling:
    """One key's precompilation: this rank's share compiling in the background (start), then the
    collective half (finish), which every rank calls at the same point of the same step."""

    def __init__(self, state: KeyState, args: tuple, kwargs: dict[str, Any], comm: Collectives, threads: int,
                 timeout_s: float, workers: int, stragglers: float = math.inf) -> None:
        self.state, self.args, self.kwargs = state, args, kwargs
        self.threads, self.timeout_s, self.stragglers = threads, timeout_s, stragglers
        self.started = time.perf_counter()
        # A budgeted search's configs beyond its first rung (state.later) compile at their first launch, if
        # a rung ever chooses them.
        skip = set(state.failures) | set(state.carried) | set(state.later)
        # Configs already failed (quarantined: they killed a process) are neither compiled nor run; carried
        # ones (incremental re-tuning) take no slot and compile at their first launch if they win.
        cheapest_first = math.isfinite(stragglers)
        self.mine = compile_order(state.configs, [i for i in local_share(len(state.configs), comm) if i not in skip],
                                  cheapest_first)
        # The other local ranks' configs, their owners' order reversed (owners start at the front): this rank's
        # workers compile them once its own share is done, while the finish() of the step is not reached yet, so no
        # rank's workers idle while another's queue is long. Their outcome only warms Triton's disk cache.
        self.others = list(reversed(compile_order(state.configs, [i for i in range(len(state.configs))
                                                                   if i not in self.mine and i not in skip],
                                                  cheapest_first)))
        self.ran_meanwhile: list[int] = []  # what first_ready() handed to the execution
        self._ready: list[int] = []
        self._kernels: dict[int, Any] = {}  # the ready configs' binaries
        self.launcher_wait_s = 0.0  # first_ready()'s waits for a launcher being built
        self._settled = False
        self._cond = threading.Condition()
        self._stop_stealing = threading.Event()
        self.stolen: list[int] = []
        self.pool = _pool(workers, state)
        self.device = _device()
        if not interpret_mode():
            # Here, once: the threads started below, and this execution's own compile, would all compute them.
            prime_compiler_hash()
            prime_backend_hash()
        else:
            prime_interpreter(state.autotuner)  # its AST is parsed here, not on a compile thread
        self._outcome: Batch | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Precompiling:
        self._thread = _start_thread(self._compile_mine, "ctx-tune-precompile")
        return self

    def _compile_mine(self, waited_for: bool = True) -> None:
        """`waited_for`: an execution waits for the first config (first_ready): it compiles here at once when no
        worker is idle. Not when both halves run at once (precompile()): then no config is in a hurry."""
        try:
            self._outcome = _compile(self.state, self.mine, self.args, self.kwargs, self.threads, self.timeout_s,
                                     self.pool, self.device, load=False,
                                     on_ready=self._on_ready if waited_for else None, stragglers=self.stragglers)
        except BaseException as e:  # noqa: BLE001 (re-raised by finish(), on the thread that owns the call)
            self._error = e
        finally:
            with self._cond:
                self._settled = True
                self._cond.notify_all()
        if self._error is None and self.pool is not None and self.others and not self._stop_stealing.is_set():
            try:
                stolen = _compile(self.state, self.others, self.args, self.kwargs, self.threads, self.timeout_s,
                                  self.pool, self.device, load=False, stop=self._stop_stealing, later=True)
                self.stolen = sorted(i for i, p in stolen.places.items() if p == WORKER)
            except Exception:  # noqa: BLE001 (a head start only: finish() compiles these configs itself)
                pass

    def _on_ready(self, index: int, kernel: Any) -> None:
        with self._cond:
            self._ready.append(index)
            self._kernels[index] = kernel
            self._cond.notify_all()

    def first_ready(self) -> int | None:
        """The first config of this rank's share to finish compiling, waiting for one; None when none
        of them compiled (all failed, or the share is empty). Which one it is differs between ranks."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._ready) or self._settled)
            if not self._ready:
                return None
            index = self._ready[0]
            self.ran_meanwhile.append(index)
        # Its launch loads it: where the launcher of its signature is being built (compat.prebuild_launcher, started
        # when the key's configs were described), wait for that build. Triton's load would otherwise run the C
        # compiler again, from now: on 2 H200s the example's first execution built both of its launchers so, 0.5 to
        # 0.8 s each, on its path, while the builds started earlier were still running (RESULTS.md, section 39).
        began = time.perf_counter()
        await_launcher(self._kernels[index])
        self.launcher_wait_s += time.perf_counter() - began
        return index

    def ready_here(self) -> set[int]:
        """The configs of this rank's share that have compiled so far."""
        with self._cond:
            return set(self._ready)

    @property
    def done(self) -> bool:
        """Whether this rank's share has finished compiling (finish() would not wait for it)."""
        with self._cond:
            return self._settled

    def wait(self, timeout_s: float | None) -> bool:
        """Wait up to `timeout_s` (None: as long as it takes) for this rank's share to finish, once started (not
        when finish() compiles it); whether it has."""
        with self._cond:
            if self._thread is not None:
                self._cond.wait_for(lambda: self._settled, timeout_s)
            return self._settled

    def finish(self, comm: Collectives) -> Compiled:
        self._stop_stealing.set()  # no further stolen config starts
        clock = time.perf_counter()
        if self._thread is None:
            self._compile_mine(waited_for=False)
        else:
            # This rank's share only: a stolen config still in a worker's hands is left to finish in the background.
            # Its owner has compiled it by now (every rank finished its share), so waiting for it gains nothing, and
            # it cost FLA's step 5.6 s (a chunk_bwd_kernel_dqkwg config, 6 s to compile, stolen just before).
            self.wait(None)
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        mine, state, n, pool = self._outcome, self.state, len(self.state.configs), self.pool
        phases = dict(mine.phases)

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            phases[name] = now - clock
            clock = now
        lap("finish_wait_s")
        mine.rejected.update(_load(mine.kernels))
        lap("finish_load_s")
        failures, rejected = _share(comm, mine, n, "share precompile results")
        lap("finish_gather_s")
        # The others' binaries are in the shared Triton cache now: loading them here is cheap and keeps
        # the load out of the first slot (compiled here instead when caches are not shared).
        rest = [i for i in range(n) if i not in self.mine and i not in failures and i not in rejected
                and i not in state.failures and i not in state.carried and i not in state.later]
        more = _compile(state, rest, self.args, self.kwargs, self.threads, self.timeout_s, pool, self.device,
                        gated=False)
        lap("finish_rest_s")
        if mine.first_s is not None:
            phases["first_ready_s"] = mine.first_s
        if self.launcher_wait_s:
            phases["launcher_wait_s"] = self.launcher_wait_s
        # A config can fail here alone (a timeout on this rank, a binary this GPU cannot load):
        # share that too, so every rank treats the same configs alike from the first slot on.
        # Only configs that stand so far may stand for others: one failed on any rank (a compile timeout there)
        # must not take a working binary out with it.
        fallen = {**failures, **rejected, **mine.rejected, **more.failures, **more.rejected}
        more.failures.update(same_binaries(state.configs, {i: k for i, k in {**mine.kernels, **more.kernels}.items()
                                                           if i not in fallen}))
        more_failures, more_rejected = _share(comm, more, n, "share load results")
        same = {i: r for i, r in more_failures.items() if same_binary(r)}  # timed as another: not failed
        failures.update({i: r for i, r in more_failures.items() if i not in same})
        rejected.update({i: r for i, r in more_rejected.items() if i not in failures})
        places = {i: p for i, p in {**mine.places, **more.places}.items()
                  if i not in failures and i not in rejected and i not in mine.rejected}
        for i in rest:  # the other ranks' share, loaded from the shared cache: theirs, unless this rank stole it
            if places.get(i) == CACHE:
                places[i] = WORKER if i in self.stolen else RANKS
        compile_s = {**more.compile_s, **mine.compile_s}
        cpu_s = {**more.cpu_s, **mine.cpu_s}
        by_workers = sorted(i for i in self.mine if places.get(i) == WORKER)
        return Compiled(sorted(self.mine), time.perf_counter() - self.started, failures=failures, rejected=rejected,
                        same_binary=same,
                        skipped={**mine.skipped, **more.skipped}, by_workers=by_workers,
                        workers={} if pool is None else pool.status(),
                        ran_meanwhile=sorted(set(self.ran_meanwhile)), places=places, compile_s=compile_s,
                        cpu_s=cpu_s,
                        undescribed={**mine.undescribed, **more.undescribed}, stolen=list(self.stolen),
                        started=self.started, ended=max(mine.ended, more.ended if rest else 0.0), phases=phases,
                        spans=mine.spans, shared_ptxas=sorted(i for i in mine.shared_ptxas if places.get(i) == WORKER))


def same_binaries(configs: list[Any], kernels: dict[int, Any]) -> dict[int, str]:
    """Configs whose launch would be another's: the same binary and metadata (compat.binary_digest) and the same
    config but for num_stages, which then changed nothing the kernel compiles to (a kernel with no loop to
    pipeline). All but the first of each group, with the reason that leaves them out of the timing: timing them
    times the first again, and their near-ties cost confirmation rounds (FLA's chunk_bwd_kernel_dqkwg: 6 configs,
    2 binaries). Their times stay infinite and the first's decides; every rank leaves out what any rank found."""
    first: dict[tuple[str, str], int] = {}
    same: dict[int, str] = {}
    for i in sorted(kernels):
        digest = binary_digest(kernels[i])
        if digest is None:
            continue
        k = first.setdefault((digest, config_but_stages(configs[i])), i)
        if k != i:
            same[i] = (f"{SAME_BINARY}{k}: they differ only in num_stages, which changes nothing this kernel compiles "
                       f"to, so config {k}'s time is its time")
    return same


def _share(comm: Collectives, batch: Batch, n: int, what: str) -> tuple[dict[int, str], dict[int, str]]:
    """Every rank's failures and rejections of `batch`, on every rank, in one gather: a rejection of config
    i travels as index n + i. A config that one rank rejected and another failed counts as failed."""
    both = comm.share_failures({**batch.failures, **{n + i: r for i, r in batch.rejected.items()}}, 2 * n, what)
    failures = {i: r for i, r in both.items() if i < n}
    return failures, {i - n: r for i, r in both.items() if i >= n and i - n not in failures}


def start(state: KeyState, args: tuple, kwargs: dict[str, Any], comm: Collectives, threads: int,
          timeout_s: float = math.inf, workers: int = 0, stragglers: float = math.inf) -> Precompiling:
    """Begin compiling this rank's share of `state`'s configs in the background (`stragglers`: _compile's)."""
    return Precompiling(state, args, kwargs, comm, threads, timeout_s, workers, stragglers).start()


def precompile(state: KeyState, args: tuple, kwargs: dict[str, Any], comm: Collectives, threads: int,
               timeout_s: float = math.inf, workers: int = 0) -> Compiled:
    """Compile every config of `state` now, before its first slot (both halves at once)."""
    return Precompiling(state, args, kwargs, comm, threads, timeout_s, workers).finish(comm)


def prefetch(state: KeyState, indices: list[int], args: tuple, kwargs: dict[str, Any], threads: int,
             timeout_s: float = math.inf, workers: int = 0,
             on_done: Callable[[dict[int, float]], None] | None = None) -> threading.Thread | None:
    """Compile a budgeted search's next rung (engine/budget.py) on a thread, with no collective: this rank
    compiles all of `indices` into Triton's cache, side by side, so the rung's slots find them compiled (the
    executor joins the thread before the rung's first slot). A config that cannot compile fails at its launch,
    which marks it failed as any launch does. `on_done(compile_s)`: each config's compile seconds, at the end."""
    if not indices or interpret_mode():
        return None
    device = _device()
    pool = _pool(workers, state)

    def run() -> None:
        try:
            batch = _compile(state, indices, args, kwargs, threads, timeout_s, pool, device, load=False)
            if on_done is not None:
                on_done(batch.compile_s)
        except Exception:  # noqa: BLE001 (a head start only: the launch compiles, and reports, what failed here)
            pass

    return _start_thread(run, "ctx-tune-prefetch")
