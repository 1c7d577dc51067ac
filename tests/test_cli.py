"""`python -m triton_ctx_tune`: report and cache verbs on the logs and cache of real tuning runs; the progress line."""
from __future__ import annotations

import errno
import json
import os
import pty
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests import kernels as K
from tests.kernels import DEVICE, grid
from triton_ctx_tune import contextual_autotune
from triton_ctx_tune.store import cache as C
from triton_ctx_tune.store.cache import device_identity
from triton_ctx_tune.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(n_warmup=1, n_repeat=2, early_stop=False)  # 3 slots per config


def ramp(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device=DEVICE)


def make_op(cache_dir: Path):
    runs = {"n": 0}

    @contextual_autotune(cache_dir=cache_dir, **FAST)
    def op(x: torch.Tensor):
        runs["n"] += 1
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())  # BLOCK 32 wins, 16 is runner-up
        K.limited_add_one_[grid(h.numel())](h, h.numel(), LIMIT=64)  # BLOCK 128 fails, 64 wins
        return h

    return op, runs


@pytest.fixture
def tuned(tmp_path):
    """One real tuning call: logs in tmp_path/logs (conftest points the log dir there), cache in tmp_path/c."""
    op, runs = make_op(tmp_path / "c")
    x = ramp(128)
    torch.testing.assert_close(op(x), x * 2 + 1)
    assert runs["n"] == 13
    logs = tmp_path / "logs"
    events = [json.loads(line) for line in (logs / "rank-0.jsonl").read_text().splitlines()]
    decisions = {e["kernel"]: e for e in events if e["event"] == "decision"}
    return dict(tmp=tmp_path, logs=logs, cache=tmp_path / "c", op=op, runs=runs, x=x, decisions=decisions)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- report -----------------------------------------------------------------------------------


def test_report_names_choice_runner_up_failures_and_costs(tuned, capsys):
    code, out, _ = run(capsys, "report", tuned["logs"])
    assert code == 0
    d, lim = tuned["decisions"]["double_"], tuned["decisions"]["_limited"]
    row = next(line for line in out.splitlines() if line.strip().startswith("make_op.<locals>.op"))
    calls, executions, wall_s, world = row.split()[1:5]
    assert (calls, executions, world) == ("1", "13", "1") and float(wall_s) > 0
    assert "double_  key=(128, 'torch.float32') in make_op.<locals>.op" in out
    assert f"chosen     #1 {{BLOCK=32, num_warps=4, num_stages=3}}  {d['reduced'][1]:.4f} ms (median, 1 rank)" in out
    # 16 costs SLOW_MS and 64 twice that (tests/kernels.py): 16 is the runner-up on every machine.
    assert d["reduced"][1] < d["reduced"][0] < d["reduced"][2]
    margin = d["reduced"][0] - d["reduced"][1]
    assert (f"runner-up  #0 {{BLOCK=16, num_warps=4, num_stages=3}}  {d['reduced'][0]:.4f} ms  (+{margin:.4f} ms, "
            f"+{100 * margin / d['reduced'][1]:.1f}% slower)") in out
    assert "decided after 9 executions" in out and "decided after 12 executions" in out
    assert f"chosen     #3 {{BLOCK=64, num_warps=4, num_stages=3}}  {lim['reduced'][3]:.4f} ms" in out
    (failure,) = [line for line in out.splitlines() if line.startswith("  failures   #0 {BLOCK=128")]
    assert "rank 0:" in failure and "BLOCK over LIMIT" in failure
    assert out.count("failures   none") == 1
    table = [line for line in out.splitlines() if line.startswith("    * #")]
    assert [line.split()[1] for line in table] == ["#1", "#3"]
    assert "failed" in next(line for line in out.splitlines() if line.startswith("      #0 ") and "BLOCK=128" in line)


