"""The persistent tuning cache: entry format, hits, damaged files, invalidation, concurrent writers, ranks."""
from __future__ import annotations

import datetime
import hashlib
import importlib.util
import inspect
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from tests import cache_worker as W
from tests import kernels as K
from tests.kernels import DEVICE, autotuner, chosen, grid
from triton_ctx_tune import InvalidOptionError, contextual_autotune
from triton_ctx_tune.errors import CacheWarning
from triton_ctx_tune.options import TuneOptions
from triton_ctx_tune.runtime.compat import config_str, config_to_dict
from triton_ctx_tune.store import cache as C
from triton_ctx_tune.store.fingerprint import callable_digest

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(n_warmup=1, n_repeat=2, early_stop=False)  # 3 slots per config
DEADLINE_S = 300


def ramp(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device=DEVICE)


def counting_op(kernel, cache_dir: Path | None, **opts):
    """A function that applies `kernel` (x += 1 style) in place and counts how often its body runs."""
    runs = {"n": 0}

    @contextual_autotune(cache_dir=cache_dir, **FAST, **opts)
    def op(x: torch.Tensor):
        runs["n"] += 1
        h = x.clone()
        kernel[grid(h.numel())](h, h.numel())
        return h

    return op, runs


def entries(directory: Path) -> list[Path]:
    return C.entry_paths(directory)


def strict_json(path: Path) -> dict:
    def reject(name: str) -> None:
        raise AssertionError(f"{path} holds {name}, which strict JSON has not")
    return json.loads(path.read_text(), parse_constant=reject)


# ---- one process --------------------------------------------------------------------------------


def test_entry_holds_identity_winner_timings_and_failures(tmp_path):
    cache = tmp_path / "c"

    @contextual_autotune(cache_dir=cache, **FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        K.limited_add_one_[grid(h.numel())](h, h.numel(), LIMIT=64)  # BLOCK 128 fails, 64 wins
        return h

    x = ramp(128)
    torch.testing.assert_close(op(x), x + 1)
    (path,) = entries(cache)
    entry = strict_json(path)
    at = autotuner(K.limited_add_one_)
    ident = entry["identity"]
    interpreted = not torch.cuda.is_available()
    no_specialize = None if interpreted else []  # jit() stores None, JITFunction an empty list
    assert ident == {
        "format": "triton_ctx_tune.cache/2", "kernel": "_limited",
        "code": {"functions": [{"name": "_limited",
                                "sha256": hashlib.sha256(inspect.getsource(K._limited).encode()).hexdigest(),
                                "options": {"noinline": None, "debug": None, "do_not_specialize": no_specialize,
                                            "do_not_specialize_on_alignment": no_specialize}}],
                 "globals": {}, "heuristics": {}},
        "autotuner": {"key": ["n"], "reset_to_zero": [], "restore_value": []},
        "key": "(128, 'torch.float32')", "configs": [config_to_dict(c) for c in at.configs],
        "hooks": {"config_pre_hooks": [callable_digest(c.pre_hook) for c in at.configs],
                  "autotuner": [callable_digest(at.pre_hook), callable_digest(at.post_hook)]},
        "device": "cpu-interpreter" if interpreted else torch.cuda.get_device_name(),
        "arch": "" if interpreted else C.device_arch(),
        "device_count": 0 if interpreted else torch.cuda.device_count(), "world": 1, "reduce": "max",
        "stat": "median", "triton": triton.__version__, "torch": torch.__version__}
    assert entry["id"] == hashlib.sha256(C.canonical(ident).encode()).hexdigest()
    assert path.name == f"_limited-{entry['id']}.json"
    assert entry["winner"] == {"index": 3, "config": config_str(at.configs[3])}
    assert entry["winner"]["config"].startswith("BLOCK=64,")
    timings = entry["timings"]
    assert [t["config"] for t in timings] == [config_str(c) for c in at.configs]
    assert timings[0]["ms"] is None and timings[0]["failed_ranks"] == [0]
    assert "BLOCK over LIMIT" in timings[0]["failure"]
    assert all(t["ms"] > 0 and t["failure"] is None and t["per_rank_ms"] == [t["ms"]] for t in timings[1:])
    assert timings[3]["ms"] < timings[1]["ms"] < timings[2]["ms"]  # 16 and 32 cost SLOW_MS and twice that
    assert abs(datetime.datetime.fromisoformat(entry["tuned"]["date"]).timestamp()
               - datetime.datetime.now().timestamp()) < 120
    assert entry["tuned"]["executions"] == 12 and entry["tuned"]["function"].endswith("op")
    assert C.entry_problem(entry) is None


def test_warm_cache_hit_runs_the_function_exactly_once(tmp_path):
    cache = tmp_path / "c"
    runs = 0

    @contextual_autotune(cache_dir=cache, **FAST)
    def op(x: torch.Tensor):
        nonlocal runs
        runs += 1
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())  # in place: applied more than once would be wrong
        K.add_one_[grid(h.numel())](h, h.numel())
        return h

    x = ramp(96)
    torch.testing.assert_close(op(x), x * 2 + 1)
    assert runs == 10 and op.last_call.cache_hits == 0 and len(entries(cache)) == 2
    before = {p: p.read_bytes() for p in entries(cache)}
    K.reset_caches()  # a new process: nothing in memory, everything on disk
    runs = 0
    torch.testing.assert_close(op(x), x * 2 + 1)
    assert runs == 1 and op.last_call.executions == 1
    assert op.last_call.cache_hits == 2 and op.last_call.tuned == []
    assert chosen(K.double_) == {(96, "torch.float32"): 32} and chosen(K.add_one_) == {(96, "torch.float32"): 16}
    assert {p: p.read_bytes() for p in entries(cache)} == before  # a hit writes nothing
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    hits = [e for e in events if e["event"] == "cache-hit"]
    assert [(e["kernel"], e["winner"]) for e in hits] == [("double_", 1), ("add_one_", 0)]
    assert all(e["entry"]["winner"]["index"] == e["winner"] for e in hits)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xff\xfe garbage \x80" * 10)


