"""benchmarks/stack_sampler.py's timeline of the main thread: spans in the order the thread ran them."""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from stack_sampler import StackSampler  # noqa: E402  (benchmarks/ is not a package)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _nap(seconds: float) -> None:
    time.sleep(seconds)


def test_the_timeline_names_what_the_main_thread_ran_in_order():
    sampler = StackSampler(interval_s=0.002, timeline_s=5.0).start()
    _nap(0.3)
    _spin(0.3)
    text = sampler.stop()
    timeline = text.split("--- main thread timeline")[1].splitlines()[1:]
    spans = []
    for line in timeline:
        start, rest = line.strip().split("-", 1)
        end, label = rest.strip().split(" ", 1)
        spans.append((float(start), float(end), label))
    naps = [s for s in spans if "(_nap)" in s[2].split(" < ")[0]]
    spins = [s for s in spans if "(_spin)" in s[2].split(" < ")[0]]
    assert naps and spins, text
    # Each ran as one span of about its length (the sampler's own thread may delay a sample by a few ms),
    # and the nap came first.
    assert max(b - a for a, b, _ in naps) > 0.2
    assert max(b - a for a, b, _ in spins) > 0.2
    assert naps[0][0] < spins[0][0]
    assert "< tests/test_stack_sampler.py" in spins[0][2]  # the caller is in the label
