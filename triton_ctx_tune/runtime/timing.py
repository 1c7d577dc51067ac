"""Timing one slot: CUDA events on the current stream, replays of a CUDA graph, or the host clock.

CUDA events are read only at the end of a step, so tuning never adds a host sync per launch.
Under TRITON_INTERPRET=1 (or without a GPU) kernels run synchronously on the host, and the
host clock measures the same span. With `cuda_graph=True` a timed slot is measured as replays
of a graph that holds the launch (the idea of Triton's do_bench_cudagraph): the time a kernel
takes when deployed under CUDA graphs, without the host's launch overhead.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

from .compat import interpret_mode

_L2_FLUSH_BYTES = 256 * 1024 * 1024  # what Triton's do_bench clears: more than any current L2
_flush_buffers: dict[int, torch.Tensor] = {}


def _flush_l2() -> None:
    dev = torch.cuda.current_device()
    buf = _flush_buffers.get(dev)
    if buf is None:
        buf = _flush_buffers[dev] = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    buf.zero_()


_sleep_rates: dict[int, float] = {}  # device -> torch.cuda._sleep cycles per second


def _sleep_cycles_per_second() -> float:
    """Measured once per device (one synchronize): the GPU's clock, as torch.cuda._sleep counts it."""
    dev = torch.cuda.current_device()
    rate = _sleep_rates.get(dev)
    if rate is None:
        cycles = 2_000_000
        torch.cuda._sleep(1000)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rate = _sleep_rates[dev] = cycles / max(begin.elapsed_time(end) / 1e3, 1e-6)
    return rate


class HostLead:
    """How long the GPU must wait before a timed launch for the host to enqueue the launch ahead of it.

    A timed slot's span runs from the start event to the end event on the GPU. When the host takes longer to
    enqueue the launch (argument binding, the config's hooks, Triton's launcher; more while compile workers
    load the node's cores) than the GPU takes to reach the start event, the GPU idles inside the span, and the
    sample counts the host's latency: on a GEMM space tuned beside its compiles (2 H200s, issue 35) the samples
    ran 1.2x the exhaustive sweep's samples of the same configs on the key launched first in each step, and
    about 1.0x on the next, which found the GPU still busy. So the GPU is kept about twice the median host span
    of the recent launches ahead of the host. (The median, not the maximum: a rare stall of the host is the
    reducer's outlier, and a lead sized for it would be paid on every slot.) What the GPU still has to run of
    the sleeps already queued counts towards it: a step's second and third timed launch sleep only what the
    first one's sleep no longer covers, which keeps a step's GPU tail at about one lead.
    """
    MAX_S = 2e-3
    # Before any span is known, the longest lead. (It was 0.1 ms, for Triton's launch path of tens of
    # microseconds; the tuner's own routing takes more. The MLP op's GELU on 2 H200s, the first timed slot of a
    # process's first tuning call: BLOCK 1024 and 2048 sampled 160 and 148 us for 34 us of work, one sample
    # each by split screening, and both were screened out: issue 35.)
    FIRST_S = MAX_S

    def __init__(self) -> None:
        self._spans: deque[float] = deque(maxlen=16)
        # When the GPU runs out of the sleeps queued so far, at the earliest (host clock): the GPU may be
        # later (other work, the kernels themselves), never earlier, so the lead never comes up short by it.
        self._queued_until = 0.0

    def take(self, now: float) -> float:
        """The sleep to queue before a timed launch enqueued at host time `now` (seconds), noted as queued."""
        want = self.FIRST_S if not self._spans else min(2 * statistics.median(self._spans) + 2e-5, self.MAX_S)
        sleep = max(0.0, want - max(0.0, self._queued_until - now))
        self._queued_until = max(self._queued_until, now) + sleep
        return sleep

    def note(self, span_s: float) -> None:
        """The host's time to enqueue one launch of a loaded binary (hooks and launch)."""
        self._spans.append(span_s)


HEAD_START_MAX_S = 0.02  # the longest the GPU waits before an end-to-end step's runs


def head_start(host_s: float, runs: int, gpu_s: float) -> float:
    """The GPU sleep before an end-to-end step of `runs` executions, each `host_s` of host work to enqueue and
    at least `gpu_s` of GPU work (the fastest sample the call has taken; 0 before any).

    Every run after the first is sampled, and a sample must hold the GPU's work alone: the GPU must not reach
    a run before the host has enqueued it. The host has enqueued run k after k x host_s, and the GPU reaches
    it after the sleep and the k - 1 runs before it, so the sleep needs runs x host_s - (runs - 1) x gpu_s.
    The host's time gets a quarter of margin (it varies from step to step); the GPU's is its floor. Sized
    on the host alone (1.25 x runs x host_s), all-gather + GEMM's steps (2 ms of host and 0.6 ms of GPU work
    per run, 3 runs) waited 3.6 ms for the GPU after the host's last run; 1.8 to 2.4 ms with this (issue 35)."""
    need = 1.25 * host_s * runs - (runs - 1) * gpu_s
    return min(max(need, 1.25 * host_s) + 5e-5, HEAD_START_MAX_S)


