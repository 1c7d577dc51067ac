"""Tuning options: the decorator's arguments, checked once, with environment defaults."""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# compile_workers owns its variable's parsing; options only reads it (imports run this way only).
from .compile.compile_workers import default_workers, env_compile_workers, started_workers
from .errors import InvalidOptionError, UnknownOptionError
from .runtime.buckets import Buckets, Rule
from .store.cache import resolve_dir
from .store.shipped import ENV as CONFIG_PATH_ENV
from .store.shipped import ShippedConfigs, is_path_value
from .tools.logs import DEFAULT_LOG_DIR

REDUCTIONS = ("max", "mean")
STATISTICS = ("median", "mean", "min")
OBJECTIVES = ("auto", "per_launch", "end_to_end")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidOptionError(name, raw, "a number of seconds, e.g. 120") from None
    if not value > 0:  # also NaN; "inf" is allowed and means no limit
        raise InvalidOptionError(name, raw, "a number of seconds greater than 0")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _has_cuda_graphs() -> bool:
    import torch

    from .runtime.compat import interpret_mode

    return torch.cuda.is_available() and not interpret_mode()


def _env_flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value == "":
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    # Anything else used to count as "on": TRITON_CTX_TUNE_CACHE=ture must not silently mean something.
    raise InvalidOptionError(name, raw, "1 or 0 (or true/false, yes/no, on/off); unset for the default")


DEFAULT_EARLY_STOP = 1.5
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_COMPILE_TIMEOUT_S = 600.0
DEFAULT_SLOT_TIMEOUT_S = 600.0
DEFAULT_E2E_RUNS = 3
DEFAULT_SNAPSHOT_LIMIT_MB = 4096.0


