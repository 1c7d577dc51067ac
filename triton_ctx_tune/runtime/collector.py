"""While a call tunes, Python's cyclic garbage collector runs between steps, never inside one.

On the all-gather + GEMM benchmark's processes (torch, Triton and NCCL loaded, 2 H200s) a full collection took
0.12 to 0.16 s, at whatever step the allocation counts triggered it: the two stalls of that size that took
budget=10% of the sweep past its budget began with one each (RESULTS section 34), and inside a timed step such
a pause lands in a sample. So for as long as a call tunes, automatic collection is off, as timeit turns it off
while it times; between steps, outside every sample, the young generations are collected whenever their counts
call for it, as the collector's own thresholds would, so the cycles the executions leave are freed about when
they would have been (a cycle may hold a GPU tensor). Full collections wait for the call's end. A program that
turned the collector off keeps it off.
"""
from __future__ import annotations

import gc

from .shared_patch import SharedHold

_ours = False  # whether the collector was on when the first tuning call began, so that the last one turns it back on


def _off() -> None:
    global _ours
    _ours = gc.isenabled()
    if _ours:
        gc.disable()


def _back_on() -> None:
    global _ours
    if _ours:
        gc.enable()
        _ours = False


# Calls tuning now hold it (two functions' calls may tune at once on different threads). hold(): automatic
# collection off until the returned undo runs (once; later calls of the undo do nothing).
hold = SharedHold(_off, _back_on).hold


def between_steps() -> None:
    """The young collections the collector would have made during the last step, made now (none while no call
    holds it off, or where the program turned it off)."""
    if not _ours:
        return
    count, threshold = gc.get_count(), gc.get_threshold()
    if threshold[0] and count[0] > threshold[0]:
        gc.collect(1 if count[1] >= threshold[1] else 0)