def test_report_reads_the_default_log_dir(tuned, capsys, monkeypatch):
    shutil.copytree(tuned["logs"], tuned["tmp"] / "job" / ".autotune_logs")
    monkeypatch.chdir(tuned["tmp"] / "job")
    monkeypatch.delenv("TRITON_CTX_TUNE_LOG_DIR")
    code, out, _ = run(capsys, "report")
    assert code == 0 and "triton_ctx_tune report: .autotune_logs (ranks 0)" in out and "double_" in out
    monkeypatch.setenv("TRITON_CTX_TUNE_LOG_DIR", str(tuned["logs"]))
    code, out, _ = run(capsys, "report")
    assert code == 0 and f"triton_ctx_tune report: {tuned['logs']} (ranks 0)" in out


def test_report_after_a_cache_hit_shows_the_stored_timings(tuned, capsys):
    K.reset_caches()
    tuned["runs"]["n"] = 0
    tuned["op"](tuned["x"])
    assert tuned["runs"]["n"] == 1
    code, out, _ = run(capsys, "report", tuned["logs"])
    assert code == 0
    d = tuned["decisions"]["double_"]
    assert "(2 occurrences in these logs; the latest is shown)" in out
    assert (f"chosen     #1 {{BLOCK=32, num_warps=4, num_stages=3}}  {d['reduced'][1]:.4f} ms (median, 1 rank)  "
            "[from the tuning cache, tuned ") in out
    assert "none in this run (cache hit); the original tuning took 9 executions" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("make_op.<locals>.op"))
    assert row.split()[1:3] == ["2", "14"]  # the tuning call (13 executions) and the hit (1)


def test_report_plot_writes_a_png(tuned, capsys):
    pytest.importorskip("matplotlib")
    png = tuned["tmp"] / "plots" / "latency.png"
    png.parent.mkdir()  # --plot creates no directories (a typo would make them anywhere)
    code, out, _ = run(capsys, "report", tuned["logs"], "--plot", png)
    assert code == 0 and f"plot written to {png}" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    import matplotlib.image

    height, width = matplotlib.image.imread(str(png)).shape[:2]
    assert width == 1000 and height > 300  # two panels


