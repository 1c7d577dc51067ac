"""The persistent cache of function-level winners: one JSON file per (function, key_fn value).

An entry holds the winning point and the config of every kernel tuned under it, so a later job
runs the function once. Its identity is everything that makes the result invalid when it
changes: the function's code (fingerprint.callable_digest), the key, the pruned points in order,
the device, world size, objective, reduction, statistic and versions. A changed identity is a
different file. Entries live in `<cache dir>/functions/`, next to the kernels' entries and
written the same way: by the group's rank 0 only, atomically (cache.write_json_atomically).
Rank 0 alone reads, and one all-gather hands its answer to every rank after checking that all
of them asked for the same entry. On a miss, rank 0 also asks the shipped config files
(shipped.py): an entry there with exactly this identity is a hit, never copied into the cache.
"""
from __future__ import annotations

import datetime
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..errors import CacheWarning, RankMismatchError
from ..runtime.collectives import Collectives
from ..runtime.compat import TRITON_VERSION
from .cache import (
    _jsonable,
    canonical,
    device_arch,
    device_identity,
    entry_filename,
    entry_id,
    stale_event,
    write_json_atomically,
)
from .fingerprint import callable_digest
from .shipped import ShippedConfigs

FORMAT = "triton_ctx_tune.function-cache/1"
SUBDIR = "functions"


@dataclass
class FunctionStale:
    """A shipped entry of the same function and key that does not apply, and why (rank 0's)."""
    path: Path
    reasons: list[str]
    others: int

    def describe(self, function: str, key: str) -> tuple[str, dict[str, Any]]:
        """The cache-stale event's line and fields (function entries are only ever stale in shipped files)."""
        return stale_event(f"function={function} key={key}", {"function": function, "key": key}, self.path,
                           self.reasons, self.others, "shipped")


@dataclass
class FunctionLookup:
    identity: dict[str, Any]
    path: Path
    entry: dict[str, Any] | None  # rank 0's entry on a hit, on every rank
    source: str = "cache"  # where a hit came from: "cache" (the entry at `path`) or the shipped file's path
    stale: FunctionStale | None = None  # on a miss, on rank 0: the closest shipped entry that does not apply

    @property
    def hit(self) -> bool:
        return self.entry is not None

    @property
    def where(self) -> str:
        return str(self.path) if self.source == "cache" else self.source

    def pins(self) -> dict[tuple[str, str], tuple[int, list[str]]]:
        """(kernel, repr(key)) -> (winner index, configs): what session.Session installs as launches meet them."""
        assert self.entry is not None
        return {(k["kernel"], k["key"]): (int(k["winner"]), list(k["configs"])) for k in self.entry["kernels"]}


def function_identity(fn: Callable[..., Any], name: str, key: Any, points: list[dict[str, Any]], world: int,
                      objective: str, reduce: str, stat: str, budget: str | None = None) -> dict[str, Any]:
    """What an entry answers for. `budget` (the call's, as written): an entry decided within one budget is not the
    answer of a call with another, or with none."""
    device, count = device_identity()
    ident = {"format": FORMAT, "function": name, "code": callable_digest(fn), "key": repr(key),
             "points": _jsonable(points), "device": device, "arch": device_arch(), "device_count": count,
             "world": world, "objective": objective, "reduce": reduce, "stat": stat,
             "triton": TRITON_VERSION, "torch": torch.__version__}
    if budget is not None:  # (absent without one: the entries written before budgets keep their identity)
        ident["budget"] = budget
    return ident


def _path(directory: Path, ident: dict[str, Any]) -> Path:
    return directory / SUBDIR / entry_filename(ident["function"], entry_id(ident))


def lookup(directory: Path | None, ident: dict[str, Any], comm: Collectives, retune: bool,
           shipped: ShippedConfigs | None = None) -> FunctionLookup:
    path = _path(directory or Path("."), ident)
    entry, source, stale = None, "cache", None
    if directory is not None and comm.rank == 0 and not retune:
        entry = _read(path, ident)
        if entry is None and shipped is not None:
            found = shipped.function(entry_id(ident))
            if found is not None and _check(found.path, found.entry, ident, _warn_shipped) is not None:
                entry, source = found.entry, str(found.path)
            else:
                stale = _closest(shipped.function_others(ident["function"], ident["key"]), ident)
    if comm.active:
        # Ranks that asked for different entries would run different points: say so on all of them.
        _, differing = comm.agree(canonical(ident).encode(), "look up the function cache",
                                  lambda: canonical(ident).encode())
        if differing is not None:
            raise RankMismatchError("ranks look up different function-level entries:\n" + "\n".join(
                f"  rank {r}: {text.decode()}" for r, text in enumerate(differing)))
        blob = json.dumps({"entry": entry, "source": source}).encode() if comm.rank == 0 else b""
        shared = json.loads(comm.all_gather_bytes(blob, "share the function cache entry")[0])
        entry, source = shared["entry"], shared["source"]
    return FunctionLookup(ident, path, entry, source, stale)


