"""Per-(Autotuner, key) tuning state and its slot schedule.

A state owns a fixed schedule of `len(configs) * (n_warmup + n_repeat)` slots: config 0's
warm-up slots, then its timed slots, then config 1's, and so on. Every launch of the key
inside a tuning call takes the next slot, so the number of function executions depends on
the config count alone, never on which configs fail: ranks stay in lockstep.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .compat import Autotuner, Config, config_str


@dataclass(frozen=True)
class Slot:
    config: int
    iteration: int  # counts warm-up and timed launches of this config from 0
    timed: bool


@dataclass
class SlotRecord:
    """What happened in one slot, kept until the step ends and it is logged."""
    slot: Slot | None  # None: a launch after the schedule ran out, before the decision
    ran: int | None  # the config index actually launched (fallbacks differ from slot.config)
    sample: Callable[[], float] | None = None  # resolves to milliseconds at the end of the step
    failure: str | None = None
    ms: float | None = None


@dataclass
class KeyState:
    autotuner: Autotuner
    key: tuple
    configs: list[Config]
    n_warmup: int
    n_repeat: int
    kernel: str
    created_step: int
    samples: list[list[Callable[[], float]]] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)
    works: set[int] = field(default_factory=set)
    records: list[SlotRecord] = field(default_factory=list)
    next_slot: int = 0
    winner: int | None = None
    reset_pending: bool = False  # the final run's first launch zeroes reset_to_zero args, as Triton's does
    started: float = field(default_factory=time.perf_counter)
    tuning_s: float = 0.0

    def __post_init__(self) -> None:
        self.samples = [[] for _ in self.configs]

    @property
    def per_config(self) -> int:
        return self.n_warmup + self.n_repeat

    @property
    def total_slots(self) -> int:
        return len(self.configs) * self.per_config

    @property
    def exhausted(self) -> bool:
        return self.next_slot >= self.total_slots

    @property
    def decided(self) -> bool:
        return self.winner is not None

    def take_slot(self) -> Slot | None:
        if self.exhausted:
            return None
        config, iteration = divmod(self.next_slot, self.per_config)
        self.next_slot += 1
        return Slot(config, iteration, timed=iteration >= self.n_warmup)

    def fail(self, config: int, reason: str) -> None:
        self.failures.setdefault(config, reason)
        self.works.discard(config)

    def fallback(self) -> int | None:
        """A config already known to work on this rank, to keep the function running."""
        usable = sorted(self.works - self.failures.keys())
        return usable[0] if usable else None

    def describe(self) -> str:
        """What ranks must agree on before tuning: kernel, key and the pruned configs in order."""
        return f"{self.kernel} key={self.key!r} configs=[{'; '.join(config_str(c) for c in self.configs)}]"

    def local_stats(self, stat: str) -> list[tuple[float, float, float]]:
        """Per config (statistic, 20th, 80th percentile) in ms; +inf for failed or unmeasured."""
        out = []
        for i, samples in enumerate(self.samples):
            values = [s() for s in samples]
            if i in self.failures or not values or any(math.isnan(v) for v in values):
                out.append((math.inf, math.inf, math.inf))
            else:
                out.append(summarize(values, stat))
        return out


def summarize(values: list[float], stat: str) -> tuple[float, float, float]:
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    central = {"median": np.median, "mean": np.mean, "min": np.min}[stat](arr)
    q20, q80 = np.quantile(arr, [0.2, 0.8])
    return float(central), float(q20), float(q80)


def pick_winner(times: list[float]) -> int | None:
    """Index of the fastest finite time; ties go to the lowest index; NaN counts as a failure."""
    best: int | None = None
    for i, t in enumerate(times):
        if math.isfinite(t) and (best is None or t < times[best]):
            best = i
    return best


def make_state(at: Autotuner, key: tuple, configs: list[Config], n_warmup: int, n_repeat: int,
               kernel: str, step: int, **extra: Any) -> KeyState:
    return KeyState(at, key, configs, n_warmup, n_repeat, kernel, step, **extra)
