"""Quarantine: a config that killed the process while it ran is never tried again.

Before a config's first launch (session.py notes no later one: a config that faults or hangs on
these shapes does so there) a rank writes what is about to run (kernel, key identity, config)
to its own *in-flight* file, atomically; once the launch has completed (on a GPU: after a
synchronize, so an asynchronous fault is charged to the launch that caused it) the file is
removed. A process that dies in between (an illegal memory access, a device-side assert, a
segfault, os._exit) leaves the file behind. The next tuning call of that rank finds it, moves
the config onto the rank's quarantine list and says so. Files are per rank, in a folder beside the
cache directory (`<cache dir>-quarantine`: the cache itself stays rank 0's alone); nodes need not share a
file system, because each rank reads only its own file and
the ranks then share what they found through the collectives, so every rank skips the same configs.

A slot that runs past `slot_timeout_s` (a hung kernel) cannot be interrupted; a watchdog thread
names its kernel, key and config on stderr and ends the process with the note in place, so the
config is quarantined too, and the other ranks' bounded collectives end instead of waiting on NCCL.
The watchdog lives from a call's first noted slot to the end of that call (close()), and an atexit
hook stops any still running (an online session never finished), so none is left for the
interpreter's finalization.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import re
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CacheWarning, SlotHangError
from ..runtime.collectives import Collectives


@dataclass(frozen=True)
class Quarantined:
    config: str
    reason: str


class Quarantine:
    def __init__(self, directory: Path, rank: int, comm: Collectives, slot_timeout_s: float = math.inf) -> None:
        self.directory = directory
        self.slot_timeout_s = slot_timeout_s
        self._running: tuple[dict[str, Any], float] | None = None  # the noted slot and its deadline
        self._watchdog: threading.Thread | None = None
        self._stop_watchdog = threading.Event()
        self.rank = rank
        # One record per process and thread: two tuning calls of one process, in two threads, must not
        # clear each other's record.
        self.inflight = self.directory / f"inflight-rank{rank}-pid{os.getpid()}-t{threading.get_ident()}.json"
        self.listing = self.directory / f"rank{rank}.jsonl"
        self.comm = comm
        self.recovered: list[dict[str, Any]] = []  # what an earlier process left unfinished, found now
        self._sync = torch.cuda.is_available()
        self.working = True  # False once the folder cannot be written: tuning goes on without notes
        try:
            for path in sorted(self.directory.glob(f"inflight-rank{rank}-pid*.json")):
                self._recover(path)
        except OSError as e:
            self._give_up(e)

    def _give_up(self, error: OSError) -> None:
        self.working = False
        warnings.warn(f"triton_ctx_tune: the quarantine folder {self.directory} cannot be used ({error}); tuning "
                      "goes on without noting slots, so a config that kills the process would be tried again. "
                      "Fix: make the cache directory's parent writable, or set quarantine=False.", CacheWarning,
                      stacklevel=4)

    def _recover(self, path: Path) -> None:
        pid = _pid_of(path.name)
        if pid is None or pid == os.getpid() or _alive(pid):
            return  # this process's own calls, or another live job's: not a crash
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            record = None  # a half-written record cannot name a config; drop it
        if isinstance(record, dict) and {"id", "config"} <= record.keys():
            record["reason"] = (f"quarantined: process {record.get('pid')} on {record.get('host')} died while "
                                f"running it (slot started {record.get('date')})")
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.listing, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.recovered.append(record)
        path.unlink(missing_ok=True)

    def _mine(self, key_id: str) -> dict[int, str]:
        try:
            lines = self.listing.read_text().splitlines()
        except OSError:
            return {}
        found: dict[int, str] = {}
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("id") == key_id and isinstance(record.get("index"), int):
                found.setdefault(record["index"], f"{record.get('reason', 'quarantined')} {{{record.get('config')}}}")
        return found

    def local(self, key_id: str, n_configs: int) -> dict[int, str]:
        """Configs of this key quarantined on this rank's disk (no collective: read while a step runs)."""
        return {i: r for i, r in self._mine(key_id).items() if 0 <= i < n_configs}

    def lookup(self, key_id: str, n_configs: int) -> dict[int, str]:
        """Configs of this key that any rank has quarantined, with the reason, on every rank."""
        return self.comm.share_failures(self.local(key_id, n_configs), n_configs, "share quarantined configs")

    def begin(self, key_id: str, kernel: str, key: tuple, index: int, config: str) -> None:
        """Durably note the launch about to run (survives the process dying, not the machine)."""
        if not self.working:
            return
        try:
            self._write(key_id, kernel, key, index, config)
        except OSError as e:
            self._give_up(e)

    def _write(self, key_id: str, kernel: str, key: tuple, index: int, config: str) -> None:
        record = {"id": key_id, "kernel": kernel, "key": repr(key), "index": index, "config": config,
                  "pid": os.getpid(), "host": socket.gethostname(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self._watch(record)
        # Rename over the old record: a reader never sees half a file. No fsync: the page cache
        # outlives a dying process, and an fsync per slot would cost milliseconds.
        tmp = self.inflight.with_suffix(".tmp")  # per process and thread, like the record
        for attempt in range(3):
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(record))
                os.replace(tmp, self.inflight)
                return
            except FileNotFoundError:
                if attempt == 2:  # another call of this process removed the empty folder meanwhile: again
                    raise

    def end(self) -> None:
        """The launch completed: on a GPU only once the device has run it (a fault raises here, record kept)."""
        if self._sync:
            torch.cuda.synchronize()
        self.clear()

    def clear(self) -> None:
        self._running = None
        if self.working:
            try:
                self.inflight.unlink(missing_ok=True)
            except OSError as e:
                self._give_up(e)



    def close(self) -> None:
        """At the end of a call: stop the watchdog, and leave no empty folder behind while nothing is quarantined."""
        self._running = None
        self.stop_watchdog()
        with contextlib.suppress(OSError):
            self.directory.rmdir()

    # ---- the watchdog of hung slots -------------------------------------------------------------

    def _watch(self, record: dict[str, Any]) -> None:
        if not math.isfinite(self.slot_timeout_s):
            return
        self._running = (record, time.monotonic() + self.slot_timeout_s)
        if self._watchdog is None:
            # A daemon, so that a watchdog left running cannot hold up the exit; it ends with the call
            # (close()) or at the latest in the atexit hook, before the interpreter finalizes.
            self._stop_watchdog.clear()
            self._watchdog = threading.Thread(target=self._patrol, name="ctx-tune-slot-watchdog", daemon=True)
            with _watchdogs_lock:
                _watchdogs.add(self)
            self._watchdog.start()

    def stop_watchdog(self) -> None:
        """End the watchdog thread and wait for it (at once: it only ever waits on the stop event)."""
        thread, self._watchdog = self._watchdog, None
        if thread is None:
            return
        self._stop_watchdog.set()
        if thread is not threading.current_thread():
            thread.join()
        with _watchdogs_lock:
            _watchdogs.discard(self)

    def _patrol(self) -> None:
        # A hung kernel blocks the tuning thread inside a launch or a synchronize, where no exception
        # can reach it; this thread can still speak for it, and end the process with the note in place.
        pause = min(1.0, self.slot_timeout_s / 4)
        while not self._stop_watchdog.wait(pause):
            running = self._running
            if running is not None and time.monotonic() > running[1]:
                record = running[0]
                error = SlotHangError(record["kernel"], record["key"], record["config"], self.slot_timeout_s, self.rank)
                sys.stderr.write(f"[triton_ctx_tune] {type(error).__name__}: {error}\n")
                sys.stderr.flush()
                os._exit(124)


# Quarantines whose watchdog runs. One whose call never closed (an online session the program did not
# finish) would otherwise keep its watchdog until the interpreter finalizes, where a daemon thread that
# wakes is ended inside the runtime instead of returning.
_watchdogs: set[Quarantine] = set()
_watchdogs_lock = threading.Lock()


@atexit.register
def _stop_watchdogs() -> None:
    with _watchdogs_lock:
        running = list(_watchdogs)
    for quarantine in running:
        quarantine.stop_watchdog()


def _pid_of(name: str) -> int | None:
    match = re.search(r"-pid(\d+)-", name)
    return int(match.group(1)) if match else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True

