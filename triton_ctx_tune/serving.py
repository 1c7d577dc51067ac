"""Tune ahead: every shape a server will meet is tuned before it serves, so no request waits for tuning.

`fn.tune_ahead(sizes, inputs_for)` calls the tuned function once per size with the inputs the
factory builds; each call tunes the keys it meets (or finds them in the caches), in lockstep on
every rank when the function has collectives of its own. With `spread=True` (a function without
collectives, on a job of several GPUs: a data-parallel server) each rank tunes a share of the
sizes alone, and the ranks then hand each other their results through the tuning cache, so every
rank ends with every winner. Each size's warm call is then timed, and with the work of a call
(options flops=, bytes=) its throughput is set against the device's peak.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from .errors import InvalidOptionError, UserHookError, call_hook
from .options import TuneOptions
from .runtime.collectives import Collectives
from .runtime.compat import interpret_mode
from .runtime.devices import peak
from .store.cache import CacheEntryError, read_entry, write_entry
from .tools.logs import RankLog, ahead_table


class ContextualAutotuner(Protocol):
    """What tune-ahead needs of a tuned function (tuner.ContextualAutotuner, which calls it)."""
    opts: TuneOptions
    name: str

    @property
    def last_call(self) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclass
class AheadRow:
    """One size of a tune-ahead: what tuning it cost, and what a warm call of it costs and achieves."""
    size: int
    rank: int  # the rank that tuned it (spread), else 0
    executions: int
    tuned: int  # keys tuned by its call
    cache_hits: int
    tune_s: float
    call_ms: float | None  # median warm call, synchronized
    tflops: float | None = None
    gbps: float | None = None
    # of the device's dense bf16 TFLOP/s or its memory bandwidth, whichever is nearer
    peak_fraction: float | None = None


Inputs = tuple[tuple, dict[str, Any]]


def inputs_from(inputs_for: Callable[[int], Any] | None, example: Sequence[Any] | None,
                resize: dict[int, int] | None) -> Callable[[int], Inputs]:
    """The factory of one size's inputs: the user's, or the example's tensors resized along `resize`'s dims."""
    if (inputs_for is None) == (example is None):
        raise InvalidOptionError("tune_ahead(inputs_for=..., example=...)", (inputs_for, example),
                                 "exactly one of them: inputs_for(size) returning the call's arguments, or example="
                                 "(args...) with resize={arg_position: dim} to resize its tensors")
    if inputs_for is not None:
        if not callable(inputs_for):
            raise InvalidOptionError("tune_ahead(inputs_for=...)", inputs_for, "a callable inputs_for(size) returning "
                                     "a tuple of positional arguments, a dict of keyword arguments, or (args, kwargs)")
        return lambda size: _as_inputs(call_hook(
            "inputs_for", "make inputs_for(size) return a tuple of positional arguments, a dict of keyword "
            "arguments, or a pair (args, kwargs)", inputs_for, size, check=_inputs_problem))
    assert example is not None
    if not isinstance(example, (tuple, list)) or not isinstance(resize, dict) or not resize or not all(
            isinstance(i, int) and isinstance(d, int) and 0 <= i < len(example)
            and isinstance(example[i], torch.Tensor) and -example[i].dim() <= d < example[i].dim()
            for i, d in resize.items()):
        raise InvalidOptionError("tune_ahead(example=..., resize=...)", (type(example).__name__, resize),
                                 "example= a tuple of the call's arguments and resize= a dict {position of a tensor "
                                 "argument: the dimension that takes the size}, e.g. resize={0: 0}")

    def resized(size: int) -> Inputs:
        args = list(example)
        for i, d in resize.items():
            t = example[i]
            shape = list(t.shape)
            shape[d] = size
            args[i] = (torch.randn(shape, dtype=t.dtype, device=t.device) if t.is_floating_point()
                       else torch.zeros(shape, dtype=t.dtype, device=t.device))
        return tuple(args), {}

    return resized


def _inputs_problem(value: Any) -> str | None:
    return None if _as_inputs(value) is not None else (
        f"returned {type(value).__name__}, which is not a tuple, a dict or an (args, kwargs) pair")


def _as_inputs(value: Any) -> Any:
    if isinstance(value, dict):
        return (), value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple) and isinstance(value[1], dict):
        return value
    if isinstance(value, tuple):
        return value, {}
    return None


def check_sizes(fn: ContextualAutotuner, sizes: Iterable[int] | None, dim: str | None,
                up_to: int | None) -> list[int]:
    """The sizes to tune: the list given, or every bucket of `dim` up to `up_to`."""
    if sizes is None:
        bucketing = fn.opts.bucketing
        if bucketing is None or dim is None or up_to is None:
            raise InvalidOptionError("tune_ahead(sizes=None)", None, "a list of sizes, or dim= and up_to= with "
                                     "buckets= declared on the function (every bucket of dim from 1 to up_to)")
        return bucketing.sizes(dim, up_to)
    listed = list(sizes) if not isinstance(sizes, (str, bytes)) and isinstance(sizes, Iterable) else None
    if not listed or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in listed):
        raise InvalidOptionError("tune_ahead(sizes=...)", sizes, "a non-empty list of ints >= 0 (the sizes of the "
                                 "dynamic dimension to tune, e.g. [1, 2, 4, ..., 2048])")
    return list(dict.fromkeys(listed))


def check_met(fn: ContextualAutotuner, size: int, dim: str | None) -> None:
    """A factory that ignores its size tunes the wrong shapes: the keys its call met must carry the size."""
    stats = fn.last_call
    if dim is None or stats is None or not stats.met:
        return
    want = fn.opts.bucketing.value(dim, size) if fn.opts.bucketing is not None and dim in fn.opts.bucketing.rules \
        else size
    seen = {(kernel, named[dim]) for (kernel, _), named in stats.met.items() if dim in named}
    if not seen:
        raise InvalidOptionError("tune_ahead(dim=...)", dim, "the name of a dimension in the key of a kernel the "
                                 f"function launches (the keys met by the call for size {size} name "
                                 f"{sorted({n for named in stats.met.values() for n in named})})")
    if not any(v in (size, want) for _, v in seen):
        raise UserHookError("inputs_for", f"built inputs for size {size} whose kernels met {dim}=" +
                            ", ".join(f"{v} ({k})" for k, v in sorted(seen, key=repr)) + f", not {size}",
                            f"make inputs_for(size) build inputs whose {dim} is size")


def check_inputs(size: int, args: tuple, kwargs: dict[str, Any]) -> None:
    """Inputs that do not depend on their size (a factory that ignores its argument) would tune one shape
    over and over: some tensor dimension or int argument must be the size."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and size in value.shape:
            return
        if isinstance(value, int) and not isinstance(value, bool) and value == size:
            return
    raise UserHookError("inputs_for", f"built inputs for size {size} with no tensor dimension and no int argument "
                        f"equal to {size} (shapes: "
                        f"{[tuple(v.shape) for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]})",
                        "make inputs_for(size) build the call's inputs for that size, e.g. "
                        "lambda M: (torch.randn(M, 4096, device='cuda'),)")


