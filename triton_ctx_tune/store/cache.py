"""The persistent tuning cache: one JSON file per (kernel, key), looked up and written by rank 0 only.

An entry's id is the SHA-256 of its *identity*: everything that makes a tuned result invalid
when it changes (kernel name; the source of the kernel and of every @triton.jit function it
calls, and the globals and heuristics they read; the autotuner's key and reset/restore argument
names, the tuning key, the pruned configs in order and their hooks, GPU name, architecture and
count, or "cpu-interpreter"; world size, reduction and statistic, Triton and torch versions).
A changed identity is a different file, so a stale result is never found; on such a miss rank 0
looks for entries of the same kernel and key and says which part of the identity changed (if only
the config list did, that entry's timings seed an incremental re-tuning: incremental.py). The
file is still checked against the live configs on load, so a tampered file can at worst cause
a miss.

JSON only, never pickle: a tampered or corrupted file cannot execute code. Anything wrong with
a file (truncated, not JSON, wrong shape, unreadable) is a warning and a miss; the key is
tuned again and the file rewritten.

In a distributed job only the group's rank 0 touches the disk: nodes need not share a file
system, and ranks cannot disagree about a file they never read. One all_gather per looked-up
key hands rank 0's hit and winner to every rank and checks that they all asked for the same
entry. Writes go to a temporary file in the same directory, then os.replace: readers and
concurrent writers of the same entry only ever see a whole file.

On a miss, rank 0 also asks the shipped config files (shipped.py, `config_path=`) for the exact
identity: user cache > shipped file > tune. A shipped hit is checked like a cache entry and never
written into the cache.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import math
import os
import re
import socket
import tempfile
import warnings
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from .. import __version__
from ..errors import CacheWarning, RankMismatchError
from ..runtime.collectives import Collectives
from ..runtime.compat import (
    TRITON_VERSION,
    Autotuner,
    Config,
    autotuner_definition,
    autotuner_hooks,
    config_str,
    config_to_dict,
    inner_heuristics,
    interpret_mode,
    jit_function,
    kernel_name,
)
from .fingerprint import callable_digest, kernel_code
from .incremental import Plan, plan

FORMAT = "triton_ctx_tune.cache/2"  # /1 hashed the outer kernel's source alone
EXPORT_FORMAT = "triton_ctx_tune.cache-export/1"
DEFAULT_CACHE_DIR = "~/.cache/triton_ctx_tune"
ENTRY_SUFFIX = ".json"
_MAX_ENTRY_BYTES = 16 * 1024 * 1024  # far above any real entry; a bigger file is not ours
_MAX_STALE_READS = 200  # entries of one kernel read on a miss to explain it
_IDENTITY_FIELDS = {"format": str, "kernel": str, "code": dict, "autotuner": dict, "key": str, "configs": list,
                    "hooks": dict, "device": str, "arch": str, "device_count": int, "world": int, "reduce": str,
                    "stat": str, "triton": str, "torch": str}
# Left out of what ranks must agree on before a lookup: they are rank 0's facts, and rank 0
# alone looks the entry up. A job may mix GPU models, and a hook may capture its rank's own
# values (a rank number, a buffer size) without the ranks tuning different things.
_PER_RANK_FIELDS = ("device", "arch", "device_count", "hooks")


def resolve_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory: the argument, else TRITON_CTX_TUNE_CACHE_DIR, else ~/.cache/triton_ctx_tune."""
    raw = cache_dir if cache_dir is not None else (os.environ.get("TRITON_CTX_TUNE_CACHE_DIR") or DEFAULT_CACHE_DIR)
    return Path(os.path.expanduser(os.fspath(raw)))


class CacheEntryError(Exception):
    """One file that is not a usable entry; internal, turned into a CacheWarning or a CacheError.

    `foreign`: the file is readable JSON that is not ours at all (no triton_ctx_tune.cache format),
    though its name looks like an entry's; `cache clear` leaves such files alone.
    """

    def __init__(self, path: Path | str, reason: str, foreign: bool = False) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.foreign = foreign


# ---- identity ---------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """Config values as JSON keeps them; anything else by repr, tagged so it cannot pass for a string."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return {"__repr__": repr(value)}


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def device_identity() -> tuple[str, int]:
    """GPU name and count; "cpu-interpreter" and 0 under the interpreter (kernels run on the host)."""
    if interpret_mode():
        return "cpu-interpreter", 0
    if not torch.cuda.is_available():
        return "cpu", 0
    return torch.cuda.get_device_name(), torch.cuda.device_count()


