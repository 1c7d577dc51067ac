"""The progress line rank 0 redraws on a terminal while it tunes: steps done / total, elapsed, estimate.

Only on a terminal: in a log file or a pipe, '\\r' redraws would pile up as garbage, and the
per-key summary lines already say what was decided.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable


def steps_left(remaining_and_per_step: Iterable[tuple[int, int]]) -> int:
    """Executions until the last undecided key runs out of slots, plus the final run.

    Each item is (slots a key has left, slots it took in the last execution); keys run their
    slots in parallel, so the slowest one sets the pace.
    """
    longest = 0
    for remaining, per_step in remaining_and_per_step:
        if remaining > 0:
            longest = max(longest, math.ceil(remaining / max(per_step, 1)))
    return longest + 1


class Progress:
    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled
        self.started = time.perf_counter()
        self._width = 0

    @classmethod
    def on_terminal(cls, label: str, rank: int, quiet: bool) -> Progress:
        stream = sys.stderr
        isatty = getattr(stream, "isatty", None)
        return cls(label, rank == 0 and not quiet and isatty is not None and isatty())

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.started
        total = max(total, done)
        eta = elapsed / done * (total - done) if done else math.nan
        line = (f"[triton_ctx_tune] tuning {self.label}: step {done}/{total}, {elapsed:.1f} s elapsed"
                + ("" if math.isnan(eta) else f", ~{eta:.1f} s left"))
        # Pad over the previous, possibly longer line: '\r' moves the cursor but erases nothing.
        sys.stderr.write("\r" + line.ljust(self._width))
        sys.stderr.flush()
        self._width = len(line)

    def clear(self) -> None:
        """Erase the line, so other output starts at column 0 on a clean line."""
        if self.enabled and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()
            self._width = 0
