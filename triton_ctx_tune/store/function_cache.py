"""The persistent cache of function-level winners: one JSON file per (function, key_fn value).

An entry holds the winning point and the config of every kernel tuned under it, so a later job
runs the function once. Its identity is everything that makes the result invalid when it
changes: the function's code (fingerprint.callable_digest), the key, the pruned points in order,
the device, world size, objective, reduction, statistic and versions. A changed identity is a
different file. Entries live in `<cache dir>/functions/`, next to the kernels' entries and
written the same way: by the group's rank 0 only, atomically (cache.write_json_atomically).
Rank 0 alone reads, and one all-gather hands its answer to every rank after checking that all
of them asked for the same entry.
"""
from __future__ import annotations

import datetime
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .. import __version__
from .cache import _jsonable, canonical, device_arch, device_identity, entry_filename, entry_id, write_json_atomically
from ..runtime.collectives import Collectives
from ..runtime.compat import TRITON_VERSION
from ..errors import CacheWarning, RankMismatchError
from .fingerprint import callable_digest

FORMAT = "triton_ctx_tune.function-cache/1"
SUBDIR = "functions"


@dataclass
class FunctionLookup:
    identity: dict[str, Any]
    path: Path
    entry: dict[str, Any] | None  # rank 0's entry on a hit, on every rank

    @property
    def hit(self) -> bool:
        return self.entry is not None

    def pins(self) -> dict[tuple[str, str], tuple[int, list[str]]]:
        """(kernel, repr(key)) -> (winner index, configs): what session.Session installs as launches meet them."""
        assert self.entry is not None
        return {(k["kernel"], k["key"]): (int(k["winner"]), list(k["configs"])) for k in self.entry["kernels"]}


def function_identity(fn: Callable[..., Any], name: str, key: Any, points: list[dict[str, Any]], world: int,
                      objective: str, reduce: str, stat: str) -> dict[str, Any]:
    device, count = device_identity()
    return {"format": FORMAT, "function": name, "code": callable_digest(fn), "key": repr(key),
            "points": _jsonable(points), "device": device, "arch": device_arch(), "device_count": count,
            "world": world, "objective": objective, "reduce": reduce, "stat": stat,
            "triton": TRITON_VERSION, "torch": torch.__version__}


def _path(directory: Path, ident: dict[str, Any]) -> Path:
    return directory / SUBDIR / entry_filename(ident["function"], entry_id(ident))


def lookup(directory: Path | None, ident: dict[str, Any], comm: Collectives, retune: bool) -> FunctionLookup:
    path = _path(directory or Path("."), ident)
    entry = None
    if directory is not None and comm.rank == 0 and not retune:
        entry = _read(path, ident)
    if comm.active:
        # Ranks that asked for different entries would run different points: say so on all of them.
        _, differing = comm.agree(canonical(ident).encode(), "look up the function cache",
                                  lambda: canonical(ident).encode())
        if differing is not None:
            raise RankMismatchError("ranks look up different function-level entries:\n" + "\n".join(
                f"  rank {r}: {text.decode()}" for r, text in enumerate(differing)))
        blob = json.dumps(entry).encode() if comm.rank == 0 else b""
        entry = json.loads(comm.all_gather_bytes(blob, "share the function cache entry")[0])
    return FunctionLookup(ident, path, entry)


def _read(path: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        _warn(path, f"it cannot be read as JSON ({e})")
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or not isinstance(entry.get("kernels"), list):
        _warn(path, "it is not a function-level entry of this format")
        return None
    if canonical(entry.get("identity")) != canonical(ident):
        _warn(path, "its identity is not the one its file name promises (the file was edited or renamed)")
        return None
    winner = entry.get("winner", {})
    if not isinstance(winner.get("index"), int) or not 0 <= winner["index"] < len(ident["points"]):
        _warn(path, "its winner is not one of the points")
        return None
    return entry


def store(lookup: FunctionLookup, comm: Collectives, winner: int, reduced: list, per_rank: list,
          kernels: list[dict[str, Any]], tuned: dict[str, Any]) -> Path | None:
    """Rank 0 writes the decided entry; a failed write is a warning, never an error of the call."""
    if comm.rank != 0:
        return None
    entry = {"format": FORMAT, "identity": lookup.identity,
             "winner": {"index": winner, "point": lookup.identity["points"][winner]},
             "reduced": _jsonable(reduced), "per_rank": _jsonable(per_rank), "kernels": kernels,
             "tuned": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "triton_ctx_tune": __version__, **tuned}}
    try:
        write_json_atomically(lookup.path, entry)
    except OSError as e:
        warnings.warn(f"triton_ctx_tune: could not write the function cache entry {lookup.path} ({e}); the result "
                      "is kept for this process only. Fix: make the directory writable or point "
                      "TRITON_CTX_TUNE_CACHE_DIR elsewhere.", CacheWarning, stacklevel=2)
        return None
    return lookup.path


def _warn(path: Path, reason: str) -> None:
    warnings.warn(f"triton_ctx_tune: ignoring the function cache entry {path}: {reason}. The function is tuned "
                  "again and the entry rewritten.", CacheWarning, stacklevel=3)