def device_arch() -> str:
    """What Triton compiles for: "sm_90" (CUDA) or the gfx name (ROCm); "" on the host."""
    if interpret_mode() or not torch.cuda.is_available():
        return ""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if getattr(torch.version, "hip", None):
        return str(getattr(props, "gcnArchName", f"gfx {props.major}.{props.minor}"))
    return f"sm_{props.major}{props.minor}"


def identity(at: Autotuner, key: tuple, configs: Sequence[Config], world: int, reduce: str,
             stat: str) -> dict[str, Any]:
    device, count = device_identity()
    return {
        "format": FORMAT,
        "kernel": kernel_name(at),
        # The kernel and every @triton.jit function it calls: a changed helper is a changed kernel.
        "code": kernel_code(jit_function(at), inner_heuristics(at)),
        "autotuner": autotuner_definition(at),
        "key": repr(key),  # repr keeps 1, 1.0 and True apart, which JSON lists would not
        "configs": [_jsonable(config_to_dict(c)) for c in configs],
        # Hooks run inside the timed span: a different hook measured something else.
        "hooks": {"config_pre_hooks": [callable_digest(c.pre_hook) for c in configs],
                  "autotuner": [callable_digest(h) for h in autotuner_hooks(at)]},
        "device": device,
        "arch": device_arch(),
        "device_count": count,
        "world": world,
        "reduce": reduce,
        "stat": stat,
        "triton": TRITON_VERSION,
        "torch": torch.__version__,
    }


def code_digest(code: dict[str, Any]) -> str:
    """One hash for an identity's "code", for people and messages (the entry id covers it anyway)."""
    return hashlib.sha256(canonical(code).encode()).hexdigest()


def identity_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What makes an entry with identity `old` (same kernel and key) not apply to `new`, in words."""
    if old.get("format") != new["format"]:
        return [f"it was written in cache format {old.get('format')!r}, and this version writes {new['format']!r} "
                "(which also covers the @triton.jit functions a kernel calls)"]
    reasons = []
    if old.get("code") != new["code"]:
        reasons += _code_changes(old.get("code") or {}, new["code"])
    if old.get("autotuner") != new["autotuner"]:
        reasons.append(f"the autotuner's key/reset_to_zero/restore_value changed: {canonical(old.get('autotuner'))} -> "
                       f"{canonical(new['autotuner'])}")
    if old.get("configs") != new["configs"]:
        n_old, n_new = len(old.get("configs") or []), len(new["configs"])
        reasons.append(f"the configs changed ({n_old} -> {n_new} configs)" if n_old != n_new else
                       "the configs changed (values or order)")
    if _hooks_changed(old, new):
        reasons.append("a config pre_hook or the autotuner's pre/post hook changed")
    for field, what in (("device", "device"), ("arch", "architecture"), ("device_count", "device count"),
                        ("world", "world size"), ("reduce", "reduce"), ("stat", "stat"), ("triton", "Triton"),
                        ("torch", "torch")):
        if old.get(field) != new[field]:
            reasons.append(f"{what} {old.get(field)!r} -> {new[field]!r}")
    return reasons or ["its identity differs in a way this version cannot name"]


def _hooks_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A hook changed: the autotuner's, or the pre_hook of a config in both lists. A list that only gained
    or lost configs has other config_pre_hooks, but that is the configs' change, not a hook's."""
    before, after = old.get("hooks"), new["hooks"]
    if before == after:
        return False
    if not isinstance(before, dict) or before.get("autotuner") != after["autotuner"]:
        return True

    def by_config(ident: dict[str, Any], hooks: Any) -> dict[str, Any] | None:
        configs = ident.get("configs")
        if not isinstance(configs, list) or not isinstance(hooks, list) or len(hooks) != len(configs):
            return None
        return {canonical(c): h for c, h in zip(configs, hooks)}

    olds, news = by_config(old, before.get("config_pre_hooks")), by_config(new, after["config_pre_hooks"])
    return olds is None or news is None or any(olds[c] != h for c, h in news.items() if c in olds)