def _pickle(path: Path) -> None:
    # What a pickle-based cache would run on load; JSON must just refuse it.
    path.write_bytes(pickle.dumps(_Exploit(str(path) + ".pwned")))


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _edit(change):
    def damage(path: Path) -> None:
        entry = json.loads(path.read_text())
        change(entry)
        path.write_text(json.dumps(entry))
    return damage


def _loop(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.name)  # a link to itself: opening it fails even as root


DAMAGES = {
    "truncated": (_truncate, "is not valid JSON"),
    "garbage": (_garbage, "is not valid JSON"),
    "pickle": (_pickle, "is not valid JSON"),
    "not-an-object": (lambda p: p.write_text("[1, 2, 3]"), "expected a JSON object"),
    "winner-out-of-range": (_edit(lambda e: e["winner"].update(index=7)), "outside the 3 configs"),
    "winner-not-its-config": (_edit(lambda e: e["winner"].update(config="BLOCK=128, num_warps=4, num_stages=3")),
                              "differs from its entry in 'timings'"),
    "identity-edited": (_edit(lambda e: e["identity"].update(world=2)), "not the hash of 'identity'"),
    "unreadable": (_loop, "cannot be read"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_entry_warns_is_retuned_and_rewritten(tmp_path, damage):
    cache = tmp_path / "c"
    op, runs = counting_op(K.double_, cache)
    x = ramp(96)
    op(x)
    (path,) = entries(cache)
    good = json.loads(path.read_text())
    change, reason = DAMAGES[damage]
    change(path)
    K.reset_caches()
    runs["n"] = 0
    with pytest.warns(CacheWarning) as record:
        torch.testing.assert_close(op(x), x * 2)
    messages = [str(w.message) for w in record if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and str(path) in messages[0] and reason in messages[0], messages
    assert "tuned again and the entry rewritten" in messages[0]
    assert runs["n"] == 10 and op.last_call.cache_hits == 0  # tuned from scratch, never a wrong config
    assert chosen(K.double_) == {(96, "torch.float32"): 32}
    assert not Path(str(path) + ".pwned").exists()
    repaired = C.read_entry(path)  # whole and valid again
    assert repaired["id"] == good["id"] and repaired["winner"] == good["winner"]
    assert entries(cache) == [path] and C.stale_temp_files(cache) == []
    K.reset_caches()
    runs["n"] = 0
    op(x)
    assert runs["n"] == 1 and op.last_call.cache_hits == 1


def _load_kernel_module(tmp_path: Path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(f"""
        import triton
        import triton.language as tl
        from tests.kernels import block_configs, SLOW_MS

        @triton.autotune(configs=block_configs([16, 32, 64], slow={{16: SLOW_MS, 64: 2 * SLOW_MS}}), key=["n"])
        @triton.jit
        def bump_(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            {body}
        """))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.bump_


def test_changed_kernel_source_misses(tmp_path):
    cache = tmp_path / "c"
    store = "tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + {}, mask=mask)"
    v1 = _load_kernel_module(tmp_path, "bump_v1", store.format(1))
    v2 = _load_kernel_module(tmp_path, "bump_v2", store.format(2))
    x = ramp(64)
    op1, runs1 = counting_op(v1, cache)
    torch.testing.assert_close(op1(x), x + 1)
    op2, runs2 = counting_op(v2, cache)
    torch.testing.assert_close(op2(x), x + 2)
    assert runs1["n"] == runs2["n"] == 10  # same kernel name, key and configs: only the source differs
    ids = sorted(strict_json(p)["identity"]["code"]["functions"][0]["sha256"] for p in entries(cache))
    assert len(ids) == 2 and ids[0] != ids[1]
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    (stale,) = [e for e in events if e["event"] == "cache-stale"]  # v2 found v1's entry and said why it did not apply
    assert stale["reasons"] == ["the source of the kernel bump_ changed"] and stale["others"] == 0
    op1b, runs1b = counting_op(v1, cache)
    autotuner(v1).cache.clear()
    op1b(x)
    assert runs1b["n"] == 1  # the first version's entry is still there and still hits


def _bump_body(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@pytest.mark.parametrize("change", ["extra-config", "num_warps", "order"])
def test_changed_config_space_misses(tmp_path, change):
    cache = tmp_path / "c"
    base = K.block_configs([16, 32, 64], slow={16: K.SLOW_MS, 64: 2 * K.SLOW_MS})
    other = {"extra-config": base + K.block_configs([128], slow={128: K.SLOW_MS}),
             "num_warps": base[:2] + [triton.Config({"BLOCK": 64}, num_warps=8, pre_hook=base[2].pre_hook)],
             "order": base[::-1]}[change]
    first = triton.autotune(configs=base, key=["n"])(triton.jit(_bump_body))
    second = triton.autotune(configs=other, key=["n"])(triton.jit(_bump_body))
    x = ramp(64)
    op1, runs1 = counting_op(first, cache)
    op1(x)
    op2, runs2 = counting_op(second, cache)
    torch.testing.assert_close(op2(x), x + 1)
    # Only the config list changed: the key is re-tuned incrementally (test_incremental.py), timing the new
    # config (128, or 64 with 8 warps) and the anchors (the old winner 32 and the runner-up 16), 3 slots each.
    timed = {"extra-config": 3, "num_warps": 3, "order": 2}[change]
    assert runs1["n"] == 10 and runs2["n"] == timed * 3 + 1 and op2.last_call.cache_hits == 0
    assert chosen(second) == {(64, "torch.float32"): 32}
    assert len(entries(cache)) == 2


def test_config_hooks_are_part_of_the_identity_but_not_of_rank_agreement(tmp_path):
    # Same kernel, key and config parameters; the hooks run in the timed span, so they count.
    def configs(slow_block: int):
        slower = 64 if slow_block != 64 else 32
        return K.block_configs([16, 32, 64], slow={slow_block: K.SLOW_MS, slower: 2 * K.SLOW_MS})

    x = ramp(64)
    first = triton.autotune(configs=configs(16), key=["n"])(triton.jit(_bump_body))
    op1, runs1 = counting_op(first, tmp_path / "c")
    op1(x)
    other_hooks = triton.autotune(configs=configs(64), key=["n"])(triton.jit(_bump_body))
    op2, runs2 = counting_op(other_hooks, tmp_path / "c")
    op2(x)
    assert runs2["n"] == 10 and chosen(other_hooks) == {(64, "torch.float32"): 16}
    # New closures with the same code and captured values: the same entry.
    same_again = triton.autotune(configs=configs(16), key=["n"])(triton.jit(_bump_body))
    op3, runs3 = counting_op(same_again, tmp_path / "c")
    op3(x)
    assert runs3["n"] == 1 and chosen(same_again) == {(64, "torch.float32"): 32}
    a, b = (C.identity(autotuner(k), (64, "torch.float32"), autotuner(k).configs, 2, "max", "median")
            for k in (first, other_hooks))
    assert C.entry_id(a) != C.entry_id(b)
    assert C.agreement_identity(a) == C.agreement_identity(b)  # a rank's hooks may capture its own values


def test_retune_env_tunes_again_and_overwrites(tmp_path, monkeypatch):
    cache = tmp_path / "c"
    op, runs = counting_op(K.double_, cache)
    op(ramp(96))
    (path,) = entries(cache)
    inode = path.stat().st_ino
    K.reset_caches()
    monkeypatch.setenv("TRITON_CTX_TUNE_RETUNE", "1")
    runs["n"] = 0
    op(ramp(96))
    assert runs["n"] == 10 and op.last_call.cache_hits == 0
    assert entries(cache) == [path] and path.stat().st_ino != inode  # replaced by a new file
    C.read_entry(path)


@pytest.mark.parametrize("how", ["argument", "env"])
def test_disabled_cache_reads_and_writes_nothing(tmp_path, monkeypatch, how):
    cache = tmp_path / "c"
    if how == "env":
        monkeypatch.setenv("TRITON_CTX_TUNE_CACHE", "0")
        op, runs = counting_op(K.double_, cache)
    else:
        op, runs = counting_op(K.double_, cache, cache=False)
    for _ in range(2):
        K.reset_caches()
        op(ramp(96))
    assert runs["n"] == 20 and not cache.exists()


def test_unwritable_cache_dir_warns_and_tuning_still_works(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    op, runs = counting_op(K.double_, blocker)
    with pytest.warns(CacheWarning) as record:
        torch.testing.assert_close(op(ramp(96)), ramp(96) * 2)
    (message,) = [str(w.message) for w in record if issubclass(w.category, CacheWarning)]
    assert "could not write the tuning cache entry" in message and str(blocker) in message
    assert "TRITON_CTX_TUNE_CACHE_DIR" in message
    assert runs["n"] == 10 and chosen(K.double_) == {(96, "torch.float32"): 32}


def test_cache_options_and_default_directory(tmp_path, monkeypatch):
    with pytest.raises(InvalidOptionError, match="cache='yes'"):
        contextual_autotune(cache="yes")
    with pytest.raises(InvalidOptionError, match="cache_dir=3"):
        contextual_autotune(cache_dir=3)
    monkeypatch.delenv("TRITON_CTX_TUNE_CACHE_DIR")
    assert TuneOptions().resolved_cache_dir() == Path.home() / ".cache" / "triton_ctx_tune"
    monkeypatch.setenv("TRITON_CTX_TUNE_CACHE_DIR", str(tmp_path / "env"))
    assert TuneOptions().resolved_cache_dir() == tmp_path / "env"
    assert TuneOptions(cache_dir=tmp_path / "arg").resolved_cache_dir() == tmp_path / "arg"
    monkeypatch.setenv("TRITON_CTX_TUNE_CACHE", "0")
    assert TuneOptions().resolved_cache_dir() is None
    assert TuneOptions(cache=True).resolved_cache_dir() == tmp_path / "env"  # the argument wins


_WRITER = """
import json, sys, time
from pathlib import Path
from triton_ctx_tune.store import cache as C
directory, go, me, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
entries = [json.loads(Path(p).read_text()) for p in sys.argv[5:]]
while not go.exists():
    time.sleep(0.001)
for i in range(rounds):
    for e in entries:
        e["tuned"]["writer"] = me
        e["tuned"]["round"] = i
        e["tuned"]["padding"] = "x" * (1000 * (i % 7))  # sizes differ, so a torn write would show
        C.write_entry(directory, e)
print("done", me)
"""


def test_concurrent_writers_leave_whole_valid_files(tmp_path):
    cache = tmp_path / "c"
    op, _ = counting_op(K.double_, cache)
    op(ramp(96))
    op2, _ = counting_op(K.add_one_, cache)
    op2(ramp(96))
    seeds = [tmp_path / p.name for p in entries(cache)]
    for p, seed in zip(entries(cache), seeds):
        shutil.copy(p, seed)
    go = tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(cache), str(go), str(i), "150", *map(str, seeds)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(4)]
    time.sleep(0.5)
    go.touch()
    reads = 0
    while any(w.poll() is None for w in writers):
        for path in entries(cache):
            C.read_entry(path)  # raises on a torn or partial file
            reads += 1
    outs = [w.communicate(timeout=DEADLINE_S) for w in writers]
    assert all(w.returncode == 0 for w in writers), [o[1][-2000:] for o in outs]
    assert reads > 0
    final = [C.read_entry(p) for p in entries(cache)]
    assert len(final) == 2 and {e["tuned"]["round"] for e in final} == {149}
    assert C.stale_temp_files(cache) == []
    K.reset_caches()
    op3, runs = counting_op(K.double_, cache)
    op3(ramp(96))
    assert runs["n"] == 1  # the result still hits


# ---- several ranks --------------------------------------------------------------------------------


def run_cache_ranks(scenarios: list[str], out: Path, cache0: Path, cache1: Path | None = None,
                    world: int = 2) -> dict[str, list[dict]]:
    """torchrun `world` cache_worker ranks with a deadline; rank 1 gets cache1 when given."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < world:
        pytest.skip(f"needs {world} GPUs")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CTX_TUNE_QUIET="1", OMP_NUM_THREADS="1",
               TRITON_CTX_TUNE_LOG_DIR=str(out / "logs"))
    if gpus == 0:
        env.update(TRITON_INTERPRET="1", TRITON_CTX_TUNE_BACKEND="gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           str(ROOT / "tests" / "cache_worker.py"), "--out", str(out), "--cache-dir", str(cache0)]
    if cache1 is not None:
        cmd += ["--rank1-cache-dir", str(cache1)]
    try:
        proc = subprocess.run(cmd + scenarios, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ranks still running after {DEADLINE_S} s (a hang):\n{(e.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    return {name: [json.loads((out / f"{name}.rank{r}.json").read_text()) for r in range(world)]
            for name in scenarios}


@pytest.fixture(scope="module")
def three_jobs(tmp_path_factory):
    """The same 2-rank job three times: cold cache, warm cache, then with one entry truncated.

    Rank 1 has its own cache directory, which nobody writes: as if it ran on a node that does not
    share rank 0's file system.
    """
    base = tmp_path_factory.mktemp("three_jobs")
    cache0, cache1 = base / "cache0", base / "cache1"
    jobs = {"cold": run_cache_ranks(["tune"], base / "cold", cache0, cache1)}
    snapshot = {p.name: p.read_bytes() for p in entries(cache0)}
    jobs["warm"] = run_cache_ranks(["tune", "mismatch"], base / "warm", cache0, cache1)
    after_warm = {p.name: p.read_bytes() for p in entries(cache0)}
    damaged = next(p for p in entries(cache0)
                   if json.loads(p.read_text())["identity"]["key"] == "(64, 'torch.float32')")
    _truncate(damaged)
    jobs["damaged"] = run_cache_ranks(["tune"], base / "damaged", cache0, cache1)
    return dict(jobs=jobs, base=base, cache0=cache0, cache1=cache1, snapshot=snapshot, after_warm=after_warm,
                damaged=damaged)


def _ok(rows: list[dict]) -> None:
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["ok"], row


BLOCKS = {"(64, 'torch.float32')": 32, "(40, 'torch.float32')": 32}


def test_cold_job_tunes_and_only_rank0_writes(three_jobs):
    rows = three_jobs["jobs"]["cold"]["tune"]
    _ok(rows)
    assert [(r["executions"], r["body_runs"], r["cache_hits"], r["tuned"]) for r in rows] == [(10, 10, 0, 2)] * 2
    assert all(r["blocks"] == BLOCKS for r in rows)
    assert sorted(json.loads(v)["identity"]["key"] for v in three_jobs["snapshot"].values()) == [
        "(40, 'torch.float32')", "(64, 'torch.float32')"]
    assert all(json.loads(v)["identity"]["world"] == 2 for v in three_jobs["snapshot"].values())
    assert not three_jobs["cache1"].exists()  # rank 1 tuned too, but wrote nothing
    logs = three_jobs["base"] / "cold" / "logs"
    stores = {r: [json.loads(line)["event"] for line in (logs / f"rank-{r}.jsonl").read_text().splitlines()].count(
        "cache-store") for r in (0, 1)}
    assert stores == {0: 2, 1: 0}


def test_second_job_hits_on_every_rank_though_only_rank0_has_the_cache(three_jobs):
    rows = three_jobs["jobs"]["warm"]["tune"]
    _ok(rows)
    assert [(r["executions"], r["body_runs"], r["cache_hits"], r["tuned"]) for r in rows] == [(1, 1, 2, 0)] * 2
    assert all(r["blocks"] == BLOCKS for r in rows)
    assert three_jobs["after_warm"] == three_jobs["snapshot"]  # hits rewrite nothing
    assert not three_jobs["cache1"].exists()


def test_ranks_looking_up_different_entries_raise_the_mismatch_error(three_jobs):
    rows = three_jobs["jobs"]["warm"]["mismatch"]
    assert {r.get("error_type") for r in rows} == {"RankMismatchError"}
    assert len({r["error"] for r in rows}) == 1
    msg = rows[0]["error"]
    assert "ranks [0]: cache lookup of _cached_add_one key=(24, 'torch.float32')" in msg
    assert "ranks [1]: cache lookup of _cached_add_one key=(32, 'torch.float32')" in msg


def test_truncated_entry_is_retuned_repaired_and_reported_by_rank0(three_jobs):
    rows = three_jobs["jobs"]["damaged"]["tune"]
    _ok(rows)
    # One key hit, the damaged one was tuned again: its 9 slots, then the final run.
    assert [(r["executions"], r["cache_hits"], r["tuned"]) for r in rows] == [(10, 1, 1)] * 2
    assert all(r["blocks"] == BLOCKS for r in rows)
    damaged = three_jobs["damaged"]
    (warning,) = rows[0]["warnings"]
    assert str(damaged) in warning and "is not valid JSON" in warning
    assert rows[1]["warnings"] == []  # rank 1 never reads the cache
    repaired = C.read_entry(damaged)
    assert repaired["winner"]["config"].startswith("BLOCK=32,") and repaired["identity"]["world"] == 2
    assert repaired["id"] == json.loads(three_jobs["snapshot"][damaged.name])["id"]
    untouched = {p.name: p.read_bytes() for p in entries(three_jobs["cache0"]) if p != damaged}
    assert untouched == {k: v for k, v in three_jobs["snapshot"].items() if k != damaged.name}


def test_other_world_size_misses(three_jobs, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(three_jobs["cache0"], cache)
    op = W.make_op(str(cache), is_dist=False)  # the same kernel, keys and configs, in a world of 1
    x, y = ramp(64), ramp(40)
    gx, gy = op(x, y)
    assert torch.equal(gx, x + 1) and torch.equal(gy, y + 1)
    assert op.calls["n"] == 10 and op.last_call.cache_hits == 0
    assert sorted(strict_json(p)["identity"]["world"] for p in entries(cache)) == [1, 1, 2, 2]
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    # The ranks ran cache_worker as __main__, so its hook lambdas' digests name another module: the
    # hooks differ too. What matters is the world size, named for both keys.
    stale = [(e["key"], [r for r in e["reasons"] if "hook" not in r]) for e in events if e["event"] == "cache-stale"]
    assert stale == [([64, "torch.float32"], ["world size 2 -> 1"]), ([40, "torch.float32"], ["world size 2 -> 1"])]


def test_report_on_two_rank_logs_shows_the_spread_over_ranks(three_jobs, capsys):
    from triton_ctx_tune.tools.cli import main

    assert main(["report", str(three_jobs["base"] / "cold" / "logs")]) == 0
    out = capsys.readouterr().out
    assert "(ranks 0, 1)" in out
    assert out.count("chosen     #1 {BLOCK=32, num_warps=4, num_stages=3}") == 2
    assert "(median, max over 2 ranks)" in out
    assert out.count("runner-up  #0 {BLOCK=16, num_warps=4, num_stages=3}") == 2
    assert out.count("per rank   winner: rank 0 ") == 2 and ", rank 1 " in out and "spread" in out
    assert out.count("decided after 9 executions") == 2
    assert main(["report", str(three_jobs["base"] / "warm" / "logs")]) == 0
    out = capsys.readouterr().out
    assert out.count("[from the tuning cache, tuned ") == 2 and "none in this run (cache hit)" in out
