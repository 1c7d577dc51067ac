"""Quarantine (quarantine.py): a config that killed the process is skipped by the next run, and said so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, crash: str | None, world: int = 0, crash_rank: int = 0,
         **extra: str) -> subprocess.CompletedProcess:
    """The worker in a fresh process (world=0), or on `world` gloo ranks through torchrun; TRITON_INTERPRET
    comes from conftest on a machine without a GPU."""
    env = dict(os.environ, TRITON_CTX_TUNE_CACHE_DIR=str(tmp_path / "cache"),
               TRITON_CTX_TUNE_LOG_DIR=str(tmp_path / "logs"),
               TRITON_CTX_TUNE_QUIET="0", PYTHONPATH=str(ROOT), CRASH_RANK=str(crash_rank), OMP_NUM_THREADS="1",
               QUARANTINE_OUT=str(tmp_path))
    env.pop("CRASH_BLOCK", None)
    env.update(extra)
    if crash:
        env["CRASH_BLOCK"] = crash
    worker = str(ROOT / "tests" / "quarantine_worker.py")
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", worker]
           if world else [sys.executable, worker])
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _rows(tmp_path: Path, world: int) -> list[dict]:
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def _events(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]


def test_a_config_that_kills_the_process_is_skipped_by_the_next_run(tmp_path):
    first = _run(tmp_path, crash="32")
    assert first.returncode == 3, first.stderr[-3000:]  # died inside BLOCK 32's slot
    (record,) = list((tmp_path / "cache-quarantine").glob("inflight-rank0-pid*.json"))
    assert json.loads(record.read_text())["config"].startswith("BLOCK=32,")

    # Same environment: if the next run tried BLOCK 32 again, it would die again.
    second = _run(tmp_path, crash="32")
    assert second.returncode == 0, second.stderr[-3000:]
    result = json.loads(second.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["chosen"] == {"(64, 'torch.float32')": 16}  # 32 would have won
    assert "skipping quarantined configs #1" in second.stderr and "died while running it" in second.stderr
    events = _events(tmp_path)
    (recovered,) = [e for e in events if e["event"] == "quarantine-recovered"]
    assert recovered["index"] == 1 and recovered["config"].startswith("BLOCK=32,")
    (skipped,) = [e for e in events if e["event"] == "quarantine"]
    assert list(skipped["configs"]) == ["1"]
    (decision,) = [e for e in events if e["event"] == "decision"]
    assert decision["winner"] == 0 and decision["reduced"][1] in (None, float("inf"))
    assert not list((tmp_path / "cache-quarantine").glob("inflight-*"))

    # And every later run: the quarantine list persists, with no new crash needed.
    third = _run(tmp_path, crash="32")
    assert third.returncode == 0 and json.loads(third.stdout.strip().splitlines()[-1])["chosen"] == {
        "(64, 'torch.float32')": 16}


def test_a_run_that_completes_leaves_no_record_and_quarantines_nothing(tmp_path):
    done = _run(tmp_path, crash=None)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["chosen"] == {"(64, 'torch.float32')": 32}
    assert list((tmp_path / "cache-quarantine").glob("*")) == []


def test_with_two_ranks_a_config_that_killed_rank_1_is_skipped_by_both(tmp_path):
    if _gpus() == 1:
        pytest.skip("needs 2 GPUs or none")
    first = _run(tmp_path, crash="32", world=2, crash_rank=1)
    assert first.returncode != 0
    (record,) = list((tmp_path / "cache-quarantine").glob("inflight-rank1-pid*.json"))
    assert json.loads(record.read_text())["config"].startswith("BLOCK=32,")
    # Rank 0 has a record too only if the launcher killed it mid-launch (README: such a rank cannot be
    # told from one that crashed), and then of the config it was running, which is not BLOCK 32 there.
    innocent = [json.loads(p.read_text())["config"] for p in (tmp_path / "cache-quarantine").glob("inflight-rank0-*")]
    assert all(not c.startswith("BLOCK=32,") for c in innocent)
    second = _run(tmp_path, crash="32", world=2, crash_rank=1)
    assert second.returncode == 0, second.stderr[-3000:]
    rows = _rows(tmp_path, 2)
    assert [r["rank"] for r in rows] == [0, 1]
    # Only rank 1 has the record; the gathered quarantine makes rank 0 skip BLOCK 32 too.
    expected = 16 if not innocent else 64
    assert all(r["ok"] and r["chosen"] == {"(64, 'torch.float32')": expected} for r in rows)
    assert len({r["executions"] for r in rows}) == 1
    assert "rank 1: quarantined" in second.stderr


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_a_hung_slot_ends_its_process_naming_the_config_which_the_next_run_skips(tmp_path):
    start = time.monotonic()
    hung = _run(tmp_path, crash=None, HANG_BLOCK="32", TRITON_CTX_TUNE_SLOT_TIMEOUT="2")
    assert hung.returncode == 124, hung.stderr[-3000:]
    assert time.monotonic() - start < 120  # not the hour the kernel would take
    assert ("SlotHangError: rank 0: kernel add_one_, key (64, 'torch.float32'), config {BLOCK=32, num_warps=4"
            in hung.stderr)
    assert "has run for more than 2 s" in hung.stderr
    second = _run(tmp_path, crash=None, HANG_BLOCK="32", TRITON_CTX_TUNE_SLOT_TIMEOUT="2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads(second.stdout.strip().splitlines()[-1])["chosen"] == {"(64, 'torch.float32')": 16}
    assert "skipping quarantined configs #1" in second.stderr


def test_a_slot_hung_on_rank_1_ends_the_job_promptly_and_both_ranks_skip_it_next_time(tmp_path):
    if _gpus() == 1:
        pytest.skip("needs 2 GPUs or none")
    start = time.monotonic()
    hung = _run(tmp_path, None, world=2, crash_rank=1, HANG_BLOCK="32", TRITON_CTX_TUNE_SLOT_TIMEOUT="2")
    assert hung.returncode != 0
    assert time.monotonic() - start < 120  # neither the hour-long kernel nor a collective's default deadline
    assert "SlotHangError: rank 1: kernel add_one_, key (64, 'torch.float32'), config {BLOCK=32" in hung.stderr
    second = _run(tmp_path, None, world=2, crash_rank=1, HANG_BLOCK="32", TRITON_CTX_TUNE_SLOT_TIMEOUT="2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert all(r["ok"] and r["chosen"] == {"(64, 'torch.float32')": 16} for r in _rows(tmp_path, 2))


def test_the_ranks_waiting_for_a_hung_one_name_the_slots_it_may_hang_in(tmp_path):
    if _gpus() == 1:
        pytest.skip("needs 2 GPUs or none")
    # The other ranks' collective deadline (5 s) runs out before the hung rank's slot watchdog (20 s).
    hung = _run(tmp_path, None, world=2, crash_rank=1, HANG_BLOCK="32", TRITON_CTX_TUNE_SLOT_TIMEOUT="20",
                TRITON_CTX_TUNE_TIMEOUT="5")
    assert hung.returncode != 0
    assert "CollectiveTimeoutError: rank 0 of 2" in hung.stderr
    # The step that met the key ran, on each rank, the config that rank compiled first: all are named.
    suspects = hung.stderr.split("a rank hung in one of them is the likely cause: ", 1)[1].split("\n", 1)[0]
    assert "add_one_ key=(64, 'torch.float32') config#1 {BLOCK=32" in suspects


@pytest.mark.gpu
def test_a_real_device_side_assert_is_quarantined_and_skipped_by_the_next_process(tmp_path):
    first = _run(tmp_path, crash=None, DEVICE_ASSERT="1")
    assert first.returncode != 0, first.stdout[-2000:]  # the assert ended the CUDA context, and the process
    (record,) = list((tmp_path / "cache-quarantine").glob("inflight-rank0-pid*.json"))
    assert json.loads(record.read_text())["config"].startswith("BLOCK=32,")
    second = _run(tmp_path, crash=None, DEVICE_ASSERT="1")
    assert second.returncode == 0, second.stderr[-3000:]
    result = json.loads(second.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["chosen"] == {"(64, 'torch.float32')": 16}  # 32 would have won
    assert "skipping quarantined configs #1" in second.stderr



def test_only_a_configs_first_launch_is_noted_and_waited_for(tmp_path, monkeypatch):
    """Faults and hangs show in a config's first launch; its later slots run without the note (and, on
    a GPU, without the synchronize that would stall the host after every slot)."""
    import torch

    from tests.kernels import DEVICE, double_, grid
    from triton_ctx_tune import contextual_autotune
    from triton_ctx_tune.store.quarantine import Quarantine

    noted: list[int] = []
    begin = Quarantine.begin

    def spy(self: Quarantine, key_id: str, kernel: str, key: tuple, index: int, config: str) -> None:
        noted.append(index)
        begin(self, key_id, kernel, key, index, config)

    monkeypatch.setattr(Quarantine, "begin", spy)
    op = contextual_autotune(n_warmup=1, n_repeat=3, early_stop=False, cache=False, quarantine=True)(
        lambda x: double_[grid(x.numel())](x, x.numel()))
    op(torch.ones(64, device=DEVICE))
    assert op.last_call.executions == 3 * 4 + 1  # 3 configs x (1 warm-up + 3 timed slots), the final run
    assert sorted(noted) == [0, 1, 2]  # (the first step runs whichever config compiled first)
    assert list((tmp_path / "cache-quarantine").glob("inflight-*")) == []



def test_the_slot_watchdog_ends_with_its_call(tmp_path, monkeypatch):
    """One watchdog per call used to patrol for the rest of the process: one more daemon thread after
    every tuning call, all still running into the interpreter's finalization."""
    import threading

    import torch

    from tests.kernels import DEVICE, double_, grid
    from triton_ctx_tune import contextual_autotune
    from triton_ctx_tune.runtime.collectives import Collectives
    from triton_ctx_tune.store import quarantine

    def watchdogs() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "ctx-tune-slot-watchdog" and t.is_alive()]

    during: list[int] = []
    begin = quarantine.Quarantine.begin

    def spy(self, *args) -> None:
        begin(self, *args)
        during.append(len(watchdogs()))

    monkeypatch.setattr(quarantine.Quarantine, "begin", spy)
    for _ in range(2):
        op = contextual_autotune(n_warmup=1, n_repeat=1, early_stop=False, cache=False, quarantine=True,
                                 slot_timeout_s=600.0)(lambda x: double_[grid(x.numel())](x, x.numel()))
        op(torch.ones(64, device=DEVICE))
        assert during and during[-1] == 1  # the call's slots were watched
        assert watchdogs() == [] and not quarantine._watchdogs  # stopped and joined at the call's end
    # One whose call never closed (an online session left unfinished) is stopped by the atexit hook.
    q = quarantine.Quarantine(tmp_path / "q", 0, Collectives(is_dist=False), slot_timeout_s=600.0)
    q._watch({"kernel": "k", "key": "()", "config": "c"})
    assert len(watchdogs()) == 1
    quarantine._stop_watchdogs()
    assert watchdogs() == [] and not quarantine._watchdogs
