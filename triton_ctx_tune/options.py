"""Tuning options: the decorator's arguments, checked once, with environment defaults."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from .cache import resolve_dir
from .errors import InvalidOptionError
from .logs import DEFAULT_LOG_DIR

REDUCTIONS = ("max", "mean")
STATISTICS = ("median", "mean", "min")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidOptionError(name, raw, "a number of seconds, e.g. 120") from None
    if value <= 0:
        raise InvalidOptionError(name, raw, "a number of seconds greater than 0")
    return value


def _env_flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    return default if raw == "" else raw not in ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    is_dist: bool = False
    n_repeat: int = 5
    n_warmup: int = 3
    group: Any = None
    reduce: str = "max"
    stat: str = "median"
    flush_l2: bool = True
    log_dir: str | os.PathLike[str] | None | bool = None  # None: env or ./.autotune_logs; False: no logs
    quiet: bool | None = None  # None: TRITON_CTX_TUNE_QUIET
    timeout_s: float | None = None  # None: TRITON_CTX_TUNE_TIMEOUT or 300
    max_executions: int = 10_000
    cache: bool | None = None  # None: TRITON_CTX_TUNE_CACHE, on unless it is 0
    cache_dir: str | os.PathLike[str] | None = None  # None: TRITON_CTX_TUNE_CACHE_DIR or ~/.cache/triton_ctx_tune

    def __post_init__(self) -> None:
        for name in ("n_repeat", "n_warmup", "max_executions"):
            value = getattr(self, name)
            lowest = 0 if name == "n_warmup" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise InvalidOptionError(name, value, f"an int >= {lowest}")
        if not isinstance(self.is_dist, bool):
            raise InvalidOptionError("is_dist", self.is_dist, "True or False")
        if self.reduce not in REDUCTIONS:
            raise InvalidOptionError("reduce", self.reduce, " or ".join(map(repr, REDUCTIONS)))
        if self.stat not in STATISTICS:
            raise InvalidOptionError("stat", self.stat, " or ".join(map(repr, STATISTICS)))
        if self.timeout_s is not None and not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise InvalidOptionError("timeout_s", self.timeout_s, "a number of seconds greater than 0")
        if self.cache is not None and not isinstance(self.cache, bool):
            raise InvalidOptionError("cache", self.cache, "True, False or None (None: TRITON_CTX_TUNE_CACHE decides)")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise InvalidOptionError("cache_dir", self.cache_dir, "a directory path, or None for the default")

    def resolved_log_dir(self) -> str | os.PathLike[str] | None:
        if self.log_dir is False:
            return None
        if self.log_dir is None or self.log_dir is True:
            return os.environ.get("TRITON_CTX_TUNE_LOG_DIR") or DEFAULT_LOG_DIR
        return self.log_dir

    def resolved_quiet(self) -> bool:
        return _env_flag("TRITON_CTX_TUNE_QUIET") if self.quiet is None else bool(self.quiet)

    def resolved_timeout(self) -> float:
        return _env_float("TRITON_CTX_TUNE_TIMEOUT", 300.0) if self.timeout_s is None else float(self.timeout_s)

    def resolved_cache_dir(self) -> Path | None:
        """Where tuned results persist, or None when the cache is off."""
        enabled = _env_flag("TRITON_CTX_TUNE_CACHE", default=True) if self.cache is None else self.cache
        return resolve_dir(self.cache_dir) if enabled else None

    def resolved_retune(self) -> bool:
        return _env_flag("TRITON_CTX_TUNE_RETUNE")