def _is_factor(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1


def _env_early_stop() -> float | None:
    raw = os.environ.get("TRITON_CTX_TUNE_EARLY_STOP", "")
    value = raw.strip().lower()
    if value in ("",) + _TRUE:
        return DEFAULT_EARLY_STOP
    if value in _FALSE:
        return None
    try:
        factor = float(value)
    except ValueError:
        factor = 0.0
    if not _is_factor(factor) or factor == float("inf"):
        raise InvalidOptionError("TRITON_CTX_TUNE_EARLY_STOP", raw,
                                 "a factor > 1 such as 1.5, 1/on for the default 1.5, or 0/off to turn it off")
    return factor


def env_snapshot_limit_mb() -> float:
    """TRITON_CTX_TUNE_SNAPSHOT_LIMIT_MB: MiB >= 0 (inf: no limit); unset: 4096."""
    raw = os.environ.get("TRITON_CTX_TUNE_SNAPSHOT_LIMIT_MB", "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_SNAPSHOT_LIMIT_MB
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise InvalidOptionError("TRITON_CTX_TUNE_SNAPSHOT_LIMIT_MB", raw,
                                 "a number of MiB >= 0 (inf: no limit); unset for 4096")
    return value


_BUDGET_UNITS = {"s": "seconds", "sec": "seconds", "secs": "seconds", "second": "seconds", "seconds": "seconds",
                 "execution": "executions", "executions": "executions", "run": "executions", "runs": "executions",
                 "compile": "compiles", "compiles": "compiles", "config": "compiles", "configs": "compiles"}
BUDGET_EXPECTED = ("a number of seconds > 0 (budget=30.0), Budget(executions=200) or \"200 executions\", "
                   "Budget(compiles=50) or \"50 compiles\", Budget(seconds=30) or \"30 s\"; or None for no budget")


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much tuning one kernel key may cost (engine/budget.py), or with a function space (autotune()) the
    whole call: exactly one field is set.

    A key whose config list is larger than the budget covers is searched in rungs (a spread sample,
    successive halving, a local search over neighbouring tile sizes, a final re-timing of the best few)
    instead of timing every config; configs it never chooses are never compiled. Under autotune() each
    point's keys get an equal share, and once the call's seconds or executions are spent (rank 0's
    measure, followed by every rank) whatever is still open is decided on the samples taken.
    """
    # Wall-clock seconds from the key's first launch, as rank 0 measures them: rank 0 sizes each rung from
    # its own elapsed time and broadcasts the rung, so every rank follows the same plan. The first rung is
    # fixed (8 configs, 16 with compile workers: it measures what a config costs); the budget can be overrun
    # by at most one rung.
    seconds: float | None = None
    # Measured runs of the key's configs, warm-ups included: one launch for a key timed per launch, one
    # whole execution of the function for a key timed end to end. Exact: the key takes at most this many
    # slots, and all of them when its space is larger than the budget covers. At least 4.
    executions: int | None = None
    # Distinct configs compiled and run (a config's first run compiles it). Exact: at most this many, and
    # exactly this many when the space has more. Each explored config is re-timed at most n_repeat times.
    compiles: int | None = None

    def __post_init__(self) -> None:
        given = [(n, v) for n, v in (("seconds", self.seconds), ("executions", self.executions),
                                    ("compiles", self.compiles)) if v is not None]
        if len(given) != 1:
            raise InvalidOptionError("budget", self, "exactly one of seconds=, executions=, compiles= in Budget(...)")
        name, value = given[0]
        if name == "seconds":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise InvalidOptionError("budget", self, "Budget(seconds=S) with a finite S > 0")
            object.__setattr__(self, "seconds", float(value))
        elif isinstance(value, bool) or not isinstance(value, int) or value < (4 if name == "executions" else 2):
            raise InvalidOptionError("budget", self, "Budget(executions=N) with an int N >= 4 (two configs, each a "
                                     "warm-up and a timed run)" if name == "executions" else
                                     "Budget(compiles=N) with an int N >= 2 (two configs to compare)")

    @property
    def measure(self) -> str:
        return "seconds" if self.seconds is not None else "executions" if self.executions is not None else "compiles"

    @property
    def limit(self) -> float:
        value = self.seconds if self.seconds is not None else self.executions \
            if self.executions is not None else self.compiles
        assert value is not None
        return float(value)

    def __str__(self) -> str:
        return f"{self.limit:g} {self.measure}"

    @classmethod
    def parse(cls, value: object) -> Budget | None:
        """budget='s value: None, a Budget, a number of seconds, or a string "<number> <unit>"."""
        if value is None or isinstance(value, Budget):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not 0 < value < float("inf"):
                raise InvalidOptionError("budget", value, "a number of seconds > 0 and finite, e.g. budget=30.0")
            return cls(seconds=float(value))
        if isinstance(value, str):
            m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]+)\s*", value)
            unit = _BUDGET_UNITS.get(m.group(2).lower()) if m else None
            if m is None or unit is None:
                raise InvalidOptionError("budget", value, BUDGET_EXPECTED)
            number = float(m.group(1))
            if unit == "seconds":
                return cls(seconds=number) if number > 0 else cls.parse(-1.0)
            if number != int(number):
                raise InvalidOptionError("budget", value, f"a whole number of {unit}, e.g. \"200 {unit}\"")
            return cls(**{unit: int(number)})
        raise InvalidOptionError("budget", value, BUDGET_EXPECTED)