def only_configs_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether an entry with identity `old` (same kernel and key) differs from `new` in its config list
    alone: then its timings of the configs still listed hold (incremental.py)."""
    if old.get("format") != new["format"] or old.get("configs") == new["configs"] or _hooks_changed(old, new):
        return False
    return all(old.get(field) == value for field, value in new.items() if field not in ("configs", "hooks"))


def _code_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    def by_name(code: dict[str, Any]) -> dict[str | None, dict[str, Any]]:  # (None: an old entry's unnamed one)
        return {f.get("name"): f for f in code.get("functions") or [] if isinstance(f, dict)}

    before, after = by_name(old), by_name(new)
    root = new["functions"][0]["name"] if new.get("functions") else None
    reasons = []
    for name, f in after.items():
        what = f"the kernel {name}" if name == root else f"the @triton.jit function {name} it calls"
        if name not in before:
            reasons.append(f"the kernel now calls the @triton.jit function {name}" if name != root else
                           f"the kernel is {name} now")
        elif before[name].get("sha256") != f["sha256"]:
            reasons.append(f"the source of {what} changed")
        elif before[name].get("options") != f["options"]:
            reasons.append(f"the jit() options of {what} changed: {canonical(before[name].get('options'))} -> "
                           f"{canonical(f['options'])}")
    reasons += [f"the kernel no longer calls {name}" for name in before if name not in after]
    for field, what in (("globals", "global"), ("heuristics", "heuristic")):
        olds, news = old.get(field) or {}, new.get(field) or {}
        for name in sorted(olds.keys() | news.keys()):
            if olds.get(name) != news.get(name):
                reasons.append(f"{what} {name}: {olds.get(name, 'absent')} -> {news.get(name, 'absent')}"
                               if field == "globals" else f"the heuristic for {name} changed")
    return reasons or ["the kernel's code changed"]


def entry_id(ident: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(ident).encode()).hexdigest()


def _describe_lookup(ident: dict[str, Any]) -> str:
    return (f"cache lookup of {ident['kernel']} key={ident['key']} code={code_digest(ident['code'])[:12]} "
            f"world={ident['world']} reduce={ident['reduce']} stat={ident['stat']} "
            f"triton={ident['triton']} torch={ident['torch']} autotuner={canonical(ident['autotuner'])} "
            f"configs=[{'; '.join(canonical(c) for c in ident['configs'])}]")


def agreement_identity(ident: dict[str, Any]) -> bytes:
    """What every rank's lookup must share (per-rank fields, such as hooks, left out)."""
    shared = {k: v for k, v in ident.items() if k not in _PER_RANK_FIELDS}
    return canonical(shared).encode()


def entry_filename(kernel: str, eid: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', kernel)[:80]}-{eid}{ENTRY_SUFFIX}"


# What entry_filename writes, and the temporary files of write_json_atomically (mkstemp's
# random part) on the way to it. A shared folder's other files match neither.
_ENTRY_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}-[0-9a-f]{64}\.json"
_ENTRY_FILE = re.compile(rf"^{_ENTRY_NAME}$")
_ENTRY_TEMP_FILE = re.compile(rf"^\.{_ENTRY_NAME}\.[A-Za-z0-9_]+\.tmp$")


def is_entry_name(name: str) -> bool:
    return _ENTRY_FILE.match(name) is not None


# ---- entries ----------------------------------------------------------------------------------


