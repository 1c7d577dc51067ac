"""Incremental re-tuning: when a key's only change since its cache entry is its config list, time only
what is new, plus a few anchors, and carry the other old timings over.

The plan is made by rank 0 from the closest stale entry (cache.TuningCache._stale) and reaches every
rank through the cache lookup (TuningCache.lookup broadcasts to_tensor()), so every rank's KeyState
times the same configs. Roles of the live configs, matched to the old entry by config text:

- NEW: not in the old entry: timed.
- ANCHOR: the old winner (the incumbent) and the old entry's two fastest configs still in the list:
  timed again, so that old and new times can be put on one scale (the median of new/old over them).
- CARRIED: any other config with an old time: not timed; its old timings times the scale.
- CARRIED_FAILED: failed when last tuned: not timed, stays failed (same code, Triton, device and
  world, so it would fail again).

The scale absorbs drift between the two runs (clocks, a busier machine). A config whose scaled old
time is compared with new times is never strictly faster than the best anchor: anchors are the old
fastest, and at least one of them has a ratio at or below the median. So the best config is always
one measured now, and screening (1.5x of the best) never keeps carried configs alone.

What the roles cost on a schedule with screening (engine/state.py, Tunable.keep): a new config is screened
(a warm-up and one sample) and, if it survives, takes a survivor's n_repeat - 1 samples. An anchor takes part
in the screening, since its sample is what puts the carried configs and the new ones on one scale there, but
the screening has nothing to find out about it: the old entry already ranked it among the fastest. So its
screening sample is the first of a survivor's n_repeat - 1, not one more. One config added to 18 on the
default schedule (n_warmup=3, n_repeat=5, 1.5x) then costs 6 + 2 x 5 + the final run = 17 executions, where
a full tune costs 57 (tests/test_incremental.py). Without screening every timed config, anchors too, takes
the whole n_warmup + n_repeat.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

NEW, ANCHOR, CARRIED, CARRIED_FAILED = 0, 1, 2, 3
TOP_ANCHORS = 2  # the old entry's fastest configs re-timed, besides the incumbent
# What a carried-over failure says, on every rank alike (only rank 0 read the old reason).
CARRIED_FAILURE = "failed when this key was last tuned (carried over from the cache entry, not re-timed)"


def _number(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else math.nan


@dataclass
class Plan:
    """Per live config: its role and, for anchors and carried configs, its old (ms, q20, q80) and per-rank ms."""
    roles: list[int]
    old: list[tuple[float, float, float]]  # NaN where there is no old time
    old_per_rank: list[list[float]]  # [config][rank]
    removed: int  # configs of the old entry that left the list

    def _with(self, *roles: int) -> list[int]:
        return [j for j, r in enumerate(self.roles) if r in roles]

    @property
    def new(self) -> list[int]:
        return self._with(NEW)

    @property
    def anchors(self) -> list[int]:
        return self._with(ANCHOR)

    @property
    def carried(self) -> list[int]:
        return self._with(CARRIED)

    @property
    def carried_failed(self) -> list[int]:
        return self._with(CARRIED_FAILED)

    @property
    def carried_failures(self) -> dict[int, str]:
        """The carried configs that failed last time, each with the reason its key's state records."""
        return {i: CARRIED_FAILURE for i in self.carried_failed}

    @property
    def untimed(self) -> set[int]:
        """Configs that get no slot."""
        return set(self._with(CARRIED, CARRIED_FAILED))

    def ratios(self, new_ms: Sequence[float]) -> dict[int, float]:
        """new/old per anchor that has both times now."""
        out = {}
        for j in self.anchors:
            old, now = self.old[j][0], new_ms[j]
            if math.isfinite(old) and old > 0 and math.isfinite(now):
                out[j] = now / old
        return out

    def scale(self, new_ms: Sequence[float]) -> float | None:
        """The median of the anchors' new/old ratios; None when no anchor has a time now."""
        ratios = list(self.ratios(new_ms).values())
        return statistics.median(ratios) if ratios else None

    def carried_times(self, scale: float) -> dict[int, tuple[tuple[float, float, float], list[float]]]:
        """Each carried config's old (ms, q20, q80) and per-rank ms, put on the new runs' scale."""
        out: dict[int, tuple[tuple[float, float, float], list[float]]] = {}
        for j in self.carried:
            ms, q20, q80 = self.old[j]
            out[j] = ((ms * scale, q20 * scale, q80 * scale), [x * scale for x in self.old_per_rank[j]])
        return out

    # ---- to every rank: one float64 tensor [configs, 4 + world] (role, ms, q20, q80, per-rank ms...)

    def to_tensor(self) -> torch.Tensor:
        rows = [[float(r), *o, *p] for r, o, p in zip(self.roles, self.old, self.old_per_rank)]
        return torch.tensor(rows, dtype=torch.float64)

    @staticmethod
    def blank_tensor(configs: int, world: int) -> torch.Tensor:
        return torch.zeros((configs, 4 + world), dtype=torch.float64)

    @staticmethod
    def from_tensor(t: torch.Tensor, removed: int) -> Plan:
        rows = t.tolist()
        return Plan([int(r[0]) for r in rows], [(r[1], r[2], r[3]) for r in rows], [r[4:] for r in rows], removed)


def plan(old_timings: Sequence[dict[str, Any]], old_winner: str | None, live: Sequence[str], world: int) -> Plan | None:
    """The incremental plan for the `live` configs (config texts, in order) from a well-formed old entry's
    timings; None when no old config with a time is still in the list (nothing to anchor: a full tune)."""
    by_text: dict[str, dict[str, Any]] = {}
    for t in old_timings:
        by_text.setdefault(t["config"], t)
    timed_before = {c for c, t in by_text.items() if math.isfinite(_number(t.get("ms")))}
    kept = [c for c in dict.fromkeys(live) if c in timed_before]
    if not kept:
        return None
    fastest = sorted(kept, key=lambda c: (_number(by_text[c]["ms"]), kept.index(c)))[:TOP_ANCHORS]
    anchor_texts = set(fastest) | ({old_winner} if old_winner in kept else set())
    roles, old, per_rank = [], [], []
    for c in live:
        found = by_text.get(c)
        if found is None:
            roles.append(NEW)
        elif c not in timed_before:
            roles.append(CARRIED_FAILED)
        else:
            roles.append(ANCHOR if c in anchor_texts else CARRIED)
        t = found or {}
        old.append((_number(t.get("ms")), _number(t.get("q20")), _number(t.get("q80"))))
        ranks = list(t.get("per_rank_ms") or [])
        per_rank.append([_number(ranks[r]) if r < len(ranks) else _number(t.get("ms")) for r in range(world)])
    removed = len({str(t["config"]) for t in old_timings} - set(live))
    return Plan(roles, old, per_rank, removed)