# Every environment variable the package reads, with the function that reads it (tests hold the
# table in docs/options.md to this list). Paths take any text, so theirs check nothing.
ENVIRONMENT: dict[str, Callable[[], object]] = {
    "TRITON_CTX_TUNE_CACHE": lambda: _env_flag("TRITON_CTX_TUNE_CACHE", default=True),
    "TRITON_CTX_TUNE_RETUNE": lambda: _env_flag("TRITON_CTX_TUNE_RETUNE"),
    "TRITON_CTX_TUNE_PRECOMPILE": lambda: _env_flag("TRITON_CTX_TUNE_PRECOMPILE", default=True),
    "TRITON_CTX_TUNE_QUARANTINE": lambda: _env_flag("TRITON_CTX_TUNE_QUARANTINE", default=True),
    "TRITON_CTX_TUNE_QUIET": lambda: _env_flag("TRITON_CTX_TUNE_QUIET"),
    "TRITON_CTX_TUNE_EARLY_STOP": _env_early_stop,
    "TRITON_CTX_TUNE_TIMEOUT": lambda: _env_float("TRITON_CTX_TUNE_TIMEOUT", DEFAULT_TIMEOUT_S),
    "TRITON_CTX_TUNE_COMPILE_TIMEOUT": lambda: _env_float("TRITON_CTX_TUNE_COMPILE_TIMEOUT", DEFAULT_COMPILE_TIMEOUT_S),
    "TRITON_CTX_TUNE_SLOT_TIMEOUT": lambda: _env_float("TRITON_CTX_TUNE_SLOT_TIMEOUT", DEFAULT_SLOT_TIMEOUT_S),
    "TRITON_CTX_TUNE_COMPILE_WORKERS": env_compile_workers,
    "TRITON_CTX_TUNE_SNAPSHOT_LIMIT_MB": env_snapshot_limit_mb,
    "TRITON_CTX_TUNE_FREEZE": lambda: _env_flag("TRITON_CTX_TUNE_FREEZE"),
    "TRITON_CTX_TUNE_CONFIRM": lambda: _env_flag("TRITON_CTX_TUNE_CONFIRM", default=True),
    "TRITON_CTX_TUNE_SPLIT_SCREENING": lambda: _env_flag("TRITON_CTX_TUNE_SPLIT_SCREENING", default=True),
    "TRITON_CTX_TUNE_LOG_DIR": lambda: None,
    "TRITON_CTX_TUNE_CACHE_DIR": lambda: None,
    CONFIG_PATH_ENV: lambda: None,  # a missing directory on it is a warning when it is searched, not an error
}


