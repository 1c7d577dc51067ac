"""Per-rank logs: a human-readable rank-{i}.log and a machine-readable rank-{i}.jsonl.

Both are appended to and flushed line by line, so a crashed or killed job still leaves
everything it measured. Rank 0 also prints one summary line per tuned key on stderr.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .. import __version__
from ..runtime.compat import TRITON_VERSION, print_autotuning
from ..runtime.compat import same_binary as same_binary  # for report.py, which reads runtime through this module

DEFAULT_LOG_DIR = "./.autotune_logs"
_calls = itertools.count(1)


@dataclass(frozen=True)
class EventSpec:
    """One kind of JSONL event: what it records and the fields every event of the kind carries
    (some writers add more, e.g. a kernel's key or a function's name). report.py reads these."""
    kind: str
    about: str
    fields: frozenset[str]


def _spec(kind: str, about: str, *fields: str) -> tuple[str, EventSpec]:
    return kind, EventSpec(kind, about, frozenset(fields))


# Every kind of event the package writes, in one place: RankLog.write refuses any other, and
# tests/test_logs_schema.py holds the writers and report.py to this list.
EVENTS: dict[str, EventSpec] = dict([
    _spec("call", "a tuning call starts (RankLog.header)", "function", "world", "device", "timer", "flush_l2",
          "triton", "torch", "triton_ctx_tune", "host", "pid"),
    _spec("end", "a tuning call ends, or is stopped by an error", "function", "executions", "wall_s", "error"),
    # failures: excluded on every rank (timeouts, crashed workers); rejected: compile errors, which the launch
    # path retries with the real arguments; skipped: configs whose signature only their launch knows.
    # places: config index -> "workers" (a compile worker), "here" (this process), "ranks" (another local rank's
    # share, loaded from the shared cache at the step's end), "cache" (Triton's cache had it already); counts:
    # configs per place; compile_s: the sum of their own compile times; wall_s: from the key's
    # first launch to its last config's end; parallelism: compile_s / wall_s; undescribed: configs no worker
    # could take, and why; stolen: other local ranks' configs this rank's workers compiled ahead. phases: seconds
    # per phase; describe_s, wait_s, worker_s and parent_s are sums over the key's configs, which run on many
    # threads at once (16 threads describing for 0.1 s sum to 1.5 s); first_ready_s (to the first config
    # compiled) and launcher_wait_s (the execution waiting for its launcher's build) are the execution's own
    # waits; finish_*_s are the step's end.
    _spec("precompile", "a key's configs compiled in the background", "kernel", "key", "mine", "seconds", "failures",
          "rejected", "skipped", "by_workers", "workers", "ran_meanwhile", "places", "counts", "compile_s", "wall_s",
          "parallelism", "cpu_s", "cores_busy", "undescribed", "stolen", "phases", "met_s", "spans", "shared_ptxas",
          "same_binary"),
    _spec("compile", "a call's compiles over all its keys: configs per place, the sum of their compile times, the "
          "wall time and their ratio; cpu_s: the CPU seconds the compiles took, and cores_busy its ratio to the wall "
          "time; first_slot_s: from the first launch of a key tuned to the first timed slot",
          "function", "keys", "configs", "workers", "here", "ranks", "cache", "pool", "compile_s", "wall_s",
          "parallelism", "cpu_s", "cores_busy", "first_slot_s", "shared_ptxas", "bound", "bound_by"),
    _spec("precompile-disagreed", "a config precompile rejected whose launch compiled and ran: precompile built "
          "another signature than the launch", "kernel", "key", "config_index", "config", "precompile_reason"),
    _spec("quarantine", "a key skips configs that killed an earlier process", "kernel", "key", "configs"),
    _spec("quarantine-recovered", "a slot an earlier process died in, found now", "id", "config", "reason"),
    # lead_ms: a timed launch's GPU sleep before its start event, so that the host's latency stays out of ms
    _spec("slot", "one launch of a key in a tuning step", "step", "kernel", "key", "config_index", "iteration", "timed",
          "ms", "failure", "ran", "lead_ms"),
    _spec("step", "one end-to-end timed step (a point, or objective='end_to_end')", "step", "point", "config_index",
          "kind", "iteration", "timed", "ms", "failure"),
    _spec("screen", "a screening pass's survivors (of a key or of a function's points)", "kept", "factor", "reduced",
          "held", "split"),
    _spec("decision", "a key's winner, with every rank's timings", "kernel", "key", "point", "end_to_end", "winner",
          "winner_config", "configs", "reduced", "reduced_q20", "reduced_q80", "per_rank", "local_failures",
          "screened_out", "reduce", "stat", "world", "executions", "tuning_s", "fastest", "ties", "band", "spread",
          "tie_break", "confirmed", "confirm_rounds", "raced_out", "split", "readmitted", "unexplored"),
    _spec("readmit", "configs a split screening dropped, timed in lockstep after all", "kernel", "key", "point",
          "configs", "screen_ms", "lockstep_best", "factor"),
    _spec("rung", "a budgeted search's next rung of configs (engine/budget.py)", "kernel", "key", "point", "rung",
          "configs", "new", "slots", "explored", "measure", "limit", "spent", "best", "wave"),
    _spec("call-budget", "a function space's call budget is spent (rank 0's measure): every choice still open is "
          "decided at this step's end on the samples taken", "function", "measure", "limit", "executions", "seconds"),
    _spec("confirm", "a key's close candidates, re-timed interleaved before its decision", "kernel", "key", "point",
          "candidates", "rounds", "reduced", "margins", "end_to_end", "waits_for"),
    _spec("confirm-round", "an end-to-end confirmation's round ended: the candidates that stay for the next round, "
          "and those out, more than RACE_BAND behind the fastest", "kernel", "key", "point", "stay", "out",
          "reduced", "rounds_left"),
    _spec("lockstep-round", "a round of a screening's survivors ended (every rank times them alike): those that stay "
          "for the next round, and those out, more than RACE_BAND behind the fastest on their luckiest rank",
          "kernel", "key", "point", "stay", "out", "luckiest", "rounds_left"),
    _spec("point-decision", "a function-level winner (autotune())", "function", "winner", "points", "compared",
          "reduced", "reduced_q20", "reduced_q80", "per_rank", "margin", "screened_out", "failures", "kernels",
          "reduce", "stat", "world", "executions", "tuning_s"),
    _spec("point-failed", "a function-level point failed on some rank, skipped on every rank", "point", "kwargs",
          "failures"),
    _spec("validation", "a config's or a point's output checked against the reference", "ok", "reason", "mine"),
    # source: "cache" (the entry at path), else the shipped config file it came from (rank 0; "shipped" elsewhere).
    _spec("cache-hit", "a winner read from the persistent (or function) cache, or from a shipped config file",
          "key", "winner", "path", "entry", "source"),
    # source: "cache", or "shipped" (path is then the shipped file); a kernel's names its kernel, a function's
    # its function.
    _spec("cache-stale", "a cached or shipped entry of the key that no longer applies, and why", "key", "path",
          "reasons", "others", "source"),
    _spec("cache-store", "a winner stored in the persistent (or function) cache", "path"),
    _spec("incremental", "a key re-tuned after its config list alone changed: the configs timed (new ones and "
          "anchors), those carried over from the old entry, and the scale applied to them", "kernel", "key",
          "configs", "new", "anchors", "carried", "carried_failed", "removed", "scale"),
    _spec("error", "no config of a key (or point of a function) is valid", "failures"),
    _spec("freeze-miss", "a frozen call (freeze=True) met a key with no tuned result, and what ran instead",
          "kernel", "key", "config_index", "config", "nearest", "fix"),
    _spec("tune-ahead", "one size of a tune-ahead (serving.py): its tuning cost, warm call time and throughput",
          "function", "size", "rank", "executions", "tuned", "cache_hits", "tune_s", "call_ms", "tflops", "gbps",
          "peak_fraction", "spread", "wall_s"),
    # Written before the collective waits: a hung rank's last one names where it is. Every rank of a group
    # writes the same sequence (seq, tuning_call, step, op, what, shape); tests compare them.
    _spec("collective", "a collective of the tuner, as its schedule header says (collectives.py)", "seq",
          "tuning_call", "step", "op", "what", "doing", "shape"),
    _spec("online-call", "one call of an online session (online=True): its wall time, the slots each key took in "
          "it and the keys decided at its end", "function", "call", "wall_s", "keys", "decided"),
])


class UnknownEventError(ValueError):
    """A log event of a kind EVENTS does not declare, or missing a field its kind always carries."""


def compile_totals(compiles: list[dict[str, Any]], first_slot_s: float | None) -> dict[str, Any]:
    """The call's compile line from its keys' precompiles: configs by place, the sum of their own compile
    times, the wall time from the first key's start to the last config's end, and their ratio."""
    counts = {p: sum(c["counts"].get(p, 0) for c in compiles) for p in ("workers", "here", "ranks", "cache")}
    compile_s = sum(c["compile_s"] for c in compiles)
    first = min(c["started"] for c in compiles)
    wall_s = max(c["ended"] for c in compiles) - first
    workers = max((c["pool"] for c in compiles), default=0)
    # (None where a record predates it)
    cpu_s = sum(c["cpu_s"] for c in compiles) if all("cpu_s" in c for c in compiles) else None
    return {"keys": len(compiles), "configs": sum(counts.values()), **counts, "pool": workers,
            "compile_s": compile_s, "wall_s": wall_s, "parallelism": compile_s / wall_s if wall_s > 0 else None,
            "cpu_s": cpu_s, "cores_busy": cpu_s / wall_s if cpu_s is not None and wall_s > 0 else None,
            "first_slot_s": first_slot_s, "shared_ptxas": sum(len(c.get("shared_ptxas", ())) for c in compiles),
            **_critical_path(compiles, first, compile_s, workers)}


def _critical_path(compiles: list[dict[str, Any]], first: float, compile_s: float, workers: int) -> dict[str, Any]:
    """The parallelism the call's compiles allowed (`bound`): its compile seconds over the longer of two floors of
    the wall time. One is the critical path: a key cannot be done before it is met plus its longest config's
    span (one compile, which no number of workers shortens; FLA's backward meets a key 2.3 s in whose largest
    config compiles for 6 to 9 s). The other is the seconds spread over the pool. `bound_by` names the floor."""
    crit = max(compiles, key=lambda c: c["started"] + c.get("longest_s", 0.0))
    longest_s = crit.get("longest_s", 0.0)
    path_s = crit["started"] + longest_s - first
    spread_s = compile_s / workers if workers else 0.0
    floor_s = max(path_s, spread_s)
    if floor_s <= 0 or compile_s <= 0:
        return {"bound": None, "bound_by": None}
    by = ({"kernel": crit.get("kernel"), "met_s": crit["started"] - first, "longest_s": longest_s}
          if path_s >= spread_s else {"pool": workers})
    return {"bound": compile_s / floor_s, "bound_by": by}


def fmt_parallelism(parallelism: float | None) -> str:
    return "-" if parallelism is None else f"{parallelism:.1f}x"


def compile_line(t: dict[str, Any]) -> str:
    par = fmt_parallelism(t["parallelism"])
    first = "" if t["first_slot_s"] is None else f"; first timed slot {t['first_slot_s']:.1f} s after the first launch"
    ranks = f"{t['ranks']} by other local ranks, " if t.get("ranks") else ""
    return (f"compile: {t['configs']} configs, {t['workers']} in {t['pool']} workers{shared_ptxas_text(t)}, "
            f"{t['here']} in-process, {ranks}{t['cache']} from disk cache, parallelism {par}{bound_text(t)}"
            f"{cores_text(t)}, {t['wall_s']:.1f} s{first}")


def cores_text(t: dict[str, Any]) -> str:
    """", 11.6 cores busy" (the compiles' CPU seconds over the wall time), or "" where the record predates it."""
    return "" if t.get("cores_busy") is None else f", {t['cores_busy']:.1f} cores busy"


def bound_text(t: dict[str, Any]) -> str:
    """" (at most 6.8x: chunk_bwd_kernel_dqkwg met 2.3 s in, a config of it 7.6 s)", or "" (logs before it)."""
    by = t.get("bound_by")
    if t.get("bound") is None or not by:
        return ""
    why = (f"{by['kernel']} met {by['met_s']:.1f} s in, a config of it {by['longest_s']:.1f} s" if "kernel" in by
           else f"the compiles spread over {by['pool']} workers")
    return f" (at most {fmt_parallelism(t['bound'])}: {why})"


def shared_ptxas_text(e: dict[str, Any]) -> str:
    """" (2 with another config's ptxas)" (compile/shared_ptxas.py), or "" when none was (or the log predates it)."""
    n = e.get("shared_ptxas") or 0
    n = n if isinstance(n, int) else len(n)
    return f" ({n} with another config's ptxas)" if n else ""


def fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.4f} ms"


