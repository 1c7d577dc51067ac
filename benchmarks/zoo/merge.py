"""The zoo's table: every arm's JSON in a folder (run_zoo.py --out DIR), per world size, as markdown.

    python benchmarks/zoo/merge.py DIR        # prints it and writes DIR/zoo.md

Per case and key: what each arm did (tuned, not tuned, refused, error, skipped), the output's error under the
library's test tolerance (ours against the reference, and ours against plain's saved output: the same rule with
plain's output as the reference), whether the ranks agree on the key's config in each arm, the first call's time
and the steady time, ours and plain. Then the zoo's totals per world size.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HEADER = ["case", "key", "plain", "ours", "output ok: ours vs ref / vs plain", "ranks agree: plain / ours",
          "first call s: ours / plain", "steady ms: ours / plain"]


def load(folder: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """{world: {arm: {case: record}}} from every zoo-<arm>-w<world>.json in the folder."""
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for path in sorted(folder.glob("zoo-*-w*.json")):
        data = json.loads(path.read_text())
        runs.setdefault(int(data["world"]), {})[data["arm"]] = {r["case"]: r for r in data["results"]}
    return runs


def ours_vs_plain(folder: Path, world: int, case: str, tolerance: dict[str, Any] | None) -> float | None:
    """Worst ratio over the ranks whose outputs both arms saved; None when there is nothing to compare."""
    if tolerance is None:
        return None
    import torch
    from checks import Tolerance

    rule = Tolerance(**tolerance)
    ratios = []
    for mine in sorted((folder / f"outputs-ours-w{world}").glob(f"{case}.rank*.pt")):
        theirs = folder / f"outputs-plain-w{world}" / mine.name
        if theirs.exists():
            ratios.append(rule.ratio(torch.load(mine), torch.load(theirs)))
    return max(ratios) if ratios else None


def _status(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "not run"
    if rec["status"] in ("error", "refused"):
        text = rec["error"] if len(rec["error"]) <= 100 else rec["error"][:97] + "..."
        return f"{rec['status']} ({rec['stage']}): {text}".replace("|", "/").replace("\n", " ")
    if rec["status"] == "skipped":
        return rec["reason"]
    return rec["status"]


def _agrees(rec: dict[str, Any] | None, key: str) -> str:
    if rec is None or "agreement" not in rec or key not in rec["agreement"]["per_key"]:
        return "-"
    picks = rec["agreement"]["per_key"][key]
    return "yes" if None not in picks and len(set(picks)) == 1 else f"NO ({len(set(picks))} configs)"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ok(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{'ok' if ratio <= 1 else 'WRONG'} ({ratio:.2g})" if math.isfinite(ratio) else "WRONG (inf)"


def case_rows(folder: Path, world: int, name: str, plain: dict[str, Any] | None, ours: dict[str, Any] | None
              ) -> tuple[list[list[str]], float | None]:
    vs_plain = ours_vs_plain(folder, world, name, (ours or plain or {}).get("tolerance"))
    keys = sorted(set((plain or {}).get("keys", {})) | set((ours or {}).get("keys", {}))) or ["-"]
    mine, theirs = ours or {}, plain or {}
    rows = []
    for key in keys:
        ours_key = _status(ours)
        if ours and key in ours.get("seen_not_tuned", []):
            ours_key = "seen, not tuned by ours"
        rows.append([name, key.replace("|", "/"), _status(plain), ours_key,
                     f"{_ok(mine.get('error_ratio'))} / {_ok(vs_plain)}",
                     f"{_agrees(plain, key)} / {_agrees(ours, key)}",
                     f"{_num(mine.get('first_call_s'), '.2f')} / {_num(theirs.get('first_call_s'), '.2f')}",
                     f"{_num(mine.get('steady_ms'), '.3f')} / {_num(theirs.get('steady_ms'), '.3f')}"])
    return rows, vs_plain


def _disagreements(rec: dict[str, Any] | None) -> int:
    return len(rec["agreement"]["differ"]) if rec and "agreement" in rec else 0


def _mismatches(arm: dict[str, Any]) -> str:
    found = [f"{n}: {', '.join(r['libentry_mismatches'])}" for n, r in arm.items() if r.get("libentry_mismatches")]
    return "; ".join(found) or "none"


def totals(arms: dict[str, dict[str, Any]], vs_plain: dict[str, float | None]) -> list[str]:
    ours, plain = arms.get("ours", {}), arms.get("plain", {})
    ran = [r for r in ours.values() if r["status"] != "skipped"]
    tuned = [r for r in ran if r["status"] == "tuned"]
    wrong = [n for n, r in ours.items() if r.get("ok") is False or (vs_plain.get(n) or 0) > 1]
    both = [n for n in ours if "first_call_s" in ours[n] and "first_call_s" in plain.get(n, {})]
    t_ours = sum(ours[n]["first_call_s"] for n in both)
    t_plain = sum(plain[n]["first_call_s"] for n in both)
    return [
        f"- cases run by ours: {len(ran)} ({len(ours) - len(ran)} skipped); tuned: {len(tuned)} "
        f"({100 * len(tuned) / len(ran):.0f}%)" if ran else "- cases run by ours: 0",
        f"- not tuned by ours: {', '.join(n for n, r in ours.items() if r['status'] == 'not tuned') or 'none'}",
        f"- refused by ours: {', '.join(n for n, r in ours.items() if r['status'] == 'refused') or 'none'}",
        f"- crashes (error) ours / plain: {sum(r['status'] == 'error' for r in ours.values())} / "
        f"{sum(r['status'] == 'error' for r in plain.values())}",
        f"- wrong outputs (ours vs reference or vs plain): {', '.join(wrong) or 'none'}; plain vs reference: "
        f"{', '.join(n for n, r in plain.items() if r.get('ok') is False) or 'none'}",
        f"- FlagGems kernels whose LibEntry launcher runs a config no key was given, plain / ours: "
        f"{_mismatches(plain)} / {_mismatches(ours)}",
        f"- keys whose ranks disagree, plain / ours: {sum(map(_disagreements, plain.values()))} / "
        f"{sum(map(_disagreements, ours.values()))}",
        f"- total first-call time over the {len(both)} cases both arms ran: ours {t_ours:.1f} s, plain "
        f"{t_plain:.1f} s" + (f" (ours/plain {t_ours / t_plain:.2f})" if t_plain else ""),
    ]


def render(folder: Path) -> str:
    lines = []
    for world, arms in sorted(load(folder).items()):
        names = list(dict.fromkeys([*arms.get("plain", {}), *arms.get("ours", {})]))
        lines += [f"## {world} rank(s)", "", "| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
        vs_plain = {}
        for name in names:
            rows, vs_plain[name] = case_rows(folder, world, name, arms.get("plain", {}).get(name),
                                             arms.get("ours", {}).get(name))
            lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines += ["", *totals(arms, vs_plain), ""]
    return "\n".join(lines) if lines else f"no zoo-<arm>-w<world>.json in {folder}\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE))
    folder = Path(args[0])
    text = render(folder)
    (folder / "zoo.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
