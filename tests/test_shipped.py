"""Tuned configs shipped with a library: `cache export --ship DIR`, config_path= and TRITON_CTX_TUNE_CONFIG_PATH.

Real kernels under the interpreter, real files: tune, ship, wipe the user cache, resolve from the shipped
file; user cache > shipped file > tune; a shipped entry of another device is skipped with the reason."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from tests import kernels as K
from tests.kernels import DEVICE, chosen, grid, spend
from triton_ctx_tune import autotune, contextual_autotune
from triton_ctx_tune.errors import CacheWarning
from triton_ctx_tune.store import cache as C
from triton_ctx_tune.tools import cli
from triton_ctx_tune.tools.report import build, format_report

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(n_warmup=1, n_repeat=2, early_stop=False)  # 3 slots per config
DEADLINE_S = 300


def _ship_body(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def fresh_kernel() -> Any:
    """A new autotuned kernel object (empty Autotuner.cache) with the same identity every time: BLOCK 32 wins."""
    return triton.autotune(configs=K.block_configs([16, 32], slow={16: K.SLOW_MS}), key=["n"])(triton.jit(_ship_body))


def make_op(kernel: Any, **opts: Any) -> Any:
    @contextual_autotune(**FAST, **opts)
    def op(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        kernel[grid(h.numel())](h, h.numel())
        return h

    return op


def safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", text)


def events(tmp_path: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    return [e for e in rows if e["event"] == kind]


def ship(cache: Path, out: Path, *extra: str) -> None:
    assert cli.main(["cache", "export", "--ship", str(out), "--cache-dir", str(cache), *extra]) == 0


def tune_and_ship(tmp_path: Path) -> tuple[Path, Path, str]:
    """Tune make_op's kernel into tmp/c, ship it into tmp/ship; the shipped file and the op's qualname."""
    cache, out = tmp_path / "c", tmp_path / "ship"
    op = make_op(fresh_kernel(), cache_dir=cache)
    x = torch.arange(64, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(op(x), x + 1)
    assert op.last_call.executions == 7 and op.last_call.cache_hits == 0  # 2 configs x 3 slots, then the final run
    ship(cache, out)
    name = make_op.__qualname__ + ".<locals>.op"
    (path,) = out.iterdir()
    assert path.name == f"{safe(C.device_identity()[0])}-{safe(name)}.json"
    return cache, path, name


def run_op(kernel: Any, **opts: Any) -> Any:
    op = make_op(kernel, **opts)
    x = torch.arange(64, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(op(x), x + 1)
    return op


def test_shipped_file_is_named_per_device_and_function_and_resolves_a_fresh_job(tmp_path, capsys):
    cache, path, name = tune_and_ship(tmp_path)
    if C.device_identity()[0] == "cpu-interpreter":
        assert path.name == "cpu-interpreter-make_op._locals_.op.json"
    data = json.loads(path.read_text())
    (cached,) = C.entry_paths(cache)
    assert data["format"] == C.EXPORT_FORMAT and data["functions"] == []
    assert data["entries"] == [json.loads(cached.read_text())]
    entry = data["entries"][0]
    assert entry["tuned"]["function"] == name and entry["winner"]["config"].startswith("BLOCK=32,")
    assert f"shipped 1 kernel entry to {path}" in capsys.readouterr().out
    # `cache import` reads a shipped file like any export.
    assert cli.main(["cache", "import", "--cache-dir", str(tmp_path / "imported"), str(path)]) == 0
    assert [p.name for p in C.entry_paths(tmp_path / "imported")] == [cached.name]

    shutil.rmtree(cache)  # a user who never tuned
    kernel = fresh_kernel()
    op = run_op(kernel, cache_dir=cache, config_path=path.parent)
    assert op.last_call.executions == 1 and op.last_call.cache_hits == 1 and op.last_call.tuned == []
    assert chosen(kernel) == {(64, "torch.float32"): 32}
    assert C.entry_paths(cache) == []  # a shipped hit is not copied into the user cache
    (hit,) = events(tmp_path, "cache-hit")
    assert hit["source"] == str(path) and hit["winner"] == 1 and hit["entry"] == entry
    assert f"from {path}" in (tmp_path / "logs" / "rank-0.log").read_text()
    assert f"[from the shipped config file {path}" in format_report(build(tmp_path / "logs"))


def _set_winner(path: Path, index: int) -> None:
    """Make the shipped entry name another winner (its id is the identity's hash, which this keeps)."""
    data = json.loads(path.read_text())
    entry = data["entries"][0]
    entry["winner"] = {"index": index, "config": entry["timings"][index]["config"]}
    assert C.entry_problem(entry) is None
    path.write_text(json.dumps(data))


def test_user_cache_beats_the_shipped_file_which_beats_tuning(tmp_path):
    cache, path, _ = tune_and_ship(tmp_path)
    _set_winner(path, 0)  # the shipped file now says BLOCK 16; the user's cache still says 32
    kernel = fresh_kernel()
    op = run_op(kernel, cache_dir=cache, config_path=[tmp_path / "elsewhere-unused", path.parent])
    assert op.last_call.executions == 1 and chosen(kernel) == {(64, "torch.float32"): 32}
    assert events(tmp_path, "cache-hit")[-1]["source"] == "cache"
    shutil.rmtree(cache)
    kernel = fresh_kernel()
    op = run_op(kernel, cache_dir=cache, config_path=str(path.parent))
    assert op.last_call.executions == 1 and chosen(kernel) == {(64, "torch.float32"): 16}  # the file's, edited
    assert events(tmp_path, "cache-hit")[-1]["source"] == str(path)
    # The file changed (mtime): the process reads it again.
    _set_winner(path, 1)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    kernel = fresh_kernel()
    run_op(kernel, cache_dir=cache, config_path=str(path.parent))
    assert chosen(kernel) == {(64, "torch.float32"): 32}


def test_shipped_entry_of_another_device_is_skipped_with_the_reason_and_the_key_tuned(tmp_path):
    cache, path, name = tune_and_ship(tmp_path)
    data = json.loads(path.read_text())
    entry = data["entries"][0]
    here = entry["identity"]["device"]
    # What the same library's export for another GPU holds (on the device machine, "here" is an H200).
    there = "NVIDIA H100 80GB HBM3" if here == "NVIDIA H200" else "NVIDIA H200"
    entry["identity"]["device"] = there
    entry["id"] = C.entry_id(entry["identity"])
    assert C.entry_problem(entry) is None
    other = path.parent / f"{safe(there)}-{safe(name)}.json"
    other.write_text(json.dumps(data))
    path.unlink()
    shutil.rmtree(cache)
    kernel = fresh_kernel()
    op = run_op(kernel, cache_dir=cache, config_path=path.parent)
    assert op.last_call.executions == 7 and op.last_call.cache_hits == 0
    assert chosen(kernel) == {(64, "torch.float32"): 32}
    (stale,) = events(tmp_path, "cache-stale")
    assert stale["source"] == "shipped" and stale["path"] == str(other) and stale["others"] == 0
    assert stale["reasons"] == [f"device {there!r} -> {here!r}"]
    assert f"the shipped entry in {other} does not apply: device {there!r}" in (
        tmp_path / "logs" / "rank-0.log").read_text()
    assert len(C.entry_paths(cache)) == 1  # tuned here, so stored in the user's cache as usual


def test_env_variable_path_missing_directory_and_damaged_file_warn_and_still_resolve(tmp_path, monkeypatch):
    cache, path, _ = tune_and_ship(tmp_path)
    shutil.rmtree(cache)
    (path.parent / "broken.json").write_text("{not json")
    (path.parent / "other.json").write_text('{"theme": "dark"}')
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv("TRITON_CTX_TUNE_CONFIG_PATH", f"{missing}{os.pathsep}{path.parent}")
    kernel = fresh_kernel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = run_op(kernel, cache_dir=cache)
    assert op.last_call.executions == 1 and chosen(kernel) == {(64, "torch.float32"): 32}
    said = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert any(f"{missing} (TRITON_CTX_TUNE_CONFIG_PATH) does not exist" in s and "Fix:" in s for s in said)
    assert any("broken.json" in s and "not readable JSON" in s and "Fix:" in s for s in said)
    assert any("other.json" in s and "not a triton_ctx_tune export" in s for s in said)
    assert len(said) == 3
    # Once per process: the same files and directory say nothing the second time.
    kernel = fresh_kernel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_op(kernel, cache_dir=cache)
    assert [w for w in caught if issubclass(w.category, CacheWarning)] == []
    # The cache off turns shipped files off too.
    kernel = fresh_kernel()
    op = run_op(kernel, cache=False)
    assert op.last_call.executions == 7


COST = {1: 30.0, 2: 10.0}


def spaced(calls: list[int]) -> Any:
    @autotune(config_space=[{"chunks": 1}, {"chunks": 2}], n_warmup=1, n_repeat=2, early_stop=False, e2e_runs=1)
    def op(x: torch.Tensor, *, chunks: int) -> torch.Tensor:
        calls.append(chunks)
        x = x.clone()
        n = x.numel() // chunks
        for c in range(chunks):
            K.double_[grid(n)](x[c * n:(c + 1) * n], n)
        spend(COST[chunks])
        return x

    return op


def test_function_level_space_ships_and_resolves(tmp_path, monkeypatch):
    cache, out = tmp_path / "cache", tmp_path / "ship"  # conftest's TRITON_CTX_TUNE_CACHE_DIR
    calls: list[int] = []
    op = spaced(calls)
    torch.testing.assert_close(op(torch.ones(64, device=DEVICE)), torch.full((64,), 2.0, device=DEVICE))
    assert op.last_call.point == {"chunks": 2} and len(calls) > 2
    ship(cache, out, "--function", spaced.__qualname__ + ".<locals>.op")
    (path,) = out.iterdir()
    assert path.name == f"{safe(C.device_identity()[0])}-spaced._locals_.op.json"
    data = json.loads(path.read_text())
    (fe,) = data["functions"]
    assert fe["identity"]["function"] == spaced.__qualname__ + ".<locals>.op" and fe["winner"]["index"] == 1
    assert [e["identity"]["kernel"] for e in data["entries"]] == []  # its kernels were tuned under points only
    shutil.rmtree(cache)
    K.reset_caches()
    monkeypatch.setenv("TRITON_CTX_TUNE_CONFIG_PATH", str(out))
    calls = []
    op = spaced(calls)
    torch.testing.assert_close(op(torch.ones(64, device=DEVICE)), torch.full((64,), 2.0, device=DEVICE))
    assert calls == [2] and op.last_call.cache_hits == 1 and op.last_call.point == {"chunks": 2}
    hit = events(tmp_path, "cache-hit")[-1]
    assert hit["source"] == str(path) and hit["function"] == fe["identity"]["function"]
    assert not (cache / "functions").exists() or list((cache / "functions").iterdir()) == []
    # Import writes it into a cache's functions/ folder, where a plain lookup finds it.
    assert cli.main(["cache", "import", "--cache-dir", str(tmp_path / "imp"), str(path)]) == 0
    assert len(list((tmp_path / "imp" / "functions").iterdir())) == 1
    # The same library's file for another world size: skipped with the reason, and the function tuned.
    fe["identity"]["world"] = 8
    path.write_text(json.dumps(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    calls = []
    op = spaced(calls)
    op(torch.ones(64, device=DEVICE))
    assert len(calls) > 2 and op.last_call.cache_hits == 0 and op.last_call.point == {"chunks": 2}
    stale = events(tmp_path, "cache-stale")[-1]
    assert stale["source"] == "shipped" and stale["path"] == str(path) and stale["reasons"] == ["world size 8 -> 1"]
    assert stale["function"] == fe["identity"]["function"]


# ---- two ranks --------------------------------------------------------------------------------------


def run_ranks(out: Path, *args: str) -> list[dict]:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < 2:
        pytest.skip("needs 2 GPUs")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CTX_TUNE_QUIET="1", OMP_NUM_THREADS="1",
               TRITON_CTX_TUNE_LOG_DIR=str(out / "logs"))
    env.pop("TRITON_CTX_TUNE_CONFIG_PATH", None)
    if gpus == 0:
        env.update(TRITON_INTERPRET="1", TRITON_CTX_TUNE_BACKEND="gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "shipped_worker.py"), "--out", str(out), *args]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ranks still running after {DEADLINE_S} s (a hang):\n{(e.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_two_ranks_rank0_reads_the_shipped_file_and_both_run_its_winner(tmp_path):
    cache = tmp_path / "c"
    cold = run_ranks(tmp_path / "cold", "--cache-dir", str(cache))
    assert [r["executions"] for r in cold] == [10, 10] and [r["blocks"] for r in cold] == [{"64": 32}] * 2
    ship(cache, tmp_path / "ship")
    (path,) = (tmp_path / "ship").iterdir()
    _set_winner(path, 0)  # BLOCK 16: tuning would never choose it, so running it proves the file was used
    # Fresh caches on both ranks; rank 1's config_path does not exist: it never searches, so never warns.
    warm = run_ranks(tmp_path / "warm", "--cache-dir", str(tmp_path / "fresh"), "--config-path",
                     str(path.parent), "--rank1-config-path", str(tmp_path / "not-on-this-node"))
    for r in warm:
        assert r["ok"] and r["executions"] == 1 and r["cache_hits"] == 1 and r["blocks"] == {"64": 16}, r
        assert r["warnings"] == []
    assert C.entry_paths(tmp_path / "fresh") == []
    hits = [[json.loads(line) for line in (tmp_path / "warm" / "logs" / f"rank-{r}.jsonl").read_text().splitlines()]
            for r in range(2)]
    sources = [[e["source"] for e in rows if e["event"] == "cache-hit"] for rows in hits]
    assert sources == [[str(path)], ["shipped"]]


def test_freeze_borrows_the_nearest_shipped_key_when_the_users_cache_has_none(tmp_path):
    cache, path, _ = tune_and_ship(tmp_path)  # n=64: BLOCK 32 (16 is declared slow)
    shutil.rmtree(cache)
    kernel = fresh_kernel()
    op = make_op(kernel, cache_dir=cache, config_path=path.parent, freeze=True)
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(op(x), x + 1)
    # Never tuned: the shipped n=64 entry is the nearest tuned key, so its winner runs, not the first config.
    assert op.last_call.executions == 1 and op.last_call.tuned == []
    assert chosen(kernel) == {(100, "torch.float32"): 32}
    (miss,) = events(tmp_path, "freeze-miss")
    assert miss["nearest"] == "(64, 'torch.float32')" and miss["config_index"] == 1
    # Without the shipped file nothing is near: the first config, BLOCK 16.
    kernel = fresh_kernel()
    torch.testing.assert_close(make_op(kernel, cache_dir=cache, freeze=True)(x), x + 1)
    assert chosen(kernel) == {(100, "torch.float32"): 16}
