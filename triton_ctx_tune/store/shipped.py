"""Tuned configs shipped with a library: read-only export files found on a search path.

A library tunes its kernels on each GPU it supports, writes one file per (device, tuned function)
with `python -m triton_ctx_tune cache export --ship DIR`, and puts DIR in its package data. Users
point `config_path=` (or TRITON_CTX_TUNE_CONFIG_PATH, directories separated by os.pathsep) at it.
On a user-cache miss, an entry of a shipped file with exactly the looked-up identity is a hit:
user cache > shipped file > tune. A shipped hit is never copied into the user cache, so a newer
file from the library takes effect at once.

Each file is parsed once per process and kept while its mtime and size stay the same. Only rank 0
looks anything up (cache.TuningCache, function_cache.lookup), so only rank 0 reads these files.
A damaged file, or a directory on the path that is not there, is a CacheWarning, once; never an
error of the tuning call. cache.py does not import this module: TuningCache takes a ShippedConfigs
as an argument, so the imports keep running one way (shipped -> cache).
"""
from __future__ import annotations

import json
import os
import re
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from ..errors import CacheWarning
from .cache import EXPORT_FORMAT, entry_id, entry_problem

ENV = "TRITON_CTX_TUNE_CONFIG_PATH"
SUFFIX = ".json"
_MAX_FILE_BYTES = 256 * 1024 * 1024  # a shipped file holds many entries; far above any real one

PathLike = Union[str, "os.PathLike[str]"]