def check_environment() -> None:
    """Read every variable now, so a bad value fails where the decorator is built. Read lazily, it
    would pass unnoticed in every call that never needs it (one whose keys are all cached, say)."""
    for check in ENVIRONMENT.values():
        check()


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    is_dist: bool = False
    n_repeat: int = 5
    n_warmup: int = 3
    group: Any = None
    reduce: str = "max"
    stat: str = "median"
    # "step" (the default): L2 flushed once as each re-execution starts, so a kernel meets the cache its producers in
    # the function leave it (a GELU reads its GEMM's output from L2, as in the program). True: before every timed
    # launch, as Triton's _bench does (each kernel as if alone). False: never.
    flush_l2: bool | str = "step"
    log_dir: str | os.PathLike[str] | None | bool = None  # None: env or ./.autotune_logs; False: no logs
    quiet: bool | None = None  # None: TRITON_CTX_TUNE_QUIET
    timeout_s: float | None = None  # None: TRITON_CTX_TUNE_TIMEOUT or 300
    max_executions: int = 10_000
    cache: bool | None = None  # None: TRITON_CTX_TUNE_CACHE, on unless it is 0
    cache_dir: str | os.PathLike[str] | None = None  # None: TRITON_CTX_TUNE_CACHE_DIR or ~/.cache/triton_ctx_tune
    # Directories of tuned-config files shipped with a library (`cache export --ship`), searched on a
    # cache miss before tuning: user cache > shipped file > tune. A directory, or a list of them, in
    # order. None: TRITON_CTX_TUNE_CONFIG_PATH (os.pathsep-separated), else none. Off with the cache.
    config_path: (str | os.PathLike[str] | list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...]
                  | None) = None
    early_stop: float | bool | None = None  # None: TRITON_CTX_TUNE_EARLY_STOP or 1.5; False: off
    precompile: bool | None = None  # None: TRITON_CTX_TUNE_PRECOMPILE, on unless it is 0
    compile_threads: int | None = None  # None: cores / local ranks, at most 32
    # Compile worker processes of this rank (compile_workers.py): forked from a zygote that the package's
    # import (or a decoration) starts, kept for every later key, they compile in parallel where threads
    # hold the GIL. 0: threads only. None: TRITON_CTX_TUNE_COMPILE_WORKERS, else the pool
    # start_compile_workers() started, else one per core the rank may use (the node's cores shared among
    # its local ranks, at most 32).
    compile_workers: int | None = None
    # Seconds one config may spend compiling during precompilation; a config that takes longer is
    # invalid on every rank and its compile is abandoned (a compiler that hangs on one config must
    # not hang the job). None: TRITON_CTX_TUNE_COMPILE_TIMEOUT or 600; math.inf: no limit.
    compile_timeout_s: float | None = None
    # Time each timed slot as replays of a CUDA graph holding the launch (on clones of its tensors),
    # for kernels deployed under graphs, where launch overhead is gone. Needs a CUDA GPU.
    cuda_graph: bool = False
    # Note each config's first launch on disk before it runs, so that a config that kills the process is
    # skipped by every later run (quarantine.py). None: TRITON_CTX_TUNE_QUARANTINE, on unless it is 0.
    quarantine: bool | None = None
    # Seconds one slot may run before its rank is declared hung: it names the kernel, key and config on
    # stderr and ends its process (exit code 124), and the config is quarantined. Needs quarantine.
    # None: TRITON_CTX_TUNE_SLOT_TIMEOUT or 600.
    slot_timeout_s: float | None = None
    # How a kernel's configs are compared: "per_launch" times each launch alone (CUDA events around
    # it); "end_to_end" times whole executions of the function, one key varying per step while the
    # others run their best so far, so that kernels overlapped on different streams are judged
    # together, contention included. Costs one step (e2e_runs executions when timed) per slot instead
    # of one launch. "auto" (the default) times per launch, and confirms a key that overlapped another
    # stream's work (runtime/streams.py) end to end, for its close candidates only (engine/decisions.py);
    # re-execution only: online calls confirm per launch.
    objective: str = "auto"
    # Confirmation of close candidates: before a key timed per launch is decided, the configs within
    # a few percent of the fastest (twice the tie band, 3% to 10%) are re-timed, interleaved, in
    # max(3, n_repeat) more slots each (a noisy key: up to 20, enough to resolve 1%, except online), and the
    # decision uses all of each candidate's samples, its tie band narrowed by the rounds' square root. None:
    # TRITON_CTX_TUNE_CONFIRM, on unless it is 0.
    confirm: bool | None = None
    # Split screening (several ranks, early_stop on): the screening pass gives each rank a different
    # share of a key's configs, so one execution screens W configs; the survivors are then timed in
    # lockstep on every rank, and any dropped config whose one-rank screening time is within early_stop
    # of the lockstep winner's is timed in lockstep too. None: TRITON_CTX_TUNE_SPLIT_SCREENING, on
    # unless it is 0.
    split_screening: bool | None = None
    # Executions in one end-to-end timed step (a point of a space, or objective="end_to_end"), back
    # to back on the stream, each between its own CUDA events. The first lines the ranks' GPUs up (a
    # collective in it waits for the last rank to arrive) and is not a sample; each later one is a
    # sample taken as in a busy program, the GPU already working when its launches are enqueued.
    # None: 3 where CUDA events time the step, 1 on the host clock (the interpreter).
    e2e_runs: int | None = None
    # Output validation (validate.py): each config must reproduce the reference result, or it is
    # invalid on every rank. The reference is the result with every kernel on its first config, or
    # `reference(*args, **kwargs)` when given; `compare(result, reference) -> bool` replaces the
    # element-wise check (|result - reference| <= atol + rtol * |reference| on all but
    # max_mismatch_ratio of the elements). Costs one execution per config, before timing starts.
    validate: bool = False
    reference: Callable[..., Any] | None = None
    compare: Callable[[Any, Any], bool] | None = None
    atol: float = 1e-3
    rtol: float = 1e-3
    max_mismatch_ratio: float = 0.0
    # Exactly once (exactly_once.py): a tuning call's net effect on state older than the call (tensors,
    # .grad, optimizer state, buffers, the RNGs) is one plain execution's. Each execution's writes are
    # undone before the next; the final run applies them. False: re-executions compound, as in
    # Triton-distributed's tuner (for functions known to write only their own outputs).
    exactly_once: bool = True
    # The most the copies behind exactly_once may hold, in MiB (one copy of each storage the function
    # writes that is older than the call). Above it, the call stops before its second execution with
    # StateNotRestorableError, state untouched. None: TRITON_CTX_TUNE_SNAPSHOT_LIMIT_MB, else 4096.
    snapshot_limit_mb: float | None = None
    # Online tuning: the function runs exactly once per call, never re-executed. Each call's launches
    # take their keys' next slots (the same plan as re-execution: warm-ups, screening, survivors),
    # timed per launch in the call itself; each call's end agrees across ranks and decides what is
    # due. Once every key is decided, calls take the warm path. For training loops and servers whose
    # calls cannot be repeated. Not with validate=True, objective="end_to_end", cuda_graph=True or a
    # function-level space (each needs repeated executions).
    online: bool = False
    # Shape buckets (runtime/buckets.py): {"M": "pow2"}, {"M": [1, 16, 128, 1024]} or {"M": callable}.
    # A key whose bucketed dimensions fall into a tuned bucket runs that bucket's winner, with no
    # tuning; a new bucket is tuned on the shape that first meets it (or on its representative, by
    # tune_ahead). Names match the kernels' @triton.autotune key names, and autotune()'s key_fn
    # when it returns a dict. None: every distinct key is tuned.
    buckets: dict[str, Rule] | None = None
    # Serving: a call never tunes. A key with no tuned result (Autotuner.cache, the tuning cache, a
    # shipped file) runs the winner of the nearest tuned key of the same kernel (its bucketed
    # dimensions closest on a log scale, everything else equal), else the kernel's first config; the
    # miss is logged once per key and counted by `report`. None: TRITON_CTX_TUNE_FREEZE, else off.
    freeze: bool | None = None
    # The work of one call, for throughput next to latency: flops(*args, **kwargs) and
    # bytes(*args, **kwargs) return the call's floating-point operations and bytes moved; tune_ahead's
    # table and `report` then show TFLOP/s, GB/s and the fraction of the device's peak.
    flops: Callable[..., float] | None = None
    bytes: Callable[..., float] | None = None
    # Budgeted search (engine/budget.py, docs/search.md): how much each kernel key's tuning may cost (with
    # a function space, autotune(): the whole call), for config spaces too large to time whole. A Budget, a
    # number of seconds (budget=30.0), or a string: "200 executions", "50 compiles", "30 s". None (the
    # default): every config is timed.
    budget: Budget | float | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", Budget.parse(self.budget))
        if self.budget is not None and (self.online or self.validate):
            raise InvalidOptionError("budget", str(self.budget), "None with " + ("online=True (a budgeted search "
                                     "decides in rungs that re-execute the function)" if self.online else
                                     "validate=True (validation runs every config, which a budget would not)"))
        object.__setattr__(self, "_bucketing", None if self.buckets is None else Buckets(self.buckets))
        if self.freeze is not None and not isinstance(self.freeze, bool):
            raise InvalidOptionError("freeze", self.freeze,
                                     "True, False or None (None: TRITON_CTX_TUNE_FREEZE decides)")
        if self.split_screening is not None and not isinstance(self.split_screening, bool):
            raise InvalidOptionError("split_screening", self.split_screening, "True, False or None (None: "
                                     "TRITON_CTX_TUNE_SPLIT_SCREENING decides, on unless it is 0)")
        if self.confirm is not None and not isinstance(self.confirm, bool):
            raise InvalidOptionError("confirm", self.confirm, "True, False or None (None: TRITON_CTX_TUNE_CONFIRM "
                                     "decides, on unless it is 0)")
        for name in ("flops", "bytes"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise InvalidOptionError(name, getattr(self, name), f"a callable {name}(*args, **kwargs) -> number "
                                         "taking the tuned function's arguments, or None")
        if self.e2e_runs is not None and (isinstance(self.e2e_runs, bool) or not isinstance(self.e2e_runs, int)
                                          or self.e2e_runs < 1):
            raise InvalidOptionError("e2e_runs", self.e2e_runs, "an int >= 1, or None for the default")
        for name in ("n_repeat", "n_warmup", "max_executions"):
            value = getattr(self, name)
            lowest = 0 if name == "n_warmup" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise InvalidOptionError(name, value, f"an int >= {lowest}")
        if self.slot_timeout_s is not None and (isinstance(self.slot_timeout_s, bool) or not isinstance(
                self.slot_timeout_s, (int, float)) or not self.slot_timeout_s > 0):
            raise InvalidOptionError("slot_timeout_s", self.slot_timeout_s,
                                     "a number of seconds greater than 0, or None for the default")
        if self.quarantine is not None and not isinstance(self.quarantine, bool):
            raise InvalidOptionError("quarantine", self.quarantine, "True, False or None")
        if not isinstance(self.cuda_graph, bool):
            raise InvalidOptionError("cuda_graph", self.cuda_graph, "True or False")
        if self.cuda_graph and not _has_cuda_graphs():
            raise InvalidOptionError("cuda_graph", True, "False here: graph replays need a CUDA GPU, and kernels "
                                     "under TRITON_INTERPRET=1 run on the host")
        if not isinstance(self.validate, bool):
            raise InvalidOptionError("validate", self.validate, "True or False")
        for name in ("reference", "compare"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise InvalidOptionError(name, getattr(self, name), "a callable, or None")
        for name in ("atol", "rtol", "max_mismatch_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InvalidOptionError(name, value, "a number >= 0")
        if self.max_mismatch_ratio > 1:
            raise InvalidOptionError("max_mismatch_ratio", self.max_mismatch_ratio, "a fraction between 0 and 1")
        if (self.reference is not None or self.compare is not None) and not self.validate:
            raise InvalidOptionError("validate", False, "True when reference= or compare= is given (they are "
                                     "used only by validation)")
        if self.objective not in OBJECTIVES:
            raise InvalidOptionError("objective", self.objective, " or ".join(map(repr, OBJECTIVES)))
        if not isinstance(self.is_dist, bool):
            raise InvalidOptionError("is_dist", self.is_dist, "True or False")
        if not (isinstance(self.flush_l2, bool) or self.flush_l2 == "step"):
            raise InvalidOptionError("flush_l2", self.flush_l2, '"step" (once per re-execution, the default), '
                                     'True (before every timed launch) or False')
        if self.reduce not in REDUCTIONS:
            raise InvalidOptionError("reduce", self.reduce, " or ".join(map(repr, REDUCTIONS)))
        if self.stat not in STATISTICS:
            raise InvalidOptionError("stat", self.stat, " or ".join(map(repr, STATISTICS)))
        if self.timeout_s is not None and not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise InvalidOptionError("timeout_s", self.timeout_s, "a number of seconds greater than 0")
        if self.cache is not None and not isinstance(self.cache, bool):
            raise InvalidOptionError("cache", self.cache, "True, False or None (None: TRITON_CTX_TUNE_CACHE decides)")
        if not (self.early_stop is None or self.early_stop is False or _is_factor(self.early_stop)):
            raise InvalidOptionError("early_stop", self.early_stop,
                                     "a factor > 1 (keep configs within it of the best), False to turn it off, or None")
        if self.precompile is not None and not isinstance(self.precompile, bool):
            raise InvalidOptionError("precompile", self.precompile, "True, False or None")
        if self.compile_threads is not None and (isinstance(self.compile_threads, bool)
                                                 or not isinstance(self.compile_threads, int)
                                                 or self.compile_threads < 1):
            raise InvalidOptionError("compile_threads", self.compile_threads, "an int >= 1, or None for the default")
        if self.compile_workers is not None and (isinstance(self.compile_workers, bool)
                                                 or not isinstance(self.compile_workers, int)
                                                 or self.compile_workers < 0):
            raise InvalidOptionError("compile_workers", self.compile_workers,
                                     "an int >= 0 (0: compile on threads only), or None for the default")
        if self.compile_timeout_s is not None and (isinstance(self.compile_timeout_s, bool) or not isinstance(
                self.compile_timeout_s, (int, float)) or not self.compile_timeout_s > 0):
            raise InvalidOptionError("compile_timeout_s", self.compile_timeout_s,
                                     "a number of seconds greater than 0 (math.inf: no limit), or None for the default")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise InvalidOptionError("cache_dir", self.cache_dir, "a directory path, or None for the default")
        if not is_path_value(self.config_path):
            raise InvalidOptionError("config_path", self.config_path, "a directory path or a list of them (where "
                                     "`cache export --ship` wrote the files), or None for TRITON_CTX_TUNE_CONFIG_PATH")
        if isinstance(self.config_path, list):  # frozen: a list would stay shared with the caller's
            object.__setattr__(self, "config_path", tuple(self.config_path))
        if not isinstance(self.exactly_once, bool):
            raise InvalidOptionError("exactly_once", self.exactly_once, "True or False")
        if self.snapshot_limit_mb is not None and (isinstance(self.snapshot_limit_mb, bool) or not isinstance(
                self.snapshot_limit_mb, (int, float)) or not self.snapshot_limit_mb >= 0):
            raise InvalidOptionError("snapshot_limit_mb", self.snapshot_limit_mb,
                                     "a number of MiB >= 0 (math.inf: no limit), or None for the default")
        if not isinstance(self.online, bool):
            raise InvalidOptionError("online", self.online, "True or False")
        if self.online:
            for name, value, why in (("validate", self.validate, "validation compares re-executions of one call"),
                                     ("objective", self.objective == "end_to_end", "an end-to-end sample is a "
                                      "whole execution per config"),
                                     ("cuda_graph", self.cuda_graph, "a graph replay runs each launch several times")):
                if value:
                    raise InvalidOptionError("online", True, f"False with {name}={getattr(self, name)!r} ({why}); "
                                             f"tune online with the default {name}, or re-execute (online=False)")
        check_environment()

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> TuneOptions:
        """contextual_autotune's keywords, checked; a misspelt one is answered with the closest name."""
        valid = [f.name for f in dataclasses.fields(cls)]
        for name, value in kwargs.items():
            if name not in valid:
                closest = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
                raise UnknownOptionError(name, value, valid, closest[0] if closest else None)
        return cls(**kwargs)

    def resolved_log_dir(self) -> str | os.PathLike[str] | None:
        if self.log_dir is False:
            return None
        if self.log_dir is None or self.log_dir is True:
            return os.environ.get("TRITON_CTX_TUNE_LOG_DIR") or DEFAULT_LOG_DIR
        return self.log_dir

    def resolved_quiet(self) -> bool:
        return _env_flag("TRITON_CTX_TUNE_QUIET") if self.quiet is None else bool(self.quiet)

    def resolved_timeout(self) -> float:
        if self.timeout_s is None:
            return _env_float("TRITON_CTX_TUNE_TIMEOUT", DEFAULT_TIMEOUT_S)
        return float(self.timeout_s)

    def resolved_compile_timeout(self) -> float:
        if self.compile_timeout_s is not None:
            return float(self.compile_timeout_s)
        return _env_float("TRITON_CTX_TUNE_COMPILE_TIMEOUT", DEFAULT_COMPILE_TIMEOUT_S)

    def resolved_compile_workers(self) -> int:
        """How many compile worker processes this rank uses (0: threads only; none under the interpreter)."""
        from .runtime.compat import interpret_mode

        if interpret_mode():
            return 0  # nothing is compiled there
        n = env_compile_workers() if self.compile_workers is None else self.compile_workers
        if n is None:
            # On by default since workers are forked from a zygote started before the call: they no
            # longer import torch while the first call compiles (which, on 2 H200 ranks, made the FLA
            # step 30 s instead of 25 s when each worker imported it for itself).
            return started_workers() or default_workers()
        return n

    def resolved_cache_dir(self) -> Path | None:
        """Where tuned results persist, or None when the cache is off."""
        enabled = _env_flag("TRITON_CTX_TUNE_CACHE", default=True) if self.cache is None else self.cache
        return resolve_dir(self.cache_dir) if enabled else None

    def resolved_shipped(self) -> ShippedConfigs | None:
        """The shipped config files to search on a cache miss, or None (no path, or the cache is off)."""
        if self.resolved_cache_dir() is None:
            return None
        return ShippedConfigs.of(self.config_path)

    def resolved_early_stop(self) -> float | None:
        """The screening factor, or None when every config gets every slot."""
        if self.early_stop is False:
            return None
        if self.early_stop is not None and self.early_stop is not True:
            return float(self.early_stop)
        return _env_early_stop()

    def resolved_precompile(self) -> bool:
        return _env_flag("TRITON_CTX_TUNE_PRECOMPILE", default=True) if self.precompile is None else self.precompile

    def resolved_slot_timeout(self) -> float:
        if self.slot_timeout_s is not None:
            return float(self.slot_timeout_s)
        return _env_float("TRITON_CTX_TUNE_SLOT_TIMEOUT", DEFAULT_SLOT_TIMEOUT_S)

    def resolved_quarantine(self) -> bool:
        return _env_flag("TRITON_CTX_TUNE_QUARANTINE", default=True) if self.quarantine is None else self.quarantine

    def resolved_snapshot_limit(self) -> float | None:
        """exactly_once's budget in MiB; None: no limit."""
        mb = env_snapshot_limit_mb() if self.snapshot_limit_mb is None else self.snapshot_limit_mb
        return None if mb == float("inf") else float(mb)

    def resolved_e2e_runs(self, timer_kind: str) -> int:
        """Executions per end-to-end timed step; timer_kind is timing.py's (the same on every rank)."""
        if self.e2e_runs is not None:
            return self.e2e_runs
        return 1 if timer_kind == "host" else DEFAULT_E2E_RUNS

    @property
    def bucketing(self) -> Buckets | None:
        """The checked rules of `buckets` (runtime/buckets.py), built once with the options."""
        return self.__dict__["_bucketing"]

    def resolved_confirm(self) -> bool:
        return _env_flag("TRITON_CTX_TUNE_CONFIRM", default=True) if self.confirm is None else self.confirm

    def resolved_split_screening(self) -> bool:
        if self.split_screening is None:
            return _env_flag("TRITON_CTX_TUNE_SPLIT_SCREENING", default=True)
        return self.split_screening

    def resolved_freeze(self) -> bool:
        return _env_flag("TRITON_CTX_TUNE_FREEZE") if self.freeze is None else self.freeze

    def resolved_budget(self) -> Budget | None:
        """The checked budget (__post_init__ parsed every spelling into a Budget), or None."""
        return self.budget if isinstance(self.budget, Budget) else None

    def resolved_retune(self) -> bool:
        return _env_flag("TRITON_CTX_TUNE_RETUNE")
