"""What a step's deciding (decisions.py) and validating (validate.py) halves use of the call running them.

Session hands them a StepServices instead of itself, so that they depend on the few things they
use and not on the executor (and imports run one way: session -> decisions, validate -> services).
Session builds its collectives, log, cache and progress line on first use, because a call whose
keys are all known must build none of them; so those come here as getters, resolved only when a
step's end actually needs them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from ..store.cache import Lookup, TuningCache
    from ..runtime.collectives import Collectives
    from ..tools.logs import RankLog
    from ..options import TuneOptions
    from .progress import Progress
    from .search import Assignment, Search
    from .state import KeyState


class CallRecord(Protocol):
    """The part of a call's stats (session.CallStats) that decisions read and fill in."""
    executions: int
    tuned: list[Any]  # decisions.TunedKey, one per key decided in the call
    point: dict[str, Any] | None


@dataclass(frozen=True)
class StepServices:
    function: str
    opts: TuneOptions
    search: Search
    stats: CallRecord
    misses: dict[int, Lookup]  # id(state) -> its cache miss, stored once the state is decided
    # Getters of what Session builds lazily (or rebinds between steps: new_states).
    get_comm: Callable[[], Collectives]
    get_log: Callable[[], RankLog]
    get_cache: Callable[[], TuningCache | None]
    get_progress: Callable[[], Progress]
    get_early_stop: Callable[[], float | None]
    get_new_states: Callable[[], list[KeyState]]
    ensure_header: Callable[[], None]
    point_failed: Callable[[Assignment, str, dict[str, str]], None]  # fail a point on every rank
    point_decided: Callable[[dict[str, Any]], None]  # a function-level winner, for the function cache

    @property
    def comm(self) -> Collectives:
        return self.get_comm()

    @property
    def log(self) -> RankLog:
        return self.get_log()

    @property
    def cache(self) -> TuningCache | None:
        return self.get_cache()

    @property
    def progress(self) -> Progress:
        return self.get_progress()

    @property
    def early_stop(self) -> float | None:
        return self.get_early_stop()

    @property
    def new_states(self) -> list[KeyState]:
        return self.get_new_states()