def _time_call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], runs: int) -> float | None:
    if runs < 1:
        return None
    cuda = torch.cuda.is_available() and not interpret_mode()
    times = []
    for _ in range(runs):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def work(fn: ContextualAutotuner, args: tuple, kwargs: dict[str, Any]) -> tuple[float | None, float | None]:
    """The call's (flops, bytes) from the options' functions, asked before the call so a bad one changes nothing."""
    opts = fn.opts
    flops = None if opts.flops is None else float(call_hook(
        "flops", "make flops(*args, **kwargs) return the call's floating-point operations", opts.flops, *args,
        check=_number_problem, **kwargs))
    moved = None if opts.bytes is None else float(call_hook(
        "bytes", "make bytes(*args, **kwargs) return the bytes the call reads and writes", opts.bytes, *args,
        check=_number_problem, **kwargs))
    return flops, moved


def _throughput(row: AheadRow, flops: float | None, moved: float | None) -> None:
    if row.call_ms is None or row.call_ms <= 0:
        return
    seconds = row.call_ms / 1e3
    fractions = []
    tflops_peak, gbps_peak = peak()
    if flops is not None:
        row.tflops = flops / seconds / 1e12
        if tflops_peak:
            fractions.append(row.tflops / tflops_peak)
    if moved is not None:
        row.gbps = moved / seconds / 1e9
        if gbps_peak:
            fractions.append(row.gbps / gbps_peak)
    row.peak_fraction = max(fractions) if fractions else None