class RankLog:
    """Opened lazily: a call that tunes nothing writes nothing."""

    def __init__(self, log_dir: str | os.PathLike[str] | None, rank: int, quiet: bool) -> None:
        self.dir = Path(log_dir) if log_dir is not None else None
        self.rank = rank
        self.quiet = quiet
        self._text: IO[str] | None = None
        self._jsonl: IO[str] | None = None
        # Jobs that share a log directory append to the same files: this tells their records apart.
        self.call = f"{socket.gethostname()}:{os.getpid()}:{next(_calls)}"

    @property
    def paths(self) -> tuple[Path, Path] | None:
        if self.dir is None:
            return None
        return self.dir / f"rank-{self.rank}.log", self.dir / f"rank-{self.rank}.jsonl"

    def _open(self) -> None:
        if self._text is not None or (paths := self.paths) is None:
            return
        text, jsonl = paths
        text.parent.mkdir(parents=True, exist_ok=True)
        self._text = open(text, "a", encoding="utf-8")
        self._jsonl = open(jsonl, "a", encoding="utf-8")

    def write(self, event: str, line: str, **fields: Any) -> None:
        """`event`: a kind declared in EVENTS, so that report.py (and anyone reading the JSONL) knows it."""
        spec = EVENTS.get(event)
        if spec is None:
            raise UnknownEventError(f"log event kind {event!r} is not declared in triton_ctx_tune.tools.logs.EVENTS "
                                    f"(declared: {', '.join(EVENTS)}). Fix: add an EventSpec for it there, and read "
                                    "or ignore it in report.py")
        if not spec.fields <= fields.keys():
            raise UnknownEventError(f"log event {event!r} lacks the fields {sorted(spec.fields - fields.keys())} that "
                                    "logs.EVENTS says every event of its kind carries")
        if print_autotuning() and self.rank == 0:
            print(f"[triton_ctx_tune] {line}", flush=True)
        if self.dir is None:
            return
        self._open()
        assert self._text is not None and self._jsonl is not None
        self._text.write(f"[rank-{self.rank}] {line}\n")
        self._text.flush()
        record = {"event": event, "rank": self.rank, "call": self.call, "time": time.time(), **fields}
        self._jsonl.write(json.dumps(record, default=repr) + "\n")
        self._jsonl.flush()

    def header(self, function: str, world: int, device: str, timer: str, flush_l2: bool | str) -> None:
        import torch

        self.write("call", f"=== tuning {function}: world={world} device={device} timer={timer} flush_l2={flush_l2} "
                   f"triton={TRITON_VERSION} torch={torch.__version__} triton_ctx_tune={__version__} "
                   f"host={socket.gethostname()} pid={os.getpid()}",
                   function=function, world=world, device=device, timer=timer, flush_l2=flush_l2, triton=TRITON_VERSION,
                   torch=torch.__version__, triton_ctx_tune=__version__, host=socket.gethostname(), pid=os.getpid())

    def summary(self, line: str) -> None:
        """One line per tuned key on rank 0's stderr unless silenced."""
        if self.rank == 0 and not self.quiet:
            print(f"[triton_ctx_tune] {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        for f in (self._text, self._jsonl):
            if f is not None:
                f.close()
        self._text = self._jsonl = None


def ahead_table(rows: Iterable[dict[str, Any]]) -> list[str]:
    """A tune-ahead's table, one line per size (serving.AheadRow's fields): what tune_ahead prints at its end
    and what `report` and the `tune` command print from the logs."""
    lines = [f"{'size':>8} {'rank':>4} {'executions':>10} {'tuned':>5} {'hits':>4} {'tune s':>8} {'call ms':>10} "
             f"{'TFLOP/s':>8} {'GB/s':>8} {'peak':>5}"]
    for r in rows:
        lines.append(f"{r['size']:>8} {r.get('rank', 0):>4} {r['executions']:>10} {r['tuned']:>5} {r['cache_hits']:>4} "
                     f"{r['tune_s']:>8.2f} {_num(r['call_ms'], '10.4f')} {_num(r['tflops'], '8.2f')} "
                     f"{_num(r['gbps'], '8.1f')} {_num(r['peak_fraction'], '5.0%')}")
    return lines


def _num(x: Any, spec: str) -> str:
    width = int(spec.split(".")[0])
    return f"{'-':>{width}}" if x is None else format(x, spec).rjust(width)