def make_entry(ident: dict[str, Any], configs: Sequence[Config], winner: int, reduced: Sequence[Sequence[float]],
               per_rank: Sequence[Sequence[float]], failures: dict[int, str], tuned: dict[str, Any],
               carried: Collection[int] = ()) -> dict[str, Any]:
    """A whole entry. reduced[j] = (stat, q20, q80) in ms; per_rank[r][j] = rank r's stat; failures are rank 0's;
    `carried`: configs whose times were carried over from an earlier entry, scaled, not measured (incremental.py)."""
    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None  # strict JSON has no Infinity

    # A split screening's dropped configs ran on their screening rank alone: no time elsewhere is no failure; nor
    # for the survivors that left the lockstep rounds after the first (engine/decisions.py, _lockstep_stay).
    screened = (set(tuned.get("screened_out") or ()) | set(tuned.get("lockstep_out") or ())
                if tuned.get("split") else set())
    # A budgeted search's unexplored configs were never run: no time is no failure (engine/budget.py).
    budget = tuned.get("budget")
    explored = set(budget["explored"]) if isinstance(budget, dict) else set(range(len(configs)))
    timings = []
    for j, config in enumerate(configs):
        failed_ranks = [r for r, row in enumerate(per_rank) if not math.isfinite(row[j])]
        if (j in screened and len(failed_ranks) == len(per_rank) - 1) or j not in explored:
            failed_ranks = []
        failure = failures.get(j)
        if failure is None and failed_ranks:
            failure = f"no time on rank(s) {failed_ranks}"
        timings.append({"config": config_str(config), "ms": finite(reduced[j][0]), "q20": finite(reduced[j][1]),
                        "q80": finite(reduced[j][2]), "per_rank_ms": [finite(row[j]) for row in per_rank],
                        "failure": failure, "failed_ranks": failed_ranks,
                        **({"carried": True} if j in carried else {}),
                        **({"explored": False} if j not in explored else {})})
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "format": FORMAT,
        "id": entry_id(ident),
        "identity": ident,
        "winner": {"index": winner, "config": config_str(configs[winner])},
        "timings": timings,
        "tuned": {"date": now.isoformat(timespec="seconds"), "host": socket.gethostname(),
                  "triton_ctx_tune": __version__, **tuned},
    }


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def entry_problem(entry: Any) -> str | None:
    """Why `entry` is not a well-formed entry, or None. Checks shape and self-consistency, not freshness."""
    if not isinstance(entry, dict):
        return f"expected a JSON object, found {type(entry).__name__}"
    if entry.get("format") != FORMAT:
        return f"format is {entry.get('format')!r}, expected {FORMAT!r}"
    ident = entry.get("identity")
    if not isinstance(ident, dict):
        return "'identity' is missing or not an object"
    for name, kind in _IDENTITY_FIELDS.items():
        value = ident.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"identity.{name} is missing or not a {kind.__name__}"
    if ident["format"] != FORMAT:
        return f"identity.format is {ident['format']!r}, expected {FORMAT!r}"
    try:
        eid = entry_id(ident)
    except (TypeError, ValueError) as e:
        return f"identity cannot be hashed ({e})"
    if entry.get("id") != eid:
        return "'id' is not the hash of 'identity' (the file was edited)"
    n = len(ident["configs"])
    timings = entry.get("timings")
    if not isinstance(timings, list) or len(timings) != n:
        return f"'timings' must be a list of {n} items, one per config"
    for j, t in enumerate(timings):
        if not isinstance(t, dict) or not isinstance(t.get("config"), str):
            return f"timings[{j}] must be an object with a 'config' string"
        for field in ("ms", "q20", "q80"):
            if t.get(field) is not None and not _is_number(t[field]):
                return f"timings[{j}].{field} must be a number or null"
        if not isinstance(t.get("per_rank_ms", []), list) or not all(x is None or _is_number(x)
                                                                       for x in t.get("per_rank_ms", [])):
            return f"timings[{j}].per_rank_ms must be a list of numbers or nulls"
        if not isinstance(t.get("failed_ranks", []), list) or not all(_is_int(x) for x in t.get("failed_ranks", [])):
            return f"timings[{j}].failed_ranks must be a list of integers"
        if t.get("failure") is not None and not isinstance(t["failure"], str):
            return f"timings[{j}].failure must be a string or null"
        if not isinstance(t.get("carried", False), bool):
            return f"timings[{j}].carried must be true or false"
    winner = entry.get("winner")
    if not isinstance(winner, dict) or not _is_int(winner.get("index")) or not isinstance(winner.get("config"), str):
        return "'winner' must be an object with an integer 'index' and a 'config' string"
    if not 0 <= winner["index"] < n:
        return f"winner index {winner['index']} is outside the {n} configs"
    if winner["config"] != timings[winner["index"]]["config"]:
        return "the winner's config text differs from its entry in 'timings'"
    if timings[winner["index"]].get("ms") is None:
        return "the winner has no time (it failed), so it cannot be the winner"
    tuned = entry.get("tuned")
    if not isinstance(tuned, dict) or not isinstance(tuned.get("date"), str):
        return "'tuned' must be an object with a 'date' string"
    return None