def flushes(flush_l2: bool | str, at: str) -> bool:
    """Whether L2 is flushed `at`: "launch" (a timed span of one kernel's slot), "step" (a timed span of a whole
    execution, or of a graph's replays timed alone) or "execution" (a re-execution whose launches are timed one by
    one starts: Timer.begin_step). flush_l2="step" flushes as each re-execution starts and before whole-step spans,
    never between the function's own launches: a kernel then meets the cache its producers leave it, as in the
    program. True flushes before every timed span, as Triton's _bench does (each kernel as if alone). False never
    flushes."""
    if flush_l2 is True:
        return at != "execution"
    return flush_l2 == "step" and at != "launch"


class Timer(Protocol):
    """What a tuning call uses of a timer. start()'s token (a host time, a CUDA event) is the timer's own:
    only the same timer's stop() reads it, so its type is the one thing the protocol leaves open."""
    kind: str

    def begin_step(self) -> None: ...

    def start(self, span: str, head_start_s: float = 0.0) -> Any: ...

    def stop(self, token: Any) -> Callable[[], float]: ...

    def sync(self) -> None: ...


class HostTimer:
    kind = "host"
    # A class attribute, so that a test can add a config's declared cost to the span it measures
    # (tests/kernels.py) and order configs by margins that the host's scheduling noise cannot flip.
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def begin_step(self) -> None:
        pass

    def start(self, span: str, head_start_s: float = 0.0) -> float:
        return self.clock()

    def stop(self, token: float) -> Callable[[], float]:
        ms = (self.clock() - token) * 1e3
        return lambda: ms

    def sync(self) -> None:
        pass


class CudaEventTimer:
    kind = "cuda-events"

    def __init__(self, flush_l2: bool | str) -> None:
        self.flush_l2 = flush_l2

    def begin_step(self) -> None:
        """A re-execution whose launches are timed one by one starts: with flush_l2="step", L2 is flushed here,
        once, so that no data of the previous step is left in it."""
        if flushes(self.flush_l2, "execution"):
            _flush_l2()

    def start(self, span: str, head_start_s: float = 0.0) -> torch.cuda.Event:
        """Record the start on the current stream; `span` is "launch" or "step" (see flushes()).
        `head_start_s`: keep the GPU busy that long first
        (torch.cuda._sleep), so that the host enqueues what follows ahead of the GPU, as it does in a
        busy program, and the span measures the GPU's work rather than the host's launch latency.
        The sleep comes before the L2 flush: the kernel then starts right after the flush, as under
        do_bench, with the flush's dirty lines still in L2 rather than a sleep's worth of idle behind them."""
        if head_start_s > 0:
            torch.cuda._sleep(int(head_start_s * _sleep_cycles_per_second()))
        if flushes(self.flush_l2, span):
            _flush_l2()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream())
        return ev

    def stop(self, token: torch.cuda.Event) -> Callable[[], float]:
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream())
        return lambda: token.elapsed_time(end)

    def sync(self) -> None:
        torch.cuda.synchronize()


class CudaGraphTimer(CudaEventTimer):
    kind = "cuda-graph"
    replays = 10  # launches captured in one graph; the sample is their mean

    def measure(self, launch: Callable[[tuple], Any], args: tuple) -> Callable[[], float]:
        """Capture `launch` `replays` times on clones of the tensor arguments and time one replay.

        The clones keep replays off the function's own data (an in-place kernel applied ten
        times would corrupt it); the function's real launch runs separately, untimed.
        """
        clones = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            # capture_begin/end rather than torch.cuda.graph, whose entry synchronizes and runs gc.collect.
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                for _ in range(self.replays):
                    launch(clones)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        start = self.start("step")  # the replays are timed alone: flushed unless flush_l2=False
        graph.replay()
        done = self.stop(start)
        keep_alive = [graph, clones]  # until the sample is read at the end of the step

        def sample() -> float:
            keep_alive.clear()
            return done() / self.replays

        return sample


def make_timer(flush_l2: bool | str, cuda_graph: bool = False) -> Timer:
    if torch.cuda.is_available() and not interpret_mode():
        return CudaGraphTimer(flush_l2) if cuda_graph else CudaEventTimer(flush_l2)
    return HostTimer()  # TuneOptions refuses cuda_graph=True here
