"""Two nodes on one machine: two torchrun processes (--nnodes 2, static rendezvous on 127.0.0.1), each
with its own Triton cache, tuning cache and log dir, as separate machines would have, over gloo.

What a multi-node job relies on, checked with real values: every rank of both nodes ends with the same
winners, chosen from all ranks' timings; the precompile split is per node (by LOCAL_RANK), so each node
compiles every config between its own ranks; and the persistent cache is global rank 0's alone, so a
damaged or conflicting file on another node's disk changes nothing.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from triton_ctx_tune.store.cache import read_entry, write_json_atomically

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 300
KEY = "(96, 'torch.float32')"
CONFIGS = {"_add_one": 4, "_double": 3}
# _add_one: 64, because BLOCK 32 is slow on the job's last rank (node 1) alone; _double: 32 everywhere.
WINNERS = {"_add_one": {KEY: 64}, "_double": {KEY: 32}}
STEPS = 4 * (1 + 3) + 1  # the larger key's configs x (n_warmup + n_repeat) slots, then the final run


@dataclass
class Node:
    rank: int
    root: Path

    @property
    def triton_cache(self) -> Path:
        return self.root / "triton-cache"

    @property
    def tune_cache(self) -> Path:
        return self.root / "tune-cache"

    def logs(self, run: str) -> Path:
        return self.root / f"logs-{run}"  # one per run: a rank's log is appended to across runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(nodes: list[Node], per_node: int, out: Path, deadline_s: float = DEADLINE_S) -> list[dict]:
    """Start one torchrun per node and wait for both; past the deadline kill both process groups and fail."""
    if torch.cuda.is_available():
        pytest.skip("simulates nodes on the CPU (gloo, the interpreter)")
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    procs = []
    for node in nodes:
        for d in (node.triton_cache, node.tune_cache, node.logs(out.name)):
            d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CTX_TUNE_QUIET="1", OMP_NUM_THREADS="1",
                   TRITON_INTERPRET="1", TRITON_CACHE_DIR=str(node.triton_cache),
                   TRITON_CTX_TUNE_CACHE_DIR=str(node.tune_cache), TRITON_CTX_TUNE_LOG_DIR=str(node.logs(out.name)))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)), "--node_rank",
               str(node.rank), "--nproc_per_node", str(per_node), "--master_addr", "127.0.0.1", "--master_port",
               str(port), str(ROOT / "tests" / "multinode_worker.py"), "--out", str(out)]
        # Output to files, not pipes: nobody reads a pipe while the other node runs, and a full one would hang it.
        with open(node.root / "stdout.txt", "w") as stdout, open(node.root / "stderr.txt", "w") as stderr:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=stdout, stderr=stderr,
                                          start_new_session=True))
    end = time.monotonic() + deadline_s
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < end:
            if any(p.returncode not in (None, 0) for p in procs):
                break  # one node failed: the other would wait for it until its own timeouts
            time.sleep(0.2)
    finally:
        hung = [p for p in procs if p.poll() is None]
        for p in hung:
            os.killpg(p.pid, signal.SIGKILL)  # torchrun and its ranks, which share its session
            p.wait()
    tails = "\n".join(f"--- node {n.rank} (rc {p.returncode}) ---\n{(n.root / 'stderr.txt').read_text()[-3000:]}"
                      for n, p in zip(nodes, procs))
    if hung and time.monotonic() >= end:
        pytest.fail(f"nodes still running after {deadline_s} s (a hang):\n{tails}")
    assert all(p.returncode == 0 for p in procs), tails
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(len(nodes) * per_node)]


def _entries(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file()) if directory.exists() else []


def _no_errors(rows: list[dict]) -> None:
    for row in rows:
        assert "error" not in row, row.get("traceback")


# 2 nodes x 2 ranks, and x 4: 8 gloo ranks on the CPU.
@pytest.fixture(scope="module", params=[2, 4], ids=["2x2ranks", "2x4ranks"])
def job(request, tmp_path_factory):
    """Run 1 from empty caches; then plant a damaged and a conflicting entry on node 1's disk; run 2."""
    per_node = request.param
    base = tmp_path_factory.mktemp(f"multinode{per_node}")
    nodes = [Node(i, base / f"node{i}") for i in range(2)]
    first = run_job(nodes, per_node, base / "run1")
    node1_after_first = _entries(nodes[1].tune_cache)
    stored = {read_entry(p)["identity"]["kernel"]: p for p in _entries(nodes[0].tune_cache)}
    planted = {}
    if set(stored) == set(CONFIGS):
        # Conflicting: node 0's own _add_one entry, well formed, naming BLOCK 32 (#1) as its winner.
        conflict = json.loads(stored["_add_one"].read_text())
        conflict["winner"] = {"index": 1, "config": conflict["timings"][1]["config"]}
        write_json_atomically(nodes[1].tune_cache / stored["_add_one"].name, conflict)
        # Damaged: node 0's _double entry cut in half, as a crash mid-copy would leave it.
        text = stored["_double"].read_text()
        (nodes[1].tune_cache / stored["_double"].name).write_text(text[: len(text) // 2])
        planted = {p.name: p.read_bytes() for p in _entries(nodes[1].tune_cache)}
    second = run_job(nodes, per_node, base / "run2")
    return {"per_node": per_node, "nodes": nodes, "first": first, "second": second, "stored": stored,
            "planted": planted, "node1_after_first": node1_after_first}


def test_every_rank_of_both_nodes_ends_with_the_same_winners(job):
    per_node, rows = job["per_node"], job["first"]
    world = 2 * per_node
    _no_errors(rows)
    assert [(r["rank"], r["node"], r["local_rank"], r["local_world"], r["world"]) for r in rows] == [
        (g, g // per_node, g % per_node, per_node, world) for g in range(world)]
    assert all(r["ok"] for r in rows)  # the function's own all_reduce spanned both nodes
    assert [r["winners"] for r in rows] == [WINNERS] * world
    assert [r["executions"] for r in rows] == [STEPS] * world
    # Each decision reduced every rank's times: node 1's last rank made 64 beat 32.
    assert all(r["decisions"] == {"_add_one": {"winner": 2, "per_rank": world},
                                  "_double": {"winner": 1, "per_rank": world}} for r in rows)


def test_each_node_compiles_every_config_split_between_its_own_ranks(job):
    per_node, rows = job["per_node"], job["first"]
    _no_errors(rows)
    for r in rows:
        assert r["precompiled"] == {k: [i for i in range(n) if i % per_node == r["local_rank"]]
                                    for k, n in CONFIGS.items()}
    for node in (0, 1):
        mine = [r["precompiled"] for r in rows if r["node"] == node]
        for kernel, n in CONFIGS.items():
            shares = [m[kernel] for m in mine]
            assert sorted(sum(shares, [])) == list(range(n))  # every config once per node
    # Split by global rank, node 1's first rank would compile config `per_node` alone (or nothing).
    assert rows[per_node]["precompiled"] == rows[0]["precompiled"]


def test_only_global_rank_0_writes_the_persistent_cache(job):
    rows = job["first"]
    _no_errors(rows)
    assert sorted(job["stored"]) == sorted(CONFIGS)  # one entry per kernel, on node 0's disk
    assert job["node1_after_first"] == []
    assert rows[0]["cache_events"] == ["cache-store"]
    assert all(r["cache_events"] == [] for r in rows[1:])
    assert all(r["warnings"] == [] for r in rows)
    for kernel, path in job["stored"].items():
        entry = read_entry(path)
        assert entry["identity"]["world"] == len(rows)
        assert entry["winner"]["config"].startswith(f"BLOCK={WINNERS[kernel][KEY]},")
        # rank 0 stored every rank's time, node 1's included
        assert all(len(t["per_rank_ms"]) == len(rows) for t in entry["timings"])


def test_a_damaged_or_conflicting_entry_on_node_1_changes_nothing(job):
    nodes, rows = job["nodes"], job["second"]
    _no_errors(rows)
    planted = job["planted"]
    assert len(planted) == 2
    # The planted conflict is a well-formed entry: had node 1's ranks read it, they would run BLOCK 32.
    conflict = read_entry(nodes[1].tune_cache / job["stored"]["_add_one"].name)
    assert conflict["winner"] == {"index": 1, "config": conflict["timings"][1]["config"]}
    assert conflict["winner"]["config"].startswith("BLOCK=32,")
    world = len(rows)
    assert [r["winners"] for r in rows] == [WINNERS] * world
    assert [(r["cache_hits"], r["executions"]) for r in rows] == [(2, 1)] * world  # hits, run once, no tuning
    assert [r["warnings"] for r in rows] == [[]] * world  # node 1 never read its damaged file
    assert rows[0]["cache_events"] == ["cache-hit"]
    assert all(r["cache_events"] == ["cache-hit"] for r in rows[1:])  # rank 0's answer, logged on every rank
    assert {p.name: p.read_bytes() for p in _entries(nodes[1].tune_cache)} == planted  # nor wrote over it
