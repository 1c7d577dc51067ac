"""A sampling profiler over every Python thread: where a call's wall time goes, its helper threads included.

cProfile sees only the thread that enables it, and a tuning call compiles and loads kernels on threads of
its own. This samples every thread's stack at a fixed interval and counts, per thread name, how many
samples each function was on the stack (inclusive) and at its top (self). A sample is the interval's
worth of wall time, whether the thread ran, waited for the GIL or slept.

It also keeps a timeline of the main thread's first `timeline_s` seconds: its innermost frames at each sample,
merged into spans, so the gaps of a first execution (what runs between one kernel's launch and the next key's)
can be read in order.
"""
from __future__ import annotations

import collections
import sys
import threading
import time


class StackSampler:
    def __init__(self, interval_s: float = 0.002, timeline_s: float = 8.0) -> None:
        self.interval_s = interval_s
        self.timeline_s = timeline_s
        self.timeline: list[tuple[float, str]] = []  # (seconds since start, the main thread's innermost frames)
        self._main = threading.main_thread().ident
        self._began = time.perf_counter()
        self.inclusive: collections.Counter[tuple[str, str]] = collections.Counter()
        self.self_: collections.Counter[tuple[str, str]] = collections.Counter()
        self.samples: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> StackSampler:
        self._began = time.perf_counter()
        self._thread.start()
        return self

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            names = {t.ident: t.name.split("-")[0] if t.name.startswith("Thread-") else t.name
                     for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, "?")
                self.samples[name] += 1
                elapsed = time.perf_counter() - self._began
                stack: list[str] = []  # innermost first: one walk serves self, inclusive and the timeline
                while frame is not None:
                    stack.append(_where(frame))
                    frame = frame.f_back
                if ident == self._main and elapsed < self.timeline_s:
                    self.timeline.append((elapsed, " < ".join(stack[:4])))
                if stack:
                    self.self_[(name, stack[0])] += 1
                for where in set(stack):
                    self.inclusive[(name, where)] += 1
            time.sleep(self.interval_s)

    def stop(self, top: int = 25) -> str:
        self._stop.set()
        self._thread.join()
        lines = []
        for name, n in self.samples.most_common():
            lines.append(f"--- thread {name}: {n * self.interval_s:.3f} s sampled")
            for label, counter in (("inclusive", self.inclusive), ("self", self.self_)):
                rows = sorted(((c, w) for (t, w), c in counter.items() if t == name), reverse=True)[:top]
                lines += [f"  {label:9s} {c * self.interval_s:7.3f} s  {w}" for c, w in rows]
        lines.append(f"--- main thread timeline, first {self.timeline_s:.0f} s (spans of at least 20 ms)")
        spans: list[list] = []  # [start, end, label]
        for t, label in self.timeline:
            if spans and spans[-1][2] == label:
                spans[-1][1] = t
            else:
                spans.append([t, t, label])
        lines += [f"  {a:6.3f}-{b:6.3f} {label}" for a, b, label in spans if b - a >= 0.02]
        return "\n".join(lines)


def _where(frame: object) -> str:
    code = frame.f_code  # type: ignore[attr-defined]
    parts = code.co_filename.rsplit("/", 2)
    return f"{'/'.join(parts[-2:])}:{code.co_firstlineno}({code.co_name})"
