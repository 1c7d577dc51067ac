"""Tuning options: the decorator's arguments, checked once, with environment defaults."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

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


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() not in ("", "0", "false", "no", "off")


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