def read_entry(path: Path) -> dict[str, Any]:
    """A well-formed entry, or CacheEntryError saying what is wrong; a missing file raises FileNotFoundError."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_ENTRY_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        # No entry (a file where the directory should be is the writer's problem, reported there).
        raise FileNotFoundError(path) from None
    except OSError as e:
        raise CacheEntryError(path, f"cannot be read ({e.strerror or e})") from None
    if len(raw) > _MAX_ENTRY_BYTES:
        raise CacheEntryError(path, f"is larger than {_MAX_ENTRY_BYTES} bytes, which no entry is")
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CacheEntryError(path, f"is not valid JSON, probably truncated or corrupted ({e})") from None
    problem = entry_problem(entry)
    if problem is not None:
        ours = isinstance(entry, dict) and str(entry.get("format", "")).startswith(FORMAT.split("/")[0] + "/")
        raise CacheEntryError(path, problem, foreign=not ours)
    return entry


def write_json_atomically(path: Path, data: Any) -> None:
    """Write to a unique temporary file next to `path`, then rename it over `path` in one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a shared cache is read by other users
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_entry(directory: Path, entry: dict[str, Any]) -> Path:
    path = directory / entry_filename(entry["identity"]["kernel"], entry["id"])
    write_json_atomically(path, entry)
    return path


def entry_paths(directory: Path) -> list[Path]:
    """Files named like an entry (KERNEL-SHA256.json); the cache directory may be a folder shared with other files."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if is_entry_name(p.name))


def iter_entries(directory: Path) -> Iterator[tuple[Path, dict[str, Any] | CacheEntryError]]:
    """Every entry file of the directory with its entry, or the reason it cannot be used."""
    for path in entry_paths(directory):
        try:
            yield path, read_entry(path)
        except FileNotFoundError:
            continue  # removed by a concurrent clear
        except CacheEntryError as e:
            yield path, e


def stale_temp_files(directory: Path) -> list[Path]:
    """Temporary files of entries, left by writers that were killed between write and rename."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _ENTRY_TEMP_FILE.match(p.name))


# ---- the session's view -----------------------------------------------------------------------


@dataclass
class Stale:
    """An entry of the same kernel and key that a miss did not use, and why it does not apply."""
    path: Path
    reasons: list[str]
    others: int  # further entries of this kernel and key that do not apply either
    winner_config: str | None = None  # its winner: the incumbent among near-ties (decisions.py)
    source: str = "cache"  # "cache", or "shipped" (path is then the shipped file that holds it)
    plan: Plan | None = None  # only its config list changed: what to re-time (incremental.py)

    def describe(self, kernel: str, key: tuple) -> tuple[str, dict[str, Any]]:
        """The log line and the event's fields."""
        p = self.plan
        how = ("Tuning again." if p is None else
               f"Tuning again incrementally: timing {len(p.new)} new and {len(p.anchors)} anchor configs, carrying "
               f"{len(p.carried) + len(p.carried_failed)} over.")
        return stale_event(f"kernel={kernel} key={key!r}", {"kernel": kernel, "key": list(key)}, self.path,
                           self.reasons, self.others, self.source, how)


def stale_event(subject: str, fields: dict[str, Any], path: Path, reasons: list[str], others: int, source: str,
                how: str = "Tuning again.") -> tuple[str, dict[str, Any]]:
    """A cache-stale event's line and fields, for a kernel's entry (Stale) and a function's
    (function_cache.FunctionStale) alike, so that the two read the same: `subject` and `fields` name what
    missed, in the line's spelling and the event's; `source` is "cache" or "shipped"."""
    older = "older " if source == "cache" else "other shipped "
    more = f" (and {others} {older}entr{'y' if others == 1 else 'ies'})" if others else ""
    what = f"the cached entry {path}" if source == "cache" else f"the shipped entry in {path}"
    line = f"cache-stale {subject}: {what}{more} does not apply: " + "; ".join(reasons) + ". " + how
    return line, {**fields, "path": str(path), "reasons": reasons, "others": others, "source": source}


def closest_stale(candidates: Sequence[tuple[Path, dict[str, Any]]], ident: dict[str, Any], source: str,
                  configs: Sequence[Config] | None = None) -> Stale | None:
    """Of entries with the same kernel and key (newest first), the one that differs least from `ident`, and how.
    Given the live `configs`, an entry whose config list alone differs also brings an incremental plan."""
    found: list[tuple[int, Path, list[str], str | None, dict[str, Any] | None]] = []
    for order, (where, old) in enumerate(candidates):
        old_ident = old.get("identity") if isinstance(old, dict) else None
        if not isinstance(old_ident, dict):
            continue
        if source == "shipped" and canonical(old_ident) == canonical(ident):
            continue  # the entry looked up itself, refused for its winner (warned there)
        won = old.get("winner")
        won_config = won.get("config") if isinstance(won, dict) and isinstance(won.get("config"), str) else None
        usable = configs is not None and only_configs_changed(old_ident, ident) and entry_problem(old) is None
        found.append((order, where, identity_changes(old_ident, ident), won_config, old if usable else None))
    if not found:
        return None
    # Fewest changes, then one whose timings carry over, then the newest.
    _, closest, reasons, won_config, timed = min(found, key=lambda f: (len(f[2]), f[4] is None, f[0]))
    incremental = None
    if timed is not None and configs is not None:
        incremental = plan(timed["timings"], won_config, [config_str(c) for c in configs], ident["world"])
    return Stale(closest, reasons, len(found) - 1, won_config, source, incremental)


