"""Replay per-launch confirmations from rank logs: which config each would choose on the confirmation's rounds alone,
and on all of each candidate's samples (the rule since RESULTS.md section 45), on the CPU, in seconds.

    python benchmarks/replay_confirm.py <folder with rank-*.jsonl> [...] [--expect gelu_inplace_kernel=4]

For each tuning call in the logs and each key confirmed per launch (a `confirm` event without end_to_end), the
candidates' timed slots on every rank are summarized as the tuner does (engine/state.summarize: the median, then the
slowest rank's), once with the samples taken after the confirm event and once with all of them; the fastest wins
(no incumbent). `--expect kernel=config` counts the decisions of that kernel that chose the config, when it was a
candidate. The tuner's own winner (the `decision` event) is printed beside them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from triton_ctx_tune.engine.state import summarize  # noqa: E402
from triton_ctx_tune.tools.report import read_events  # noqa: E402


def calls(folder: Path) -> list[dict[int, list[dict[str, Any]]]]:
    """Each tuning call's events, per rank ({rank: events}), in the order the calls ran."""
    out: list[dict[int, list[dict[str, Any]]]] = []
    for rank, events in read_events(folder)[0].items():
        starts = [i for i, e in enumerate(events) if e["event"] == "call"] + [len(events)]
        for n, (a, b) in enumerate(zip(starts, starts[1:])):
            while len(out) <= n:
                out.append({})
            out[n][rank] = events[a:b]
    return out


def _ident(e: dict[str, Any]) -> tuple[str, str]:
    return e["kernel"], json.dumps(e["key"])


def replay(per_rank: dict[int, list[dict[str, Any]]], stat: str = "median") -> list[dict[str, Any]]:
    """One row per key confirmed per launch: its candidates and the winner each rule picks."""
    first = per_rank[min(per_rank)]
    rows = []
    for c in (e for e in first if e["event"] == "confirm" and not e.get("end_to_end")):
        # Per rank and candidate, the samples (host time, ms) of this key, and when the confirmation began there.
        taken: list[tuple[float, dict[int, list[tuple[float, float]]]]] = []
        for events in per_rank.values():
            at = next(e["time"] for e in events if e["event"] == "confirm" and _ident(e) == _ident(c))
            mine: dict[int, list[tuple[float, float]]] = {j: [] for j in c["candidates"]}
            for e in events:
                if e["event"] == "slot" and e["timed"] and e["ms"] is not None and _ident(e) == _ident(c) \
                        and e["config_index"] in mine:
                    mine[e["config_index"]].append((e["time"], e["ms"]))
            taken.append((at, mine))
        winners = {}
        for rule in ("rounds", "all"):
            # The slowest rank's statistic, as reduce="max" takes it.
            times = {j: max(summarize(ms, stat)[0] if (ms := [m for t, m in mine[j] if rule == "all" or t > at])
                            else float("inf") for at, mine in taken) for j in c["candidates"]}
            winners[rule] = min(times, key=lambda j: (times[j], j))
        decided = next((e["winner"] for e in first if e["event"] == "decision" and _ident(e) == _ident(c)), None)
        rows.append({"kernel": c["kernel"], "key": c["key"], "candidates": c["candidates"], "tuner": decided,
                     **winners})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--expect", action="append", default=[], help="kernel=config index the oracles put first")
    p.add_argument("--stat", default="median", choices=("median", "mean", "min"))
    args = p.parse_args()
    expect = {k: int(v) for k, v in (x.split("=") for x in args.expect)}
    hits = {"tuner": 0, "rounds": 0, "all": 0}
    counted = 0
    for folder in args.folders:
        for n, per_rank in enumerate(calls(folder)):
            for row in replay(per_rank, args.stat):
                print(f"{folder} call {n + 1}: {row['kernel']} {row['key']} candidates {row['candidates']}: "
                      f"tuner #{row['tuner']}, rounds alone #{row['rounds']}, all samples #{row['all']}")
                want = expect.get(row["kernel"])
                if want is not None and want in row["candidates"]:
                    counted += 1
                    for rule in hits:
                        hits[rule] += row[rule] == want
    if counted:
        print(f"{counted} decisions with the expected config among the candidates; chose it: tuner {hits['tuner']}, "
              f"rounds alone {hits['rounds']}, all samples {hits['all']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