def safe_name(text: str) -> str:
    """A device or function name as a file-name part: anything but letters, digits, '.', '_', '+', '-' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", text) or "_"


def ship_filename(device: str, function: str | None) -> str:
    """`{device}-{function}.json`, as aiter names its tuned-config files; "unknown" for an entry with no function."""
    return f"{safe_name(device)}-{safe_name(function) if function else 'unknown'}{SUFFIX}"


def is_path_value(value: Any) -> bool:
    """What config_path accepts: None, a path, or a list/tuple of paths."""
    if value is None or isinstance(value, (str, os.PathLike)):
        return True
    return isinstance(value, (list, tuple)) and all(isinstance(v, (str, os.PathLike)) for v in value)


def directories(config_path: PathLike | Sequence[PathLike] | None) -> tuple[tuple[Path, ...], str]:
    """The directories to search, in order, and what named them (for messages)."""
    if config_path is None:
        raw = os.environ.get(ENV, "")
        parts: list[PathLike] = [p for p in raw.split(os.pathsep) if p.strip()]
        named_by = ENV
    elif isinstance(config_path, (str, os.PathLike)):
        parts, named_by = [config_path], "config_path"
    else:
        parts, named_by = list(config_path), "config_path"
    return tuple(Path(os.path.expanduser(os.fspath(p))) for p in parts if os.fspath(p)), named_by


@dataclass(frozen=True)
class Shipped:
    """One entry of a shipped file: where it came from, and the entry (a kernel's or a function's)."""
    path: Path
    entry: dict[str, Any]


@dataclass
class _File:
    stamp: tuple[int, int]  # (mtime_ns, size) it was read at
    kernels: dict[str, Shipped] = field(default_factory=dict)  # entry id -> entry
    kernel_keys: dict[tuple[str, str], list[Shipped]] = field(default_factory=dict)  # (kernel, repr key) -> entries
    functions: dict[str, Shipped] = field(default_factory=dict)
    function_keys: dict[tuple[str, str], list[Shipped]] = field(default_factory=dict)


_lock = threading.Lock()
_files: dict[Path, _File] = {}
_warned_dirs: set[Path] = set()


def _warn(message: str) -> None:
    warnings.warn(f"triton_ctx_tune: {message}", CacheWarning, stacklevel=4)


def _read(path: Path, stamp: tuple[int, int]) -> _File:
    """Parse and index one file; whatever is wrong with it is a warning, and what is usable is kept."""
    read = _File(stamp)
    fix = ("Fix: write it again with `python -m triton_ctx_tune cache export --ship DIR` and ship it whole, "
           "or remove it from the directory")
    if stamp[1] > _MAX_FILE_BYTES:
        _warn(f"ignoring the shipped config file {path}: it is larger than {_MAX_FILE_BYTES} bytes. {fix}.")
        return read
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        _warn(f"ignoring the shipped config file {path}: it is not readable JSON ({e}). {fix}.")
        return read
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        _warn(f"ignoring the shipped config file {path}: it is not a triton_ctx_tune export ({EXPORT_FORMAT}), "
              f"found {found!r}. {fix}.")
        return read
    kernels, functions = data.get("entries", []), data.get("functions", [])
    if not isinstance(kernels, list) or not isinstance(functions, list):
        _warn(f"ignoring the shipped config file {path}: 'entries' and 'functions' must be lists. {fix}.")
        return read
    bad: list[str] = []
    for i, entry in enumerate(kernels):
        problem = entry_problem(entry)
        if problem is not None:
            bad.append(f"entries[{i}]: {problem}")
            continue
        ident = entry["identity"]
        shipped = Shipped(path, entry)
        read.kernels.setdefault(entry["id"], shipped)
        read.kernel_keys.setdefault((ident["kernel"], ident["key"]), []).append(shipped)
    for i, entry in enumerate(functions):
        ident = entry.get("identity") if isinstance(entry, dict) else None
        if not (isinstance(ident, dict) and isinstance(ident.get("function"), str)
                and isinstance(ident.get("key"), str)):
            bad.append(f"functions[{i}]: not a function-level entry (no identity with a function and a key)")
            continue
        try:
            eid = entry_id(ident)
        except (TypeError, ValueError) as e:
            bad.append(f"functions[{i}]: its identity cannot be hashed ({e})")
            continue
        shipped = Shipped(path, entry)
        read.functions.setdefault(eid, shipped)
        read.function_keys.setdefault((ident["function"], ident["key"]), []).append(shipped)
    if bad:
        _warn(f"the shipped config file {path}: skipping {len(bad)} invalid entr{'y' if len(bad) == 1 else 'ies'} ("
              + "; ".join(bad[:3]) + (" ..." if len(bad) > 3 else "") + f"). {fix}.")
    return read


class ShippedConfigs:
    """The shipped files of some directories, in search order: the first file holding an entry wins."""

    def __init__(self, dirs: Sequence[Path], named_by: str) -> None:
        self.dirs = tuple(dirs)
        self.named_by = named_by

    @classmethod
    def of(cls, config_path: PathLike | Sequence[PathLike] | None) -> ShippedConfigs | None:
        dirs, named_by = directories(config_path)
        return cls(dirs, named_by) if dirs else None

    def files(self) -> list[_File]:
        """Every shipped file on the path, each parsed once per (mtime, size)."""
        found: list[_File] = []
        with _lock:
            for d in self.dirs:
                try:
                    names = sorted(p for p in d.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith("."))
                except OSError as e:
                    if d not in _warned_dirs:
                        _warned_dirs.add(d)
                        what = "does not exist" if isinstance(e, FileNotFoundError) else (
                            "is not a directory" if isinstance(e, NotADirectoryError) else f"cannot be read ({e})")
                        _warn(f"the shipped-config directory {d} ({self.named_by}) {what}; its configs are not "
                              f"used. Fix: point {self.named_by} at the directory `cache export --ship` wrote "
                              "(check the spelling), or remove it from the path.")
                    continue
                for path in names:
                    try:
                        st = path.stat()
                    except OSError:
                        continue  # removed meanwhile
                    stamp = (st.st_mtime_ns, st.st_size)
                    cached = _files.get(path)
                    if cached is None or cached.stamp != stamp:
                        cached = _files[path] = _read(path, stamp)
                    found.append(cached)
        return found

    def kernel(self, eid: str) -> Shipped | None:
        return next((f.kernels[eid] for f in self.files() if eid in f.kernels), None)

    def kernel_others(self, kernel: str, key: str) -> list[Shipped]:
        """Entries of this kernel and key (any identity), for saying why none applies."""
        return [s for f in self.files() for s in f.kernel_keys.get((kernel, key), [])]

    def kernel_entries(self, kernel: str) -> list[Shipped]:
        """Every entry of this kernel, any key, in search order (freeze borrows the nearest key's winner)."""
        return [s for f in self.files() for (k, _), entries in f.kernel_keys.items() if k == kernel for s in entries]

    def function(self, eid: str) -> Shipped | None:
        return next((f.functions[eid] for f in self.files() if eid in f.functions), None)

    def function_others(self, function: str, key: str) -> list[Shipped]:
        return [s for f in self.files() for s in f.function_keys.get((function, key), [])]
