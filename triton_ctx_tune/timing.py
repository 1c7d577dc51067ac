"""Timing one slot: CUDA events on the current stream, or the host clock.

CUDA events are read only at the end of a step, so tuning never adds a host sync per launch.
Under TRITON_INTERPRET=1 (or without a GPU) kernels run synchronously on the host, and the
host clock measures the same span.
"""
from __future__ import annotations

import time
from typing import Callable

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


class HostTimer:
    kind = "host"
    # A class attribute, so that a test can add a config's declared cost to the span it measures
    # (tests/kernels.py) and order configs by margins that the host's scheduling noise cannot flip.
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def start(self, flush: bool) -> float:
        return self.clock()

    def stop(self, token: float) -> Callable[[], float]:
        ms = (self.clock() - token) * 1e3
        return lambda: ms

    def sync(self) -> None:
        pass


class CudaEventTimer:
    kind = "cuda-events"

    def __init__(self, flush_l2: bool) -> None:
        self.flush_l2 = flush_l2

    def start(self, flush: bool) -> torch.cuda.Event:
        if flush and self.flush_l2:
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


def make_timer(flush_l2: bool) -> HostTimer | CudaEventTimer:
    if torch.cuda.is_available() and not interpret_mode():
        return CudaEventTimer(flush_l2)
    return HostTimer()
