"""The clients' report: one table row per (client, arm), and the merge of per-arm JSON files. Plain Python only,
so `run_clients.py --merge` runs anywhere, without torch or a GPU."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

COLUMNS = ("client", "arm", "1st call s", "execs", "tuned/seen keys", "ranks agree", "worst err 1st", "ok",
           "warm call s", "warm execs", "step ms")


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def row(rec: dict[str, Any]) -> list[str]:
    if rec.get("error"):
        return [rec["client"], rec["arm"], f"FAILED: {rec['error'][:80]}"] + [""] * (len(COLUMNS) - 3)
    keys, agree, first, warm = rec["keys"], rec["agreement"], rec["first_call"], rec["warm_call"]
    tuned = f"{keys['tuned_of_seen']}/{len(keys['seen'])}" if rec["arm"] == "ours" else f"-/{len(keys['seen'])}"
    return [rec["client"], rec["arm"], _num(first["wall_s"], ".2f"), str(first["executions"]), tuned,
            f"{agree['agree']}/{agree['total']}", _num(first["errors"]["worst"], ".2e"),
            "yes" if first["errors"]["ok"] else "NO", _num(warm["wall_s"], ".3f"), str(warm["executions"]),
            _num(rec.get("step_ms"), ".3f")]


def table_lines(records: list[dict[str, Any]]) -> list[str]:
    return format_table(list(COLUMNS), [row(r) for r in sorted(records, key=lambda r: (r["client"],
                                                                                       r["arm"] != "plain"))])


def format_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart; a row may be shorter than the header."""
    rows = [header] + rows
    widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def detail_lines(records: list[dict[str, Any]]) -> list[str]:
    """Per record: which seen keys the call did not tune, which keys the ranks disagree on, every gradient error."""
    lines = []
    for rec in sorted(records, key=lambda r: (r["client"], r["arm"] != "plain")):
        if rec.get("error"):
            continue
        head = f"{rec['client']} / {rec['arm']}:"
        errs = rec["first_call"]["errors"]
        lines.append(f"{head} grads rel err " + ", ".join(f"{k}={_num(v, '.2e')}" for k, v in errs["grads"].items())
                     + f", out={_num(errs['out'], '.2e')} (tolerance {errs['tolerance']:g})")
        if rec["arm"] == "ours" and rec["keys"]["seen_not_tuned"]:
            lines.append("    seen, not tuned by the call: " + "; ".join(rec["keys"]["seen_not_tuned"]))
        for k in rec["agreement"]["differ"]:
            lines.append(f"    ranks differ on {k}: {rec['agreement']['per_key'][k]}")
    return lines


def print_report(records: list[dict[str, Any]], title: str) -> None:
    print("\n" + "=" * 100)
    print(title)
    print("\n".join(table_lines(records)))
    print("\n".join(detail_lines(records)))
    print("columns: 1st call = the first (tuning) call's wall time, slowest rank; execs = executions of the step in "
          "it (plain: 1);\n  tuned/seen keys = keys the contextual tuner decided / keys in the libraries' "
          "Autotuner caches after it;\n  ranks agree = keys whose config is the same on every rank; errors are "
          "relative Frobenius norms vs float32, worst rank;\n  warm call = the second call (every key cached); "
          "step ms = median steady-state step (CUDA events, L2 flushed)")
    print("=" * 100, flush=True)


def merge(paths: list[str], out: str | None) -> int:
    """Print one report over several runs' JSON files (e.g. the plain and the ours arm) and write them as one."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    records = [rec for run in runs for rec in run["results"]]
    print_report(records, "clients: " + ", ".join(f"{run['arm']} ({p})" for run, p in zip(runs, paths)))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"runs": [{"file": p, "arm": run["arm"], "meta": run["meta"]}
                                                  for run, p in zip(runs, paths)], "results": records},
                                        indent=1) + "\n")
        print(f"wrote {out}")
    return 0 if all(not r.get("error") and r["first_call"]["errors"]["ok"] for r in records) else 1