def test_report_plot_without_matplotlib_names_the_install(tuned, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what Python does for a package that is absent
    png = tuned["tmp"] / "latency.png"
    code, out, err = run(capsys, "report", tuned["logs"], "--plot", png)
    assert code == 1 and "double_" in out  # the text report still comes first
    assert "report --plot needs matplotlib" in err and "pip install matplotlib" in err
    assert "triton_ctx_tune[plot]" in err and not png.exists()


def test_report_errors_and_a_torn_last_line(tuned, capsys):
    code, _, err = run(capsys, "report", tuned["tmp"] / "nowhere")
    assert code == 1 and "no log directory" in err and "TRITON_CTX_TUNE_LOG_DIR" in err
    (tuned["tmp"] / "empty").mkdir()
    code, _, err = run(capsys, "report", tuned["tmp"] / "empty")
    assert code == 1 and "no rank-*.jsonl files" in err
    with open(tuned["logs"] / "rank-0.jsonl", "a") as f:
        f.write('{"event": "slot", "ra')  # a job killed mid-line
    code, out, _ = run(capsys, "report", tuned["logs"])
    lines = (tuned["logs"] / "rank-0.jsonl").read_text().count("\n") + 1
    assert code == 0 and "chosen     #1 {BLOCK=32" in out
    assert f"note: rank-0.jsonl line {lines}: not JSON, skipped" in out


# ---- cache --------------------------------------------------------------------------------------


def test_cache_list_and_show(tuned, capsys):
    cache = tuned["cache"]
    code, out, _ = run(capsys, "cache", "list", "--cache-dir", cache)
    assert code == 0 and out.startswith(f"{cache}: 2 entries\n")
    rows = {line.split()[1]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"double_", "_limited"}
    d = tuned["decisions"]["double_"]
    assert f"{d['reduced'][1]:.4f}" in rows["double_"]
    assert rows["double_"].endswith("BLOCK=32, num_warps=4, num_stages=3")
    assert "(128, 'torch.float32')" in rows["_limited"]
    assert rows["_limited"].endswith("BLOCK=64, num_warps=4, num_stages=3")
    (entry,) = [C.read_entry(p) for p in C.entry_paths(cache) if p.name.startswith("double_")]
    code, out, _ = run(capsys, "cache", "show", "--cache-dir", cache, entry["id"][:8])
    assert code == 0 and f"  id         {entry['id']}" in out
    name, count = device_identity()
    device = name + (f" {C.device_arch()}" if C.device_arch() else "") + (f" x{count}" if count else "")
    assert f"valid for  {device}, world 1, reduce max, stat median" in out and "these 3 configs in order" in out
    assert f"chosen     #1 {{BLOCK=32, num_warps=4, num_stages=3}}  {d['reduced'][1]:.4f} ms" in out
    assert "tuning     took 9 executions" in out and "_limited" not in out
    code, _, err = run(capsys, "cache", "show", "--cache-dir", cache, "no_such_kernel")
    assert code == 1 and "no entry in" in err and "cache list" in err


def test_env_cache_dir_is_the_default(tuned, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_CTX_TUNE_CACHE_DIR", str(tuned["cache"]))
    code, out, _ = run(capsys, "cache", "list")
    assert code == 0 and out.startswith(f"{tuned['cache']}: 2 entries")


def test_export_clear_import_round_trip_then_hit_elsewhere(tuned, capsys):
    cache, export = tuned["cache"], tuned["tmp"] / "ship" / "tuned.json"
    before = {p.name: p.read_bytes() for p in C.entry_paths(cache)}
    code, out, _ = run(capsys, "cache", "export", "--cache-dir", cache, export)
    assert code == 0 and f"exported 2 entries from {cache} to {export}" in out
    data = json.loads(export.read_text())
    assert data["format"] == "triton_ctx_tune.cache-export/1" and len(data["entries"]) == 2
    code, out, _ = run(capsys, "cache", "clear", "--cache-dir", cache)
    assert code == 0 and f"removed 2 entries from {cache}" in out and C.entry_paths(cache) == []
    code, out, _ = run(capsys, "cache", "import", "--cache-dir", cache, export)
    assert code == 0 and f"imported 2 entries into {cache}" in out
    assert {p.name: p.read_bytes() for p in C.entry_paths(cache)} == before
    # "Another machine": a fresh cache directory that only has what was imported.
    cluster = tuned["tmp"] / "cluster-cache"
    assert run(capsys, "cache", "import", "--cache-dir", cluster, export)[0] == 0
    K.reset_caches()
    op, runs = make_op(cluster)
    x = ramp(128)
    torch.testing.assert_close(op(x), x * 2 + 1)
    assert runs["n"] == 1 and op.last_call.cache_hits == 2
    code, out, _ = run(capsys, "cache", "import", "--cache-dir", cluster, export)
    assert "(2 replaced existing ones)" in out


def test_import_validates_every_entry_and_writes_nothing_if_one_is_bad(tuned, capsys):
    export = tuned["tmp"] / "tuned.json"
    assert run(capsys, "cache", "export", "--cache-dir", tuned["cache"], export)[0] == 0
    data = json.loads(export.read_text())
    data["entries"][1]["winner"]["index"] = 9
    export.write_text(json.dumps(data))
    target = tuned["tmp"] / "target"
    code, _, err = run(capsys, "cache", "import", "--cache-dir", target, export)
    kernel = data["entries"][1]["identity"]["kernel"]
    assert code == 1 and "1 of 2 entries are invalid, so nothing was imported" in err
    assert f"entry #1 ({kernel} key=(128, 'torch.float32')): winner index 9 is outside" in err
    assert C.entry_paths(target) == []
    export.write_text("{not json")
    code, _, err = run(capsys, "cache", "import", "--cache-dir", target, export)
    assert code == 1 and "is not a readable JSON file" in err
    export.write_text(json.dumps({"entries": []}))
    code, _, err = run(capsys, "cache", "import", "--cache-dir", target, export)
    assert code == 1 and "neither a cache export" in err
    single = C.entry_paths(tuned["cache"])[0]
    code, out, _ = run(capsys, "cache", "import", "--cache-dir", target, single)  # one entry file also imports
    assert code == 0 and "imported 1 entry" in out and [p.name for p in C.entry_paths(target)] == [single.name]


def test_list_flags_invalid_entries_and_clear_takes_selectors(tuned, capsys):
    cache = tuned["cache"]
    paths = {p.name.split("-")[0]: p for p in C.entry_paths(cache)}
    paths["_limited"].write_text('{"format": "triton_ctx_tune.cache/1", "ident')
    (cache / f".{paths['double_'].name}.x1_y2z3.tmp").write_text("{")  # what a killed writer leaves
    code, out, _ = run(capsys, "cache", "list", "--cache-dir", cache)
    assert code == 0 and out.startswith(f"{cache}: 1 entry, 1 invalid")
    assert f"INVALID {paths['_limited']}: is not valid JSON" in out
    code, out, _ = run(capsys, "cache", "clear", "--cache-dir", cache, "double_")
    assert code == 0 and "removed 1 entry" in out
    assert [p.name for p in C.entry_paths(cache)] == [paths["_limited"].name]
    code, out, _ = run(capsys, "cache", "clear", "--cache-dir", cache)
    assert code == 0 and "removed 1 entry" in out and "and 1 leftover temporary files" in out
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize("argv", [[], ["report"], ["cache"], ["cache", "list"], ["cache", "show"], ["cache", "clear"],
                                  ["cache", "export"], ["cache", "import"]], ids=lambda a: " ".join(a) or "top")
def test_every_verb_has_help(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.startswith("usage: python -m triton_ctx_tune")
    if argv[:1] == ["cache"] and len(argv) == 2:
        assert "--cache-dir" in out and "TRITON_CTX_TUNE_CACHE_DIR" in out


def test_module_entry_point(tuned):
    proc = subprocess.run([sys.executable, "-m", "triton_ctx_tune", "cache", "list", "--cache-dir",
                           str(tuned["cache"])], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{tuned['cache']}: 2 entries")
    proc = subprocess.run([sys.executable, "-m", "triton_ctx_tune", "cache", "frobnicate"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "invalid choice: 'frobnicate'" in proc.stderr


# ---- progress line --------------------------------------------------------------------------------

_PROGRESS_SCRIPT = textwrap.dedent("""
    import torch
    from tests import kernels as K
    from tests.kernels import grid
    from triton_ctx_tune import contextual_autotune

    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, quiet=False, cache=False, log_dir=False)
    def op(x):
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        return h

    op(torch.arange(96, dtype=torch.float32))
    """)


def test_progress_line_on_a_terminal():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CTX_TUNE_QUIET"}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", _PROGRESS_SCRIPT], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError as e:  # EIO: the child closed the terminal
            assert e.errno == errno.EIO
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 0
    tty = b"".join(chunks).decode()
    for step in range(1, 10):
        assert f"\r[triton_ctx_tune] tuning op: step {step}/10, " in tty, tty
    assert "s elapsed, ~" in tty and "s left" in tty
    # The decision's summary starts on a cleared line, not after the progress text.
    summary = tty.index("[triton_ctx_tune] op: double_ key=(96, 'torch.float32') -> {BLOCK=32")
    assert tty[summary - 2:summary] == " \r"
    # Erased when the call ended; then the call's compile line, on a line of its own.
    compile_at = tty.rindex("[triton_ctx_tune] op: compile: 3 configs")
    assert tty.endswith("\r\n") and "\r" not in tty[compile_at:].rstrip("\r\n")
    assert tty[:compile_at].endswith(" \r") and tty[:compile_at].rstrip(" \r").endswith("s left")


def test_no_progress_line_off_a_terminal(capfd):
    @contextual_autotune(quiet=False, cache=False, **FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        return h

    op(ramp(96))
    err = capfd.readouterr().err
    assert "op: double_ key=(96, 'torch.float32') -> {BLOCK=32" in err  # the summary line, as always
    assert "\r" not in err and "step 1/" not in err
