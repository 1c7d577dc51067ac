"""Merge bench_mlp.py's JSON results into markdown tables (for benchmarks/RESULTS.md).

    python benchmarks/merge_results.py                      # reads benchmarks/results/*.json
    python benchmarks/merge_results.py /tmp/bench other/    # any folders or files

One table per (table, variant), one row per (GPU, world size); then every target with its verdict; then
the scaling comparison across world sizes (tuning time at N ranks over 1 rank; target: <= 1.2x at 4 ranks).
Needs only the standard library.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TABLE_ORDER = ("tuning", "consistency", "quality", "dispatch", "scaling")
SCALING_LIMIT = 1.2


def load(paths: list[str]) -> list[dict[str, Any]]:
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    out = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"<!-- skipped {f}: {e} -->", file=sys.stderr)
            continue
        if isinstance(data, dict) and "table" in data and "summary" in data and "meta" in data:
            data["_file"] = str(f)
            out.append(data)
    return out


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1e4 or abs(v) < 1e-2:
            return f"{v:.2e}"
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return str(v).replace("|", "\\|")


def row_key(d: dict[str, Any]) -> tuple:
    m = d["meta"]
    return (m.get("gpu_short", ""), int(m.get("world", 0)), m.get("date", ""))


def markdown(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def describe(m: dict[str, Any]) -> list[Any]:
    commit = m.get("git_commit")
    return [m.get("gpu_short"), m.get("world"), f"{m.get('M')}x{m.get('H')}x{m.get('I')} {m.get('dtype')}",
            (m.get("date") or "")[:10], (commit[:8] + ("+dirty" if m.get("git_dirty") else "")) if commit else None]


BASE_HEADERS = ["GPU", "ranks", "M x H x I", "date", "commit"]


def table_sections(results: list[dict[str, Any]]) -> list[str]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in results:
        groups.setdefault((d["table"], d.get("variant") or "-"), []).append(d)
    order = {t: i for i, t in enumerate(TABLE_ORDER)}
    out = []
    for (table, variant), items in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1])):
        items.sort(key=row_key)
        keys: list[str] = []
        for d in items:
            keys += [k for k in d["summary"] if k not in keys]
        title = f"### {table}" + ("" if variant == "-" else f" ({variant})")
        rows = [describe(d["meta"]) + [d["summary"].get(k) for k in keys] for d in items]
        notes: list[str] = []
        for d in items:
            notes += [n for n in d.get("notes", []) if n not in notes]
        interp = any(d["meta"].get("interpreter") for d in items)
        block = [title, "", markdown(BASE_HEADERS + keys, rows)]
        if interp:
            block += ["", "_Rows from the Triton interpreter (CPU) are smoke runs: their timings mean nothing._"]
        block += [""] + [f"- {n}" for n in notes]
        out.append("\n".join(block))
    return out


def targets_section(results: list[dict[str, Any]]) -> str:
    rows = []
    for d in sorted(results, key=lambda d: (row_key(d), d["table"])):
        for t in d.get("targets", []):
            verdict = "info" if t.get("ok") is None else ("PASS" if t["ok"] else "MISS")
            rows.append([d["meta"].get("gpu_short"), d["meta"].get("world"),
                         d["table"] + ("" if d.get("variant") in (None, "mlp") else f" ({d['variant']})"),
                         t["name"], t.get("value"), t.get("goal"), verdict])
    if not rows:
        return ""
    return "### targets\n\n" + markdown(["GPU", "ranks", "table", "target", "value", "goal", "verdict"], rows)


def scaling_section(results: list[dict[str, Any]]) -> str:
    runs: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for d in results:
        if d["table"] == "scaling":
            m = d["meta"]
            runs.setdefault((m.get("gpu_short"), d.get("variant") or "mlp"), {})[int(m["world"])] = d
    if not runs:
        return ""
    rows = []
    for (gpu, variant), by_world in sorted(runs.items()):
        base = by_world.get(1)
        for world in sorted(by_world):
            s = by_world[world]["summary"]
            ratio = s["tuning_s"] / base["summary"]["tuning_s"] if base and base["summary"].get("tuning_s") else None
            if world == 1 or ratio is None:
                verdict = "-" if world == 1 else "needs a 1-rank run"
            else:
                verdict = ("PASS" if ratio <= SCALING_LIMIT else "MISS") + (
                    "" if world == 4 else " (proxy: target is at 4 ranks)")
            rows.append([gpu, variant, world, s.get("tuning_s"), s.get("executions"), s.get("ms_per_execution"),
                         s.get("op_ms_tuned"), ratio, verdict])
    return ("### scaling across world sizes\n\n"
            + markdown(["GPU", "variant", "ranks", "tuning s (warm)", "executions", "ms / execution", "op ms (tuned)",
                        "vs 1 rank", f"target <= {SCALING_LIMIT}x at 4 ranks"], rows)
            + "\n\n- I is split over ranks, so each rank's GEMMs shrink as ranks are added; the target compares "
              "wall time of the whole tuning call.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", default=["benchmarks/results"], help="folders of *.json, or files")
    args = p.parse_args(argv)
    results = load(args.paths)
    if not results:
        print(f"no bench_mlp results found in {args.paths}", file=sys.stderr)
        return 1
    sections = table_sections(results) + [targets_section(results), scaling_section(results)]
    print("\n\n".join(s for s in sections if s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
