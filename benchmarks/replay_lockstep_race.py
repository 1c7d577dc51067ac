"""Replay the survivors' race (engine/decisions.py, _lockstep_stay) on committed tuning logs.

After a screening, each survivor's first round gives it a second sample: on every rank, or after a split
screening on the rank that screened it alone. The race drops a survivor whose fastest sample on its luckiest rank
is more than RACE_BAND behind the fastest's. This script reads the rank logs in the committed archives
(benchmarks/results/*/*.tgz, runs of 1 and 2 ranks), rebuilds each screened key's samples after that round from
its slot events, and counts the survivors that would leave; and, for the configs that mattered (each key's
winner, and every config whose final time is within 1% of the winner's), how far behind they were then. None of
those may leave. Keys decided end to end, or of a function-level point, do not race.

    python benchmarks/replay_lockstep_race.py [archive.tgz ...]
"""
from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_ctx_tune.engine.state import RACE_BAND

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Replay:
    keys: int = 0
    split: int = 0
    survivors: int = 0
    out: int = 0
    mattered: list[float] = field(default_factory=list)  # round-1 ratio to the fastest of each config that mattered
    lost: list[str] = field(default_factory=list)  # configs that mattered and would have left

    def line(self) -> str:
        worst = max(self.mattered, default=float("nan"))
        return (f"{self.keys} screened keys ({self.split} split over 2 ranks), {self.survivors} survivors: "
                f"{self.out} over {RACE_BAND:.0%} behind after the first round; {len(self.mattered)} configs "
                f"mattered (winners and within 1% of one), the worst of them {worst:.3f}x the fastest then; "
                f"{len(self.lost)} of them would have left")


def _runs(archives: list[Path]) -> list[dict[int, list[dict[str, Any]]]]:
    """Every 1- or 2-rank log folder in the archives, once (the same run may be archived twice): rank -> events."""
    seen, runs = set(), []
    for archive in archives:
        with tarfile.open(archive) as tar:
            files: dict[str, dict[int, bytes]] = defaultdict(dict)
            for m in tar.getmembers():
                name = Path(m.name)
                if m.isfile() and name.name in ("rank-0.jsonl", "rank-1.jsonl", "rank-2.jsonl"):
                    data = tar.extractfile(m)
                    if data is not None:
                        files[str(name.parent)][int(name.stem[5:])] = data.read()
        for ranks in files.values():
            if sorted(ranks) not in ([0], [0, 1]) or (digest := hashlib.sha256(ranks[0]).hexdigest()) in seen:
                continue
            seen.add(digest)
            runs.append({r: [json.loads(line) for line in io.BytesIO(b).read().decode().splitlines() if line.strip()]
                         for r, b in ranks.items()})
    return runs


def replay(archives: list[Path]) -> Replay:
    out = Replay()
    for run in _runs(archives):
        samples: dict[tuple, dict[int, dict[int, list[tuple[int, float]]]]] = defaultdict(lambda: defaultdict(dict))
        screens, decisions = {}, {}
        for rank, events in run.items():
            for e in events:
                k = (e.get("call"), e.get("kernel"), json.dumps(e.get("key")))
                if e["event"] == "slot" and e["timed"] and e["ms"] is not None:
                    samples[k][rank].setdefault(e["config_index"], []).append((e["step"], e["ms"]))
                elif rank == 0 and e["event"] == "screen" and e.get("point") is None:
                    screens[k] = e
                elif rank == 0 and e["event"] == "decision":
                    decisions[k] = e
        for k, screen in screens.items():
            d = decisions.get(k)
            if d is None or d.get("end_to_end") or d.get("point") is not None or d.get("incremental"):
                continue
            if len(screen["kept"]) < 2:
                continue
            luck = {}
            for j in screen["kept"]:
                taken = [ms for ms in (samples[k][r].get(j, []) for r in sorted(samples[k])) if len(ms) >= 2]
                if d.get("split"):  # its screening rank alone has two samples after the first round: the earliest
                    taken = sorted(taken)[:1]
                if taken:  # the fastest of its two samples, on its luckiest rank
                    luck[j] = min(m for ms in taken for _, m in ms[:2])
            if not luck:
                continue
            best = min(luck.values())
            leaving = {j for j, t in luck.items() if t > best * (1 + RACE_BAND)}
            out.keys += 1
            out.split += bool(d.get("split"))
            out.survivors += len(screen["kept"])
            out.out += len(leaving)
            final, winner = d["reduced"], d["winner"]
            for j, t in luck.items():
                if j == winner or final[j] <= final[winner] * 1.01:
                    out.mattered.append(t / best)
                    if j in leaving:
                        out.lost.append(f"{d['kernel']} {d['key']} #{j} ({t / best:.3f}x)")
    return out


def committed(until: str = "~") -> list[Path]:
    """The committed archives, of result folders named before `until` (the runs before the race: section 49)."""
    return sorted(p for p in RESULTS.glob("*/*.tgz") if p.parent.name < until)


def main(argv: list[str]) -> None:
    result = replay([Path(a) for a in argv] or committed(until="2026-11-28i"))
    print(result.line())
    for lost in result.lost:
        print("  would have left:", lost)


if __name__ == "__main__":
    main(sys.argv[1:])