class ShippedSource(Protocol):
    """What TuningCache asks of shipped.ShippedConfigs (passed in, so that this module need not import it)."""

    def kernel(self, eid: str) -> Any: ...  # a shipped.Shipped (.path, .entry), or None

    def kernel_others(self, kernel: str, key: str) -> list[Any]: ...

    def kernel_entries(self, kernel: str) -> list[Any]: ...


@dataclass
class Lookup:
    identity: dict[str, Any]
    id: str
    path: Path
    hit: bool
    winner: int  # -1 on a miss
    entry: dict[str, Any] | None  # the entry as read, on the rank that read it
    stale: Stale | None = None  # on a miss, on the rank that read: the closest entry that no longer applies
    # Where a hit came from: "cache" (the entry at `path`), else the shipped file's path on rank 0 and
    # "shipped" on the other ranks (they never read it).
    source: str = "cache"
    incremental: Plan | None = None  # on a miss, on every rank: what to re-time (stale.plan, broadcast)
    # On a miss, on every rank: an entry that a budget decided, which this call's larger budget continues
    # (engine/budget.py): each config's time (nan: not explored) and what it spent, rank 0's broadcast.
    prior: tuple[list[float], dict[str, float]] | None = None

    @property
    def where(self) -> str:
        """The file a hit was read from, for messages."""
        if self.source == "cache":
            return str(self.path)
        return self.source if self.source != "shipped" else "a shipped config file (rank 0 read it)"


