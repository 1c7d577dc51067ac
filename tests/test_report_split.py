"""`report` after a split screening (each rank screens its share of the configs): a config another rank screened
shows as screened there, with that rank's time, never as failed; real failures still show as failures."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from triton_ctx_tune.tools.report import build, format_report

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 300


def _events(logs: Path, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (logs / f"rank-{rank}.jsonl").read_text().splitlines()]


def _block(text: str, kernel: str, key: list[Any]) -> list[str]:
    """The report's lines of one key: from its heading to the blank line after it."""
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"{kernel}  key={tuple(key)!r}")))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def _row(block: list[str], j: int) -> list[str]:
    """The cells of config #j's row in a key's table: mark, #j, ms, q20..q80, then one per rank."""
    (line,) = [line for line in block if line.lstrip(" *").startswith(f"#{j} ") and "  " in line.strip()
               and not line.strip().startswith(("failures", "dropped"))]
    return line.replace("*", " ").split()


@pytest.mark.dist
def test_the_readme_example_shows_each_screened_out_config_on_the_rank_that_screened_it(tmp_path):
    logs = tmp_path / "logs"
    env = dict(os.environ, TRITON_CTX_TUNE_LOG_DIR=str(logs), NPROC="2", PYTHON=sys.executable)
    env.pop("TRITON_CTX_TUNE_DEVICE", None)
    try:
        proc = subprocess.run([str(ROOT / "launch"), "examples/tp_mlp.py"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"./launch examples/tp_mlp.py still running after {DEADLINE_S} s:\n{(e.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS" in proc.stdout
    text = format_report(build(logs))
    decisions = [e for e in _events(logs, 0) if e["event"] == "decision"]
    assert len(decisions) == 3 and all(d["split"] and d["world"] == 2 for d in decisions)
    # Every config of the example works: nothing failed, on either rank.
    assert "failed" not in text and "no time" not in text
    assert text.count("  failures   none") == 3
    dropped = raced = 0
    for d in decisions:
        block = _block(text, d["kernel"], d["key"])
        for j in range(len(d["configs"])):
            cells = _row(block, j)
            times = d["per_rank"]
            if j in d["raced_out"]:  # a survivor that left after its first lockstep round
                timed = [r for r in (0, 1) if math.isfinite(times[r][j])]
                if len(timed) == 1:  # a round of one sample: its screening rank's, the other rank warmed it up
                    (k,) = timed
                    assert float(cells[3 + k]) == pytest.approx(times[k][j], abs=1e-4) and cells[3 + (1 - k)] == "-"
                    assert float(cells[1]) == pytest.approx(d["reduced"][j], abs=1e-4)
                    assert f"(left the lockstep rounds after the first: timed on rank {k} alone)" in " ".join(cells)
                else:  # a round of two samples (seen on a loaded machine): the other rank timed it too
                    assert timed == [0, 1]
                    assert [float(c) for c in cells[3:5]] == [pytest.approx(times[r][j], abs=1e-4) for r in (0, 1)]
                    assert "(left the lockstep rounds early)" in " ".join(cells)
                raced += 1
                continue
            if j not in d["screened_out"]:  # a survivor: timed on both ranks
                assert [float(c) for c in cells[3:5]] == [pytest.approx(times[r][j], abs=1e-4) for r in (0, 1)]
                continue
            # Split screening: one rank screened it, and its time is the only one; the other rank never ran it.
            (k,) = [r for r in (0, 1) if math.isfinite(times[r][j])]
            line = f"#{j} {{{d['configs'][j]}}}: screened on rank {k}: {times[k][j]:.4f} ms"
            assert sum(line in x for x in block) == 1, block
            assert float(cells[3 + k]) == pytest.approx(times[k][j], abs=1e-4) and cells[3 + (1 - k)] == "-"
            assert float(cells[1]) == pytest.approx(d["reduced"][j], abs=1e-4)  # the screening rank's time
            assert f"(screened out on rank {k}, not run on the others)" in " ".join(cells)
            dropped += 1
    # 16x16 tiles are many times slower than 32x32 under the interpreter: some config is always screened out.
    assert dropped >= 1
    print(f"{dropped} configs screened out, {raced} left the lockstep rounds early")
    # Run again: every key is a cache hit, and the cache entries tell the split screening as the logs did.
    again = tmp_path / "logs-again"
    proc = subprocess.run([str(ROOT / "launch"), "examples/tp_mlp.py"], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "TRITON_CTX_TUNE_LOG_DIR": str(again)}, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "first call : 1 executions" in proc.stdout
    text = format_report(build(again))
    assert "failed" not in text and "no time" not in text
    for d in decisions:
        block = _block(text, d["kernel"], d["key"])
        for j in d["screened_out"]:
            (k,) = [r for r in (0, 1) if math.isfinite(d["per_rank"][r][j])]
            assert sum(f"#{j} {{{d['configs'][j]}}}: screened on rank {k}: " in x for x in block) == 1, block


@pytest.mark.dist
def test_a_config_failing_on_one_rank_is_still_a_failure_with_and_without_a_split(tmp_path):
    from tests.test_dist import run_ranks

    results = run_ranks(2, ["one_rank_fails", "one_rank_fails_split"], tmp_path)
    for rows in results.values():
        assert all("error" not in row for row in rows), rows
    logs = tmp_path / "logs"
    text = format_report(build(logs))
    mine = {e["key"][0]: e for e in _events(logs, 1) if e["event"] == "decision"}
    for n, split in ((64, False), (96, True)):
        d = mine[n]
        assert d["split"] is split and d["winner"] == 1
        block = _block(text, "_add_one", d["key"])
        # BLOCK=64 (#2) raises OutOfResources on rank 1 only: rank 1's own reason, and "failed" in its column.
        reason = d["local_failures"]["2"]
        assert "OutOfResources" in reason
        assert f"  failures   #2 {{{d['configs'][2]}}}: rank 1: {reason}" in block
        cells = _row(block, 2)
        assert cells[1] == "failed" and cells[4] == "failed" and float(cells[3]) > 0
        assert not any("screened on rank" in line for line in block)
        if split:
            # 64, screened on rank 0 where it works, alone survived; its lockstep time (inf: rank 1 failed)
            # brought back #0 and #1, dropped on their screening ranks, to be timed on both.
            assert d["readmitted"] == [0, 1] and d["screened_out"] == []
            assert "#0, #1 dropped there, then timed in lockstep after all" in "\n".join(block)
            assert all(_row(block, j)[3] != "-" and _row(block, j)[4] != "-" for j in (0, 1))


def test_a_split_screening_rank_that_failed_is_named_and_the_others_did_not_run_it(tmp_path):
    """Logs as two ranks write them: #0 failed where it was screened (rank 0, with a reason); #1 was screened
    on rank 1 and dropped; #2 survived and both ranks timed it; #3 has no time on any rank and no reason."""
    inf = math.inf
    configs = ["BLOCK=16", "BLOCK=32", "BLOCK=64", "BLOCK=128"]
    per_rank = [[inf, inf, 5.0, inf], [inf, 30.0, 6.0, inf]]
    (tmp_path / "logs").mkdir()
    for rank, failures in ((0, {"0": "CompilationError: boom"}), (1, {})):
        events = [{"event": "call", "function": "op", "world": 2, "device": "cpu", "timer": "host"},
                  {"event": "decision", "kernel": "k", "key": [8], "point": None, "winner": 2, "configs": configs,
                   "reduced": [inf, 30.0, 6.0, inf], "per_rank": per_rank, "local_failures": failures,
                   "screened_out": [0, 1, 3], "split": True, "readmitted": [], "world": 2, "reduce": "max",
                   "stat": "median"}]
        (tmp_path / "logs" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    block = _block(format_report(build(tmp_path / "logs")), "k", [8])
    assert "  failures   #0 {BLOCK=16}: rank 0: CompilationError: boom" in block
    assert "             #3 {BLOCK=128}: ranks [0, 1]: no time on any rank (screened on one rank, whose log has " \
           "no reason)" in block
    assert "  dropped    #1 {BLOCK=32}: screened on rank 1: 30.0000 ms" in block
    assert _row(block, 0)[1:] == ["failed", "-", "failed", "-", "BLOCK=16"]  # rank 1 never ran it
    assert _row(block, 1)[1:5] == ["30.0000", "-", "-", "30.0000"]  # (no q20..q80 in these logs)
    assert _row(block, 2)[3:5] == ["5.0000", "6.0000"]
    assert _row(block, 3)[3:5] == ["failed", "failed"]  # who screened it is unknown
