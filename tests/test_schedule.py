"""The schedule holds at any world size: randomized multi-rank programs never hang and never diverge.

Schedules are drawn from a seeded generator (the seed and the count are below; the long soak's are in
docs/reliability.md). Each world size runs its schedules in one torchrun job with a deadline. For every
schedule the test asserts: every rank logged the same sequence of the tuner's collective headers, ended
with the same winners (or the same error), ran one execution per call online, and changed the in-place
state once per call. Every rank exits with code 0.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_dist import ROOT, _gpus

SEED = int(os.environ.get("TRITON_CTX_TUNE_SCHEDULE_SEED", "20261125"))
# Schedules per world size in CI (at least 200 in all); the soak sets TRITON_CTX_TUNE_SCHEDULES.
COUNTS = {2: 80, 3: 50, 4: 50, 8: 20}
SCALE = float(os.environ.get("TRITON_CTX_TUNE_SCHEDULES", "1"))


def generate(rng: random.Random, world: int, sid: int) -> dict[str, Any]:
    driver = rng.choice(["reexec", "online"])
    space = driver == "reexec" and rng.random() < 0.2
    keys = []
    for k in range(rng.randint(1, 4)):
        n_configs = rng.randint(1, 9)
        keys.append({
            "n": 8 + 8 * k,
            "configs": n_configs,
            "launches": rng.randint(0, 3),
            "first_call": 1 if rng.random() < 0.2 else 0,  # a key first met in a later call
            "costs": [rng.choice([0.0, 0.0, 1.0, 2.0, 5.0]) for _ in range(n_configs)],
            "fail": [rng.randrange(world), rng.randrange(n_configs)] if n_configs > 1 and rng.random() < 0.25 else None,
            "slow_rank": rng.randrange(world) if rng.random() < 0.3 else None,
            "scale": rng.choice([0.5, 2.0, 10.0]),
            "delay_rank": rng.randrange(world) if rng.random() < 0.3 else None,
            "delay_ms": rng.choice([5.0, 30.0]),
        })
    # Key 0 runs from the first call: a function that launches nothing in its first (watched) call is not
    # known to write in place, and a later call that becomes a tuning call midway then stops with
    # StateNotRestorableError (its unwatched first execution cannot be undone): right, but no schedule to test.
    keys[0]["first_call"] = 0
    keys[0]["launches"] = max(keys[0]["launches"], 1)
    # A budgeted search (engine/budget.py) in some re-execution schedules, drawn from a generator of its own so
    # that every other draw, and so every earlier seed's schedules, stay as they were.
    budget = random.Random(sid * 7919 + world).choice([None, None, None, "4 executions", "7 executions",
                                                       "2 compiles", "3 compiles", 0.05])
    # Re-executing, a config whose compile is slow on one rank (precompile's compile-only launch sleeps there),
    # past the grace a step's end waits: its key's compiles are deferred (schedule.py, 6). Not online, where calls
    # never wait for compiles and 60 calls can end before one does. A generator of its own, as above.
    slow = random.Random(sid * 104729 + world)
    for k in keys:
        k["compile_delay"] = ([slow.randrange(world), slow.randrange(k["configs"]), slow.choice([100.0, 600.0])]
                              if slow.random() < 0.3 and driver == "reexec" else None)
    return {"id": sid, "world": world, "driver": driver, "space": space, "keys": keys,
            "budget": budget if driver == "reexec" else None,
            "split": rng.random() < 0.7, "precompile": rng.random() < 0.5,
            "early_stop": rng.choice([None, None, False]),
            "n_warmup": rng.randint(0, 2), "n_repeat": rng.randint(1, 3),
            # re-execution: 3 calls, since a key met first in call 1 of a function that writes in place is
            # deferred to the next call (exactly_once.py) and tuned there
            "calls": 60 if driver == "online" else 3,
            "min_calls": 2, "point_costs": [rng.choice([1.0, 3.0]), rng.choice([1.0, 3.0])]}


def schedules(world: int, count: int, seed: int = SEED) -> list[dict[str, Any]]:
    rng = random.Random(seed * 31 + world)
    return [generate(rng, world, i) for i in range(count)]


def _torchrun(world: int, out: Path, what: str, deadline_s: float) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CTX_TUNE_QUIET="1", OMP_NUM_THREADS="1",
               TRITON_INTERPRET="1", TRITON_CTX_TUNE_BACKEND="gloo", TRITON_CTX_TUNE_TIMEOUT="120",
               CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           str(ROOT / "tests" / "schedule_worker.py"), "--out", str(out), what]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired as e:
        where = {p.name: p.read_text() for p in (out / "progress").glob("rank*")}
        pytest.fail(f"a hang: ranks still running after {deadline_s} s; schedule per rank {where}\n"
                    f"{(e.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0, f"a rank did not exit with code 0:\n{proc.stderr[-6000:]}"
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]


def run(world: int, items: list[dict[str, Any]], out: Path, deadline_s: float) -> list[list[dict[str, Any]]]:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "schedules.json"
    path.write_text(json.dumps(items))
    _torchrun(world, out, str(path), deadline_s)
    return [json.loads((out / f"schedules.rank{r}.json").read_text()) for r in range(world)]


def headers(log_dir: Path, rank: int) -> list[tuple]:
    path = log_dir / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [(e["seq"], e["tuning_call"], e["step"], e["op"], e["what"], e["shape"])
            for e in events if e["event"] == "collective"]


def check(world: int, items: list[dict[str, Any]], rows: list[list[dict[str, Any]]], out: Path) -> int:
    """Assert every property for every schedule; the number of collective headers compared."""
    compared = 0
    for s, per_rank in zip(items, zip(*rows)):
        what = f"schedule {s['id']} ({json.dumps(s)})"
        seqs = [headers(out / f"logs-{s['id']}", r) for r in range(world)]
        assert all(q == seqs[0] for q in seqs), f"{what}: ranks logged different collective sequences"
        compared += len(seqs[0])
        errors = {(r.get("error_type"), r.get("error", "").split("\n")[0][:80]) for r in per_rank}
        assert len({e[0] for e in errors}) == 1, f"{what}: ranks ended differently: {errors}"
        if per_rank[0].get("error_type") is not None:
            # Only a key whose every config failed somewhere may end a schedule, and the same way everywhere.
            assert per_rank[0]["error_type"] == "NoValidConfigError", f"{what}: {per_rank[0]['traceback']}"
            continue
        assert all(r["winners"] == per_rank[0]["winners"] for r in per_rank), f"{what}: different winners"
        tuned = [k for k in s["keys"] if k["launches"] and k["configs"] > 1]
        assert len(per_rank[0]["winners"]) >= len(tuned), f"{what}: keys left untuned {per_rank[0]['winners']}"
        for r in per_rank:
            if s["driver"] == "online":
                assert set(r["executions"]) == {1}, f"{what}: an online call re-executed: {r['executions']}"
                assert not r["online_open"], f"{what}: online tuning did not finish in {s['calls']} calls"
            if r["state_ok"] is not None:
                assert all(r["state_ok"]), f"{what}: the in-place state changed more than once per call: {r['state']}"
    return compared


@pytest.mark.dist
@pytest.mark.parametrize("world", sorted(COUNTS))
def test_random_schedules_never_hang_and_never_diverge(world, tmp_path):
    if _gpus():
        pytest.skip("runs on gloo ranks on the CPU (the interpreter)")
    count = max(1, int(COUNTS[world] * SCALE))
    items = schedules(world, count)
    # About 0.4 s a schedule at 2 ranks and 2.5 s at 8 on 2 cores: the deadline is several times that.
    rows = run(world, items, tmp_path, deadline_s=120 + 3 * count * max(world / 2, 1))
    compared = check(world, items, rows, tmp_path)
    assert compared > 0


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 8])
def test_a_rank_that_skips_a_step_ends_every_rank_with_the_named_error_in_seconds(world, tmp_path):
    if _gpus():
        pytest.skip("runs on gloo ranks on the CPU (the interpreter)")
    _torchrun(world, tmp_path, "mismatch", deadline_s=240)
    rows = [json.loads((tmp_path / f"mismatch.rank{r}.json").read_text()) for r in range(world)]
    for r, row in enumerate(rows):
        assert row["error_type"] == "ScheduleMismatchError", row
        assert row["seconds"] < 5.0, row  # the whole call, tuning included: never the 300 s deadline
        assert row["x"] == 0.0, row  # the in-place kernel's tensor is as the call found it
        # Both sides are named: the ranks at step 2's end and the one already at step 3's.
        assert f"rank {r}: ranks were about to issue different collectives" in row["error"]
        others = "rank 0" if world == 2 else "ranks " + ", ".join(map(str, range(world - 1)))
        lines = row["error"].splitlines()
        assert any(ln.startswith(f"  {others}: ") and "step 2, ending step 2" in ln for ln in lines), row["error"]
        assert any(ln.startswith(f"  rank {world - 1}: ") and "step 3, ending step 3" in ln for ln in lines), \
            row["error"]


# Schedules the soak found wrong, kept as they were drawn (the generator may change; these must not).
# Seed 61, schedule 75 at 4 ranks: a function space whose 0.05 s call budget ran out at the first step's end, in
# a split screening, where key 0's config 0 had run on rank 0 only and fails on rank 1: the forced decision took
# it, rank 1's final run raised OutOfResources and left while the others went on. A forced winner must have run
# on every rank (decisions._forced_pick: else one lockstep round first).
REGRESSIONS = [{
    'id': 75, 'world': 4, 'driver': 'reexec', 'space': True, 'budget': 0.05, 'split': True, 'precompile': True,
    'early_stop': False, 'n_warmup': 1, 'n_repeat': 2, 'calls': 3, 'min_calls': 2, 'point_costs': [3.0, 1.0],
    'keys': [
        {'n': 8, 'configs': 3, 'launches': 3, 'first_call': 0, 'costs': [1.0, 0.0, 0.0], 'fail': [1, 0],
         'slow_rank': None, 'scale': 10.0, 'delay_rank': None, 'delay_ms': 5.0, 'compile_delay': None},
        {'n': 16, 'configs': 9, 'launches': 0, 'first_call': 0,
         'costs': [0.0, 2.0, 1.0, 0.0, 0.0, 5.0, 0.0, 1.0, 0.0], 'fail': [2, 5], 'slow_rank': None, 'scale': 10.0,
         'delay_rank': 2, 'delay_ms': 30.0, 'compile_delay': None},
        {'n': 24, 'configs': 1, 'launches': 1, 'first_call': 0, 'costs': [5.0], 'fail': None, 'slow_rank': None,
         'scale': 2.0, 'delay_rank': None, 'delay_ms': 5.0, 'compile_delay': [3, 0, 600.0]},
        {'n': 32, 'configs': 5, 'launches': 3, 'first_call': 1, 'costs': [2.0, 1.0, 5.0, 1.0, 0.0], 'fail': [0, 2],
         'slow_rank': 1, 'scale': 2.0, 'delay_rank': None, 'delay_ms': 5.0, 'compile_delay': [0, 1, 600.0]},
    ]}]


@pytest.mark.dist
def test_schedules_the_soak_found_wrong_stay_right(tmp_path):
    if _gpus():
        pytest.skip("runs on gloo ranks on the CPU (the interpreter)")
    for world in sorted({s["world"] for s in REGRESSIONS}):
        items = [s for s in REGRESSIONS if s["world"] == world]
        rows = run(world, items, tmp_path / f"w{world}", deadline_s=240)
        assert check(world, items, rows, tmp_path / f"w{world}") > 0