class TuningCache:
    """Lookups and stores for one tuning call."""

    def __init__(self, directory: Path, retune: bool, comm: Collectives, reduce: str, stat: str,
                 shipped: ShippedSource | None = None) -> None:
        self.directory = directory
        self.retune = retune
        self.comm = comm
        self.reduce = reduce
        self.stat = stat
        self.shipped = shipped
        # This call's budget (measure, limit): a budget-decided entry is a hit only for a budget it already
        # spent; a larger one continues from it, none tunes the key whole (set by the call's services).
        self.budget: tuple[str, float] | None = None

    @property
    def reads_and_writes(self) -> bool:
        return self.comm.rank == 0

    def lookup(self, at: Autotuner, key: tuple, configs: Sequence[Config]) -> Lookup:
        """Rank 0's answer for (kernel, key), on every rank; RankMismatchError if ranks asked for different entries."""
        ident = identity(at, key, configs, self.comm.world, self.reduce, self.stat)
        eid = entry_id(ident)
        path = self.directory / entry_filename(ident["kernel"], eid)
        reads = self.reads_and_writes and not self.retune
        entry = self._load(path, ident, configs) if reads else None
        source = "cache"
        if entry is None and reads and self.shipped is not None:
            shipped = self._load_shipped(eid, configs)
            if shipped is not None:
                source, entry = str(shipped.path), shipped.entry
        prior = budget_prior(entry, self.budget) if entry is not None else None
        if entry is not None and prior is not None:
            entry = None  # a budget decided it, and this call may look further: continued, or tuned whole
        hit, winner = entry is not None, entry["winner"]["index"] if entry is not None else -1
        stale = None
        if reads and not hit and prior is None:
            stale = self._stale(path, ident, configs)
            if stale is None and self.shipped is not None:  # the user's own stale entry says more
                stale = closest_stale([(s.path, s.entry) for s in self.shipped.kernel_others(ident["kernel"],
                                                                                             ident["key"])],
                                      ident, "shipped")
        incremental = None if stale is None else stale.plan
        if self.comm.active:
            # (the other ranks learn where a hit came from; 3: a budget-decided entry this call continues)
            code = (3 if prior is not None and prior[0] else 0) if not hit else 1 if source == "cache" else 2
            removed = -1 if incremental is None else incremental.removed
            answers, differing = self.comm.agree(agreement_identity(ident), "look up the tuning cache",
                                                 lambda: _describe_lookup(ident).encode(),
                                                 payload=(code, winner, removed))
            if differing is not None:
                groups: dict[bytes, list[int]] = {}
                for rank, text in enumerate(differing):
                    groups.setdefault(text, []).append(rank)
                raise RankMismatchError("\n".join(f"  ranks {ranks}: {text.decode()}"
                                                  for text, ranks in groups.items()))
            hit, winner, removed = int(answers[0, 0]) in (1, 2), int(answers[0, 1]), int(answers[0, 2])  # rank 0's
            if int(answers[0, 0]) == 3:  # every rank continues from rank 0's entry
                mine = _prior_tensor(prior, len(configs))
                got = self.comm.broadcast_from_root(mine, "broadcast the budgeted search's prior").tolist()
                prior = (got[:len(configs)], dict(zip(("executions", "compiles", "seconds"), got[len(configs):])))
            else:
                prior = None
            if not self.reads_and_writes:
                source = "shipped" if int(answers[0, 0]) == 2 else "cache"
            if removed >= 0:  # every rank plans the same slots: rank 0's plan, whole
                mine = (incremental.to_tensor() if incremental is not None
                        else Plan.blank_tensor(len(configs), ident["world"]))
                incremental = Plan.from_tensor(self.comm.broadcast_from_root(mine, "broadcast the incremental plan"),
                                               removed)
        if prior is not None and not prior[0]:
            prior = None  # no budget now: the key is tuned whole
        return Lookup(ident, eid, path, hit, winner, entry, stale, source, incremental, prior)

    def neighbours(self, ident: dict[str, Any]) -> dict[str, str]:
        """Rank 0: the tuned keys a frozen call may borrow from (key repr -> winner config): the user's cache
        first, then the shipped config files (the same precedence as a lookup)."""
        found = tuned_neighbours(self.directory, ident) if self.reads_and_writes else {}
        if self.reads_and_writes and self.shipped is not None:
            for key, config in same_but_key((s.entry for s in self.shipped.kernel_entries(ident["kernel"])),
                                            ident).items():
                found.setdefault(key, config)
        return found

    def _load_shipped(self, eid: str, configs: Sequence[Config]) -> Any:
        """The shipped entry of exactly this identity, if its winner is one of the live configs."""
        assert self.shipped is not None
        found = self.shipped.kernel(eid)
        if found is None:
            return None
        winner = found.entry["winner"]
        if winner["config"] != config_str(configs[winner["index"]]):
            warnings.warn(f"triton_ctx_tune: ignoring the shipped entry {eid[:12]} in {found.path}: its winner "
                          f"{{{winner['config']}}} is not config #{winner['index']} of the current configs "
                          f"{{{config_str(configs[winner['index']])}}}. The key is tuned. Fix: export the file again "
                          "with `cache export --ship` from a cache tuned with these configs.", CacheWarning,
                          stacklevel=3)
            return None
        return found

    def _load(self, path: Path, ident: dict[str, Any], configs: Sequence[Config]) -> dict[str, Any] | None:
        try:
            entry = read_entry(path)
        except FileNotFoundError:
            return None
        except CacheEntryError as e:
            _warn_ignored(path, e.reason)
            return None
        if canonical(entry["identity"]) != canonical(ident):
            _warn_ignored(path, "its identity is not the one its file name promises (the file was edited or renamed)")
            return None
        winner = entry["winner"]
        if winner["config"] != config_str(configs[winner["index"]]):
            _warn_ignored(path, f"its winner {{{winner['config']}}} is not config #{winner['index']} of the current "
                          f"configs {{{config_str(configs[winner['index']])}}}")
            return None
        return entry

    def _stale(self, path: Path, ident: dict[str, Any], configs: Sequence[Config]) -> Stale | None:
        """The entry of this kernel and key that differs least from `ident`, and how, if there is one; with
        an incremental plan when only its config list differs."""
        prefix = path.name[: -len(f"-{entry_id(ident)}{ENTRY_SUFFIX}")]
        try:
            named = [p for p in self.directory.glob(f"{prefix}-*{ENTRY_SUFFIX}")
                     if len(p.name) == len(path.name) and is_entry_name(p.name) and p != path]
            named.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return None
        candidates: list[tuple[Path, dict[str, Any]]] = []
        for candidate in named[:_MAX_STALE_READS]:
            try:
                old = json.loads(candidate.read_bytes()[:_MAX_ENTRY_BYTES])
            except (OSError, ValueError, RecursionError):
                continue  # damaged files are reported when they are the entry looked up
            old_ident = old.get("identity") if isinstance(old, dict) else None
            if (isinstance(old_ident, dict) and old_ident.get("kernel") == ident["kernel"]
                    and old_ident.get("key") == ident["key"]):
                candidates.append((candidate, old))
        return closest_stale(candidates, ident, "cache", configs)

    def store(self, lookup: Lookup, configs: Sequence[Config], winner: int, reduced: Sequence[Sequence[float]],
              per_rank: Sequence[Sequence[float]], failures: dict[int, str], tuned: dict[str, Any],
              carried: Collection[int] = ()) -> Path | None:
        """Rank 0 writes the decided key; a write that fails is a warning, never an error of the tuning call."""
        if not self.reads_and_writes:
            return None
        entry = make_entry(lookup.identity, configs, winner, reduced, per_rank, failures, tuned, carried)
        try:
            return write_entry(self.directory, entry)
        except OSError as e:
            warnings.warn(f"triton_ctx_tune: could not write the tuning cache entry {lookup.path} ({e}); the result "
                          "is kept for this process only. Fix: make the directory writable, point "
                          "TRITON_CTX_TUNE_CACHE_DIR elsewhere, or disable the cache with TRITON_CTX_TUNE_CACHE=0.",
                          CacheWarning, stacklevel=2)
            return None