def entry_problem(entry: Any) -> str | None:
    """Why `entry` is not a well-formed function-level entry, or None (shape only, not freshness)."""
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return f"not a function-level entry of format {FORMAT!r}"
    ident = entry.get("identity")
    if not isinstance(ident, dict) or not isinstance(ident.get("function"), str) or not isinstance(
            ident.get("key"), str) or not isinstance(ident.get("points"), list) or not isinstance(
            ident.get("device"), str):
        return "'identity' must be an object with 'function', 'key', 'points' and 'device'"
    winner = entry.get("winner")
    if not isinstance(winner, dict) or not isinstance(winner.get("index"), int) or not (
            0 <= winner["index"] < len(ident["points"])):
        return "its winner is not one of the points"
    kernels = entry.get("kernels")
    if not isinstance(kernels, list) or not all(
            isinstance(k, dict) and isinstance(k.get("kernel"), str) and isinstance(k.get("key"), str)
            and isinstance(k.get("winner"), int) and isinstance(k.get("configs"), list) for k in kernels):
        return "'kernels' must be a list of objects with kernel, key, winner and configs"
    if not isinstance(entry.get("tuned"), dict):
        return "'tuned' must be an object"
    return None


def entry_path(directory: Path, entry: dict[str, Any]) -> Path:
    """Where a (well-formed) entry lives under the cache directory `directory`."""
    return _path(directory, entry["identity"])


def _check(path: Path, entry: Any, ident: dict[str, Any], warn: Callable[[Path, str], None]) -> dict[str, Any] | None:
    problem = entry_problem(entry)
    if problem is not None:
        warn(path, problem)
        return None
    if canonical(entry.get("identity")) != canonical(ident):
        warn(path, "its identity is not the one its file name promises (the file was edited or renamed)")
        return None
    return entry


def _read(path: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        _warn(path, f"it cannot be read as JSON ({e})")
        return None
    return _check(path, entry, ident, _warn)


def identity_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What makes a function-level entry with identity `old` (same function and key) not apply to `new`."""
    reasons = []
    for field, what in (("format", "format"), ("code", "the function's code"), ("points", "the points"),
                        ("device", "device"), ("arch", "architecture"), ("device_count", "device count"),
                        ("world", "world size"), ("objective", "objective"), ("reduce", "reduce"),
                        ("stat", "stat"), ("triton", "Triton"), ("torch", "torch")):
        if old.get(field) != new.get(field):
            short = field in ("code", "points")
            reasons.append(f"{what} changed" if short else f"{what} {old.get(field)!r} -> {new.get(field)!r}")
    return reasons or ["its identity differs in a way this version cannot name"]


def _closest(candidates: Sequence[Any], ident: dict[str, Any]) -> FunctionStale | None:
    found = [(i, s.path, identity_changes(s.entry.get("identity") or {}, ident)) for i, s in enumerate(candidates)
             if canonical(s.entry.get("identity")) != canonical(ident)]
    if not found:
        return None
    _, path, reasons = min(found, key=lambda f: (len(f[2]), f[0]))
    return FunctionStale(path, reasons, len(found) - 1)


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


def _warn_shipped(path: Path, reason: str) -> None:
    warnings.warn(f"triton_ctx_tune: ignoring a function-level entry of the shipped config file {path}: {reason}. "
                  "The function is tuned. Fix: export the file again with `cache export --ship`.", CacheWarning,
                  stacklevel=4)


def _warn(path: Path, reason: str) -> None:
    warnings.warn(f"triton_ctx_tune: ignoring the function cache entry {path}: {reason}. The function is tuned "
                  "again and the entry rewritten.", CacheWarning, stacklevel=3)