def _number_problem(value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return None if ok else f"returned {value!r}, not a finite number >= 0"


def tune_ahead(fn: ContextualAutotuner, sizes: Iterable[int] | None, inputs_for: Callable[[int], Any] | None,
               example: Sequence[Any] | None, resize: dict[int, int] | None, dim: str | None, up_to: int | None,
               spread: bool, timed_runs: int) -> list[AheadRow]:
    listed = check_sizes(fn, sizes, dim, up_to)
    make = inputs_from(inputs_for, example, resize)
    dist = torch.distributed.is_available() and torch.distributed.is_initialized()
    if spread and fn.opts.is_dist:
        raise InvalidOptionError("tune_ahead(spread=True)", True, "False for a function with is_dist=True: its "
                                 "collectives need every rank in every call, so its shapes are tuned in lockstep")
    if spread and fn.opts.resolved_cache_dir() is None:
        raise InvalidOptionError("tune_ahead(spread=True)", True, "False, or turn the tuning cache on (cache=True, "
                                 "TRITON_CTX_TUNE_CACHE=1): spread ranks hand each other their results through it")
    comm = Collectives(dist and (spread or fn.opts.is_dist), fn.opts.group if fn.opts.is_dist else None,
                       fn.opts.resolved_timeout())
    # The log a tune-ahead writes its rows to (each size's call writes its own events to its own).
    log = RankLog(fn.opts.resolved_log_dir(), comm.global_rank, fn.opts.resolved_quiet())
    mine = listed[comm.rank::comm.world] if spread else listed
    rows: list[AheadRow] = []
    stored: list[str] = []  # the entries this rank's calls wrote (spread hands them to the other ranks)
    started = time.perf_counter()
    try:
        for i, size in enumerate(mine):
            args, kwargs = make(size)
            check_inputs(size, args, kwargs)
            flops, moved = work(fn, args, kwargs)
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            stats = fn.last_call
            assert stats is not None
            stored += stats.stored
            check_met(fn, size, dim)
            row = AheadRow(size, comm.rank if spread else 0, stats.executions, len(stats.tuned), stats.cache_hits,
                           time.perf_counter() - t0, None)
            row.call_ms = _time_call(fn, args, kwargs, timed_runs)
            _throughput(row, flops, moved)
            rows.append(row)
            _progress(log, fn.name, i + 1, len(mine), row, time.perf_counter() - started, spread)
        if spread and comm.active:
            rows = _gather(fn, comm, rows, stored, listed, mine, make)
        rows.sort(key=lambda r: r.size)
        for row in rows:
            log.write("tune-ahead", _row_line(fn.name, row), function=fn.name, **asdict(row), spread=spread,
                      wall_s=time.perf_counter() - started)
    finally:
        log.close()
    if comm.global_rank == 0 and not fn.opts.resolved_quiet():
        print(table(fn.name, rows, time.perf_counter() - started), file=sys.stderr, flush=True)
    return rows


def _gather(fn: ContextualAutotuner, comm: Collectives, rows: list[AheadRow], paths: list[str], listed: list[int],
            mine: list[int], make: Callable[[int], Inputs]) -> list[AheadRow]:
    """Spread: every rank's cache entries reach every rank's cache, then each rank's call of another rank's
    size finds them there (and installs them, through the usual path); the rows reach every rank."""
    stored = []
    for path in dict.fromkeys(paths):
        try:
            stored.append(read_entry(Path(path)))
        except (FileNotFoundError, CacheEntryError):
            continue
    directory = fn.opts.resolved_cache_dir()
    assert directory is not None
    for data in comm.all_gather_bytes(json.dumps(stored).encode(), "tune_ahead: the ranks' tuned entries"):
        for entry in json.loads(data.decode()):
            write_entry(directory, entry)
    for size in listed:
        if size not in mine:
            args, kwargs = make(size)
            fn(*args, **kwargs)
    payload = json.dumps([asdict(r) for r in rows]).encode()
    return [AheadRow(**r) for data in comm.all_gather_bytes(payload, "tune_ahead: the ranks' rows")
            for r in json.loads(data.decode())]


def _row_line(function: str, row: AheadRow) -> str:
    call = "-" if row.call_ms is None else f"{row.call_ms:.4f} ms"
    work = "".join([f", {row.tflops:.2f} TFLOP/s" if row.tflops is not None else "",
                    f", {row.gbps:.1f} GB/s" if row.gbps is not None else "",
                    f", {row.peak_fraction:.0%} of peak" if row.peak_fraction is not None else ""])
    return (f"tune-ahead {function} size={row.size}: {row.tuned} keys tuned, {row.cache_hits} from the cache, "
            f"{row.executions} executions in {row.tune_s:.2f} s (rank {row.rank}); warm call {call}{work}")


def _progress(log: RankLog, function: str, done: int, total: int, row: AheadRow, elapsed: float, spread: bool) -> None:
    eta = elapsed / done * (total - done)
    share = " (this rank's share)" if spread else ""
    log.summary(f"tune-ahead {function}: {done}/{total}{share} size={row.size}: keys tuned {row.tuned}, from the "
                f"cache {row.cache_hits}, {row.executions} executions, {row.tune_s:.2f} s; elapsed {elapsed:.1f} s, "
                f"ETA {eta:.1f} s")


def table(function: str, rows: list[AheadRow], wall_s: float) -> str:
    """The tune-ahead's table, one row per size (rank 0 prints it at the end)."""
    return "\n".join([f"tune-ahead {function}: {len(rows)} sizes in {wall_s:.2f} s",
                      *ahead_table(asdict(r) for r in rows)])
