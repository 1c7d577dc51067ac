"""A tuning call keeps Python's cyclic garbage collector off the objects that were alive before it.

A full collection walks every object the collector tracks. With torch, Triton and NCCL loaded, each took 0.1
to 0.13 s on the all-gather + GEMM benchmark's processes (2 H200s, RESULTS section 34), at whatever step the
allocation counts trigger it: inside a timed step it lands in a sample, and it is a tenth of a 1.8 s budget.
gc.freeze() moves the objects alive at the call's start to a generation the collector never walks, so the
collections the call triggers walk only what the call made; the undo (gc.unfreeze) hands them back to the
program's collections. Reference counting frees frozen objects as usual: only cycles among them wait for
the undo. A program that froze objects itself (before forking workers, say) keeps its freeze: the call then
holds nothing, and does not unfreeze what it did not freeze.
"""
from __future__ import annotations

import gc
import threading
from collections.abc import Callable

_lock = threading.Lock()
_holders = 0  # tuning calls holding the freeze (an online session spans calls; two functions may tune at once)
_froze = False  # whether the first holder froze (it does not where the program had frozen objects already)


def hold() -> Callable[[], None]:
    """Freeze the objects alive now until the returned undo runs (once; later calls of it do nothing)."""
    global _holders, _froze
    with _lock:
        _holders += 1
        if _holders == 1:
            _froze = gc.isenabled() and gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
    released = False

    def undo() -> None:
        global _holders, _froze
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            _holders -= 1
            if _holders == 0 and _froze:
                gc.unfreeze()
                _froze = False

    return undo