def budget_prior(entry: dict[str, Any], budget: tuple[str, float] | None
                 ) -> tuple[list[float], dict[str, float]] | None:
    """Whether a budget-decided entry answers a call with `budget`: None when it does (no budget decided it,
    or this budget is already spent); else what it explored, to continue from (its times, nan where not
    explored, and what it spent), or ([], {}) when the call has no budget and the key is tuned whole."""
    record = (entry.get("tuned") or {}).get("budget")
    if not isinstance(record, dict) or not record.get("decided_by_budget"):
        return None
    if budget is None:
        return [], {}
    spent = record.get("spent") or {}
    measure, limit = budget
    if not limit > float(spent.get(measure, 0.0)):
        return None
    explored = set(record.get("explored") or [])
    times = [(math.inf if t.get("ms") is None else float(t["ms"])) if j in explored else math.nan
             for j, t in enumerate(entry["timings"])]
    return times, {k: float(spent.get(k, 0.0)) for k in ("executions", "compiles", "seconds")}


def _prior_tensor(prior: tuple[list[float], dict[str, float]] | None, n: int) -> torch.Tensor:
    if prior is None or not prior[0]:
        return torch.full((n + 3,), math.nan, dtype=torch.float64)
    times, spent = prior
    return torch.tensor(times + [spent["executions"], spent["compiles"], spent["seconds"]], dtype=torch.float64)


def _warn_ignored(path: Path, reason: str) -> None:
    warnings.warn(f"triton_ctx_tune: ignoring the tuning cache entry {path}: {reason}. The key is tuned again "
                  "and the entry rewritten.", CacheWarning, stacklevel=3)


# ---- frozen calls (options.freeze) ------------------------------------------------------------


def tuned_neighbours(directory: Path, ident: dict[str, Any]) -> dict[str, str]:
    """Rank 0's tuned keys of `ident`'s kernel that differ from it in the key alone: key repr -> winner config.

    What a frozen call may borrow from for a key it has no result for (the nearest one): an entry
    tuned for other configs, another Triton or another device is no evidence for this one."""
    prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", ident["kernel"])[:80] + "-"

    def entries() -> Iterator[dict[str, Any]]:
        for path in entry_paths(directory):
            if path.name.startswith(prefix):
                try:
                    yield read_entry(path)
                except (FileNotFoundError, CacheEntryError):
                    continue  # a damaged entry is reported when its own key is looked up
    return same_but_key(entries(), ident)


def same_but_key(entries: Iterable[dict[str, Any]], ident: dict[str, Any]) -> dict[str, str]:
    """Of `entries`, those whose identity is `ident`'s but for the key: key repr -> winner config (the first
    entry of a key wins)."""
    same = canonical({k: v for k, v in ident.items() if k != "key"})
    found: dict[str, str] = {}
    for entry in entries:
        other = entry["identity"]
        if other.get("kernel") == ident["kernel"] and canonical({k: v for k, v in other.items() if k != "key"}) == same:
            found.setdefault(other["key"], entry["winner"]["config"])
    return found
