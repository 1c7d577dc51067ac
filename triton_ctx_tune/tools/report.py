"""What was chosen and why, read back from the per-rank JSONL logs (see logs.py and session.py).

The event kinds are declared in logs.EVENTS; the report reads "call" (a tuning call starts),
"decision" (a key is decided; its per_rank matrix is the same on every rank, its local_failures
are the writer's own), "point-decision" (a function-level winner), "cache-hit" (a winner read
from the persistent cache or a shipped config file, its source says which; rank 0's event carries
the whole entry), "incremental" (what a key re-tuned after a config-list change timed and carried
over), "freeze-miss" and "tune-ahead" (serving), "error" (no valid config), "end", "precompile" (where a
key's configs compiled) and "compile" (the call's compile line) (_READERS),
and says in IGNORED why it reads no other kind. Logs are appended to across runs, so the latest
event of a key wins.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CtxTuneError, MissingDependencyError
from .logs import EVENTS, ahead_table, compile_line, cores_text, fmt_parallelism, same_binary, shared_ptxas_text

_RANK_FILE = re.compile(r"^rank-(\d+)\.jsonl$")


@dataclass
class KeyReport:
    kernel: str
    key: str
    function: str | None
    source: str  # "tuned", "cache" or "error"
    configs: list[str] = field(default_factory=list)
    winner: int | None = None
    ms: list[float | None] = field(default_factory=list)  # reduced statistic per config; None: failed
    q20: list[float | None] = field(default_factory=list)
    q80: list[float | None] = field(default_factory=list)
    per_rank: list[list[float | None]] = field(default_factory=list)  # [rank][config]
    failures: dict[int, dict[str, str]] = field(default_factory=dict)  # config -> {who: reason}
    stat: str = "median"
    reduce: str = "max"
    world: int = 1
    executions: int | None = None
    tuning_s: float | None = None
    date: str | None = None
    occurrences: int = 0
    error: dict[str, list[str]] | None = None  # config text -> reasons, when no config was valid
    # Near-ties (decisions.py): the band around the fastest, the fastest config's spread that set it, the
    # configs inside it, the fastest one, and what a tie-break chose ("incumbent"; older logs: "config order").
    band: float | None = None
    spread: float | None = None
    ties: list[int] = field(default_factory=list)
    fastest: int | None = None
    tie_break: str | None = None
    shipped: str | None = None  # a cache hit read from a shipped config file: the file (or "shipped")
    confirmed: list[int] | None = None  # the close candidates re-timed, interleaved, before the decision
    confirm_rounds: int | None = None  # their rounds, per launch (the band is the spread over its square root)
    # Left behind by a race: an end-to-end confirmation's candidates (in `confirmed`), or a screening's survivors
    # after one of their rounds (not in `confirmed`).
    raced_out: list[int] = field(default_factory=list)
    end_to_end: bool = False  # decided on whole steps' times (objective, or an overlapped key's confirmation)
    split: bool = False  # screened with each rank taking a share of the configs
    readmitted: list[int] = field(default_factory=list)  # dropped by that screening, timed in lockstep after all
    screened_out: list[int] = field(default_factory=list)  # dropped by the screening (the decision's screened_out)
    # Split screening: a dropped config -> the one rank that screened it and whose time it has. The other ranks
    # never ran it, so their missing times are no failure (build() sets it, from the decision's per_rank).
    screened_on: dict[int, int] = field(default_factory=dict)
    # Survivors that left the lockstep race after its first round: timed on their screening rank alone.
    lockstep_out: dict[int, int] = field(default_factory=dict)
    unexplored: list[int] = field(default_factory=list)  # a budgeted search never ran them (engine/budget.py)
    # Its rungs that shared their step's compiles with other keys' (rank 0's rung events): configs each left out.
    shared_rungs: list[tuple[int, int]] = field(default_factory=list)
    # Incremental re-tuning (store/incremental.py): what was timed and carried over, and the scale.
    incremental: dict[str, Any] | None = None
    compile: dict[str, Any] | None = None  # the key's last "precompile" event: where its configs compiled
    carried: list[int] = field(default_factory=list)  # configs whose times are carried over, not measured


@dataclass
class CallReport:
    function: str
    world: int = 1
    device: str = "?"
    timer: str = "?"
    calls: int = 0
    executions: int = 0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    compile: dict[str, Any] | None = None  # the last "compile" event of the function (its last tuning call)
    compiles: dict[int, dict[str, Any]] = field(default_factory=dict)  # each rank's last "compile" event
    budget_spent: dict[str, Any] | None = None  # the last "call-budget" event: the call stopped on its budget


@dataclass
class PointReport:
    """A function-level decision (autotune()): every point's end-to-end time and the winner."""
    function: str
    points: list[dict[str, Any]]
    winner: int
    ms: list[float | None]  # reduced end-to-end statistic per point; None: failed or screened out
    per_rank: list[list[float | None]]  # [rank][point]
    margin: float | None
    screened_out: list[int]
    failures: dict[str, str]
    kernels: list[dict[str, Any]]
    world: int = 1
    stat: str = "median"
    reduce: str = "max"
    compared: list[float | None] | None = None  # the q80 per point that decided (None: logs written before it)


@dataclass
class OnlineCall:
    """One call of an online session, as its online-call event logged it."""
    call: int  # its number in the session (1 for the session's first)
    wall_s: float  # measured after its end's decisions: the last call's includes deciding the last keys
    slots: dict[str, int]  # "kernel key=(...)" -> the slots that key took in this call, for each key it launched
    decided: list[str]  # the keys decided at its end


@dataclass
class KeyCost:
    """What tuning one key online cost: the calls it was launched in until decided, and their time above the
    tuned call's."""
    name: str
    calls: int
    slots: int
    decided_at: int | None  # None: not decided when the logs end
    above_s: float


@dataclass
class OnlineReport:
    """An online function (online=True): its sessions' calls (a session ends when every key it met is decided;
    a new key in a later call starts another), the calls it took, and per key when it was decided."""
    function: str
    calls: int = 0
    wall_s: list[float] = field(default_factory=list)  # each call's wall time
    key_calls: dict[str, int] = field(default_factory=dict)  # "kernel key" -> calls that launched it
    decided_at: dict[str, int] = field(default_factory=dict)  # "kernel key" -> the call whose end decided it
    sessions: list[list[OnlineCall]] = field(default_factory=list)


def tuned_call_s(session: list[OnlineCall]) -> float:
    """The tuned call's time a session is measured against: its fastest call. The calls after a session ends,
    which run every key tuned, are not logged; every call of the session takes a slot of some key, and its
    last one also pays for the last decisions (a collective, the logs, the cache), so the fastest call is the
    closest to a tuned call that the logs hold (a noisy one reads low, which counts the cost high)."""
    return min(c.wall_s for c in session)


def key_costs(session: list[OnlineCall]) -> list[KeyCost]:
    """Per key of a session, in the order met: the calls it was launched in until (and with) the one whose end
    decided it, the slots it took in them, and their time above the tuned call's (tuned_call_s)."""
    tuned = tuned_call_s(session)
    decided = {name: c.call for c in session for name in c.decided}
    costs: dict[str, KeyCost] = {}
    for c in session:
        for name, slots in c.slots.items():
            at = decided.get(name)
            if at is not None and c.call > at:
                continue  # launched after it was decided: its winner ran
            k = costs.setdefault(name, KeyCost(name, 0, 0, at, 0.0))
            k.calls += 1
            k.slots += slots
            k.above_s += c.wall_s - tuned
    return list(costs.values())


@dataclass
class FreezeMiss:
    """A key a frozen call (freeze=True) had no tuned result for, and what ran instead."""
    kernel: str
    key: str
    config: str
    nearest: str | None  # the tuned key whose winner ran; None: the first config ran
    fix: str
    count: int = 1  # processes (or calls in them) that met it


@dataclass
class Report:
    log_dir: Path
    ranks: list[int]
    calls: dict[str, CallReport]
    keys: dict[tuple[str, str], KeyReport]
    problems: list[str]
    functions: dict[str, PointReport] = field(default_factory=dict)
    online: dict[str, OnlineReport] = field(default_factory=dict)
    frozen: dict[tuple[str, str], FreezeMiss] = field(default_factory=dict)
    ahead: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # function -> size -> tune-ahead row
    # kernel -> configs that precompile rejected and their launch ran: a class of signature mismatch to look into
    disagreed: dict[str, list[str]] = field(default_factory=dict)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def read_events(log_dir: Path) -> tuple[dict[int, list[dict[str, Any]]], list[str]]:
    """Every rank's events in file order, and the lines that could not be read (a killed job leaves half a line)."""
    if not log_dir.is_dir():
        raise CtxTuneError(f"no log directory {log_dir}. Fix: pass the log_dir the job used, or set "
                           "TRITON_CTX_TUNE_LOG_DIR (the default is ./.autotune_logs in the job's working directory).")
    events: dict[int, list[dict[str, Any]]] = {}
    problems: list[str] = []
    for path in sorted(log_dir.iterdir()):
        m = _RANK_FILE.match(path.name)
        if not m:
            continue
        rows = events[int(m.group(1))] = []
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                problems.append(f"{path.name} line {n}: not JSON, skipped")
                continue
            if isinstance(row, dict) and isinstance(row.get("event"), str):
                rows.append(row)
    if not events:
        raise CtxTuneError(f"no rank-*.jsonl files in {log_dir}: nothing was tuned with logging there. "
                           "Fix: pass the log_dir the job used (log_dir=False turns logs off).")
    return dict(sorted(events.items())), problems


def _key_under_point(e: dict[str, Any]) -> str:
    """A key event's key as the report names it: under an autotune() space, one per point."""
    return repr(tuple(e["key"])) + ("" if e.get("point") is None else f" under point#{e['point']}")


def _from_decision(e: dict[str, Any], function: str | None) -> KeyReport:
    r = KeyReport(e["kernel"], _key_under_point(e), function, "tuned", list(e["configs"]), int(e["winner"]))
    r.ms = [_finite(x) for x in e["reduced"]]
    r.q20 = [_finite(x) for x in e.get("reduced_q20", [])]
    r.q80 = [_finite(x) for x in e.get("reduced_q80", [])]
    r.per_rank = [[_finite(x) for x in row] for row in e.get("per_rank", [])]
    r.stat, r.reduce, r.world = e.get("stat", "median"), e.get("reduce", "max"), int(e.get("world", 1))
    r.executions, r.tuning_s = e.get("executions"), e.get("tuning_s")
    r.band, r.spread, r.ties = e.get("band"), e.get("spread"), list(e.get("ties") or [])
    r.fastest, r.tie_break = e.get("fastest"), e.get("tie_break")
    r.confirmed, r.end_to_end = e.get("confirmed"), bool(e.get("end_to_end"))
    r.confirm_rounds = e.get("confirm_rounds")
    r.raced_out = [int(j) for j in e.get("raced_out") or []]
    r.split, r.readmitted = bool(e.get("split")), list(e.get("readmitted") or [])
    r.screened_out = [int(j) for j in e.get("screened_out") or []]
    r.unexplored = [int(j) for j in e.get("unexplored") or []]
    return r


def _from_cache_hit(e: dict[str, Any], function: str | None) -> KeyReport:
    r = KeyReport(e["kernel"], repr(tuple(e["key"])), function, "cache", list(e["configs"]), int(e["winner"]))
    if e.get("source") not in (None, "cache"):  # logs of older versions have no source: the cache
        r.shipped = str(e["source"])
    if isinstance(e.get("entry"), dict):  # rank 0's event: the whole entry, timings included
        add_entry(r, e["entry"])
    return r


def from_entry(entry: dict[str, Any]) -> KeyReport:
    """A cache entry (already validated) as a report of its key."""
    ident = entry["identity"]
    r = KeyReport(ident["kernel"], ident["key"], entry["tuned"].get("function"), "cache",
                  [t["config"] for t in entry["timings"]], entry["winner"]["index"])
    add_entry(r, entry)
    return r


def add_entry(r: KeyReport, entry: dict[str, Any]) -> None:
    """Timings, failures and tuning facts of a cache entry (the entry of a cache-hit event, or a file)."""
    timings = entry.get("timings", [])
    r.ms = [_finite(t.get("ms")) for t in timings]
    r.q20 = [_finite(t.get("q20")) for t in timings]
    r.q80 = [_finite(t.get("q80")) for t in timings]
    width = max((len(t.get("per_rank_ms", [])) for t in timings), default=0)
    r.per_rank = [[_finite(t["per_rank_ms"][rank]) if rank < len(t.get("per_rank_ms", [])) else None
                   for t in timings] for rank in range(width)]
    for j, t in enumerate(timings):
        if t.get("failure"):
            failed = t.get("failed_ranks") or [0]
            who = f"rank {failed[0]}" if len(failed) == 1 else f"ranks {failed}"
            r.failures.setdefault(j, {})[who] = t["failure"]
    r.carried = [j for j, t in enumerate(timings) if t.get("carried")]
    r.unexplored = [j for j, t in enumerate(timings) if t.get("explored") is False]
    ident = entry.get("identity", {})
    tuned = entry.get("tuned", {})
    r.stat, r.reduce, r.world = ident.get("stat", "median"), ident.get("reduce", "max"), ident.get("world", 1)
    r.executions, r.tuning_s, r.date = tuned.get("executions"), tuned.get("tuning_s"), tuned.get("date")
    r.split, r.screened_out = bool(tuned.get("split")), [int(j) for j in tuned.get("screened_out") or []]
    r.raced_out = [int(j) for j in tuned.get("lockstep_out") or []]


@dataclass
class _Story:
    """What the primary rank's events tell, read in file order."""
    calls: dict[str, CallReport] = field(default_factory=dict)
    keys: dict[tuple[str, str], KeyReport] = field(default_factory=dict)
    functions: dict[str, PointReport] = field(default_factory=dict)
    online: dict[str, OnlineReport] = field(default_factory=dict)
    function: str | None = None  # the function of the last "call" event: the keys after it are its
    frozen: dict[tuple[str, str], FreezeMiss] = field(default_factory=dict)
    ahead: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    precompiles: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # until the key's decision
    # shared rungs' configs left out and configs taken from the other keys' new binaries, ditto
    waves: dict[tuple[str, str], list[tuple[int, int]]] = field(default_factory=dict)
    disagreed: dict[str, list[str]] = field(default_factory=dict)

    def _call(self, function: str | None) -> CallReport:
        """The function's call summary, begun at the first event that names it."""
        return self.calls.setdefault(function or "?", CallReport(function or "?"))

    def precompile(self, e: dict[str, Any]) -> None:
        self.precompiles[(e["kernel"], repr(tuple(e["key"])))] = e

    def rung(self, e: dict[str, Any]) -> None:
        if e.get("wave"):
            self.waves.setdefault((e["kernel"], _key_under_point(e)), []).append(
                (int(e["wave"]["left_out"]), int(e["wave"].get("taken", 0))))

    def compile(self, e: dict[str, Any]) -> None:
        c = self._call(e.get("function"))
        c.compile = e
        c.compiles[int(e.get("rank", 0))] = e

    def call_budget(self, e: dict[str, Any]) -> None:
        c = self._call(e.get("function"))
        c.budget_spent = e

    def precompile_disagreed(self, e: dict[str, Any]) -> None:
        self.disagreed.setdefault(e["kernel"], []).append(f"key={tuple(e['key'])!r} {{{e['config']}}}: "
                                                          f"{str(e['precompile_reason'])[:160]}")

    def freeze_miss(self, e: dict[str, Any]) -> None:
        ident = (e["kernel"], repr(tuple(e["key"])))
        seen = self.frozen.get(ident)
        self.frozen[ident] = FreezeMiss(ident[0], ident[1], e["config"], e["nearest"], e["fix"],
                                        1 + (seen.count if seen else 0))

    def tune_ahead(self, e: dict[str, Any]) -> None:
        self.ahead.setdefault(e["function"], {})[int(e["size"])] = e  # a later tune-ahead of a size replaces it

    def call(self, e: dict[str, Any]) -> None:
        self.function = e.get("function")
        c = self._call(self.function)
        c.world, c.device, c.timer = e.get("world", 1), e.get("device", "?"), e.get("timer", "?")
        c.calls += 1

    def end(self, e: dict[str, Any]) -> None:
        c = self._call(e.get("function"))
        c.executions += int(e.get("executions", 0))
        c.wall_s += float(e.get("wall_s", 0.0))
        if e.get("error"):
            c.errors.append(str(e["error"]))

    def point_decision(self, e: dict[str, Any]) -> None:
        self.functions[e["function"]] = PointReport(
            e["function"], list(e["points"]), int(e["winner"]), [_finite(x) for x in e["reduced"]],
            [[_finite(x) for x in row] for row in e.get("per_rank", [])], _finite(e.get("margin")),
            list(e.get("screened_out", [])), dict(e.get("failures", {})), list(e.get("kernels", [])),
            int(e.get("world", 1)), str(e.get("stat", "median")), str(e.get("reduce", "max")),
            [_finite(x) for x in e["compared"]] if "compared" in e else None)

    def online_call(self, e: dict[str, Any]) -> None:
        o = self.online.setdefault(e["function"], OnlineReport(e["function"]))
        o.calls += 1
        o.wall_s.append(float(e["wall_s"]))
        names = {}
        for k in e["keys"]:
            name = f"{k['kernel']} key={tuple(k['key'])!r}"
            names[name] = int(k.get("slots", 0))
            o.key_calls[name] = o.key_calls.get(name, 0) + 1
        decided = [f"{k['kernel']} key={tuple(k['key'])!r}" for k in e["decided"]]
        for name in decided:
            o.decided_at[name] = int(e["call"])
        call = OnlineCall(int(e["call"]), float(e["wall_s"]), names, decided)
        if not o.sessions or call.call <= o.sessions[-1][-1].call:
            o.sessions.append([])  # a session numbers its calls from 1: a new one, or another job's
        o.sessions[-1].append(call)

    def incremental(self, e: dict[str, Any]) -> None:
        """Written right after its key's decision: it adds to that decision's report."""
        r = self.keys.get((e["kernel"], repr(tuple(e["key"]))))
        if r is not None and r.source == "tuned":
            r.incremental = {k: e[k] for k in ("configs", "new", "anchors", "carried", "carried_failed", "removed",
                                               "scale")}
            r.carried = list(e["carried"])

    def key_event(self, e: dict[str, Any]) -> None:
        if "kernel" not in e:
            return  # a function's (autotune()): its point-decision tells the story
        kind = e["event"]
        if kind == "decision":
            r = _from_decision(e, self.function)
        elif kind == "cache-hit":
            r = _from_cache_hit(e, self.function)
        else:
            r = KeyReport(e["kernel"], repr(tuple(e["key"])), self.function, "error", error=dict(e.get("failures", {})))
        previous = self.keys.get((r.kernel, r.key))
        r.occurrences = 1 + (previous.occurrences if previous else 0)
        r.compile = self.precompiles.get((r.kernel, r.key)) or (previous.compile if previous else None)
        r.shared_rungs = self.waves.pop((r.kernel, r.key), [])
        self.keys[(r.kernel, r.key)] = r


# How the report reads each kind of event in logs.EVENTS; the kinds it does not read are in IGNORED,
# with the reason. tests/test_logs_schema.py holds the two together to EVENTS.
_READERS: dict[str, Callable[[_Story, dict[str, Any]], None]] = {
    "call": _Story.call,
    "end": _Story.end,
    "point-decision": _Story.point_decision,
    "decision": _Story.key_event,
    "cache-hit": _Story.key_event,
    "error": _Story.key_event,
    "online-call": _Story.online_call,
    "freeze-miss": _Story.freeze_miss,
    "tune-ahead": _Story.tune_ahead,
    "incremental": _Story.incremental,
    "precompile": _Story.precompile,
    "compile": _Story.compile,
    "call-budget": _Story.call_budget,
    "rung": _Story.rung,
    "precompile-disagreed": _Story.precompile_disagreed,
}
IGNORED: dict[str, str] = {
    "quarantine": "skipped configs; they fail in the key's decision with the quarantine's reason",
    "quarantine-recovered": "what an earlier, dead process left: it names the config, which the next "
                            "quarantine event of its key skips",
    "slot": "raw samples; the decision carries their reduced statistics",
    "step": "raw end-to-end samples; the decision or point-decision carries their reduced statistics",
    "screen": "a screening pass's survivors; the decision that follows names the configs screened out",
    "readmit": "configs a split screening dropped and lockstep timing brought back; the decision names them",
    "confirm": "the close candidates a key re-times; its decision names them (confirmed) with their times after",
    "confirm-round": "a confirmation race's round; its decision names the candidates (confirmed), those the race "
                     "left behind (raced_out) and their times",
    "lockstep-round": "a round of a screening's survivors; its decision names those that left "
                      "(raced_out, not among the confirmed) with their times",
    "point-failed": "a point's failure; the point-decision carries every point's failure",
    "validation": "each config's check; an invalid config fails in its key's decision with the reason",
    "cache-stale": "why a cached or shipped entry was not used; the key is then tuned again and its decision read",
    "cache-store": "where a winner was stored; the decision before it is the report's",
    "collective": "the schedule's record, the same sequence on every rank; a mismatch raises ScheduleMismatchError",
}


def schema_gaps() -> list[str]:
    """Kinds of logs.EVENTS the report neither reads nor ignores, or that it names but EVENTS lacks."""
    read, ignored, declared = set(_READERS), set(IGNORED), set(EVENTS)
    return ([f"{k}: declared in logs.EVENTS, neither read by the report nor in report.IGNORED"
             for k in sorted(declared - read - ignored)]
            + [f"{k}: read by the report and in report.IGNORED" for k in sorted(read & ignored)]
            + [f"{k}: named by the report, not declared in logs.EVENTS" for k in sorted((read | ignored) - declared)])


def build(log_dir: Path) -> Report:
    events, problems = read_events(log_dir)
    ranks = list(events)
    story = _Story()
    # The lowest rank present tells the story (its cache-hit events carry the entries); the other
    # ranks add their own failure reasons, which only they know.
    primary = ranks[0]
    for e in events[primary]:
        kind = e["event"]
        reader = _READERS.get(kind)
        if reader is None:
            continue  # IGNORED, or a kind this version does not know
        try:
            reader(story, e)
        except (KeyError, TypeError, ValueError) as err:
            problems.append(f"rank-{primary}.jsonl: a {kind} event is missing fields ({err!r}), skipped")
    calls, keys, functions = story.calls, story.keys, story.functions
    for rank, rows in events.items():
        last: dict[tuple[str, str], dict[str, Any]] = {}
        for e in rows:
            if e["event"] == "decision" and "kernel" in e and "key" in e:
                last[(e["kernel"], repr(tuple(e["key"])))] = e
            elif e["event"] == "compile" and rank != primary and (c := calls.get(e.get("function") or "?")):
                c.compiles[rank] = e  # (the node's compile line adds up every local rank's)
        for ident, e in last.items():
            r = keys.get(ident)
            if r is None or r.source != "tuned":
                continue
            for j, reason in (e.get("local_failures") or {}).items():
                r.failures.setdefault(int(j), {})[f"rank {rank}"] = reason
    for r in keys.values():
        _find_screening_ranks(r)
        for j in range(len(r.configs)):
            if j in r.failures or j in r.screened_on or j in r.lockstep_out or j in r.unexplored:
                continue  # a reason is known; or only its screening rank ran it, and has its time
            failed = [rank for rank, row in enumerate(r.per_rank) if j < len(row) and row[j] is None]
            if not failed:
                continue
            if r.split and j in r.screened_out and j not in r.carried and len(failed) == len(r.per_rank):
                r.failures[j] = {f"ranks {failed}": "no time on any rank (screened on one rank, whose log has "
                                                    "no reason)"}
            else:
                r.failures[j] = {f"ranks {failed}": "no time (its rank's log has no reason)"}
    return Report(log_dir, ranks, calls, keys, problems, functions, story.online, story.frozen, story.ahead,
                  story.disagreed)


def _find_screening_ranks(r: KeyReport) -> None:
    """Split screening (decisions.py): rank k screens its share of the configs alone, and a config the screening
    drops is never run by the other ranks. So a dropped config's time is the one rank's that screened it, the
    others have none, and that is no failure: name the rank (the only one with a time). A dropped config with
    no time on any rank failed where it was screened (its rank's local_failures say why); survivors and
    readmitted configs are timed on every rank, where a missing time is a failure as usual."""
    if not r.split:
        return
    for j in r.screened_out:
        if j in r.carried:
            continue  # carried over from an earlier tuning: not screened in this one
        if len(timed := _timed_on(r, j)) == 1:
            r.screened_on[j] = timed[0]
    for j in _left_lockstep(r):
        if len(timed := _timed_on(r, j)) == 1:
            r.lockstep_out[j] = timed[0]


def _timed_on(r: KeyReport, j: int) -> list[int]:
    """The ranks that have a time for config j."""
    return [rank for rank, row in enumerate(r.per_rank) if j < len(row) and row[j] is not None]


def _left_lockstep(r: KeyReport) -> list[int]:
    """The configs a screening's survivors' race left behind (raced_out but not among the confirmed: those left an
    end-to-end confirmation's race)."""
    return [j for j in r.raced_out if j not in (r.confirmed or [])]


# ---- text -------------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "failed" if x is None else f"{x:.4f}"


def _rank_ms(r: KeyReport, rank: int, j: int) -> str:
    """A cell of the per-rank table: the rank's time, "failed", or "-" where the rank never ran the config: a
    split screening dropped it, and another rank screened it (its time, or its logged failure, says which)."""
    row = r.per_rank[rank]
    if j >= len(row):
        return "-"
    if row[j] is None and f"rank {rank}" not in r.failures.get(j, {}) and _screened_elsewhere(r, j):
        return "-"
    return _ms(row[j])


def _screened_elsewhere(r: KeyReport, j: int) -> bool:
    """Config j was dropped by a split screening, and the rank that screened it is known."""
    return j in r.lockstep_out or (r.split and j in r.screened_out and j not in r.carried
            and (j in r.screened_on or any(who.startswith("rank ") for who in r.failures.get(j, {}))))


def _runner_up(r: KeyReport) -> tuple[int, float] | None:
    """The fastest config other than the winner that has a time, and that time; of a key that re-timed its close
    candidates, the fastest other candidate (only they competed: engine/decisions.py)."""
    ranked = sorted((t, j) for j, t in enumerate(r.ms) if t is not None and j != r.winner
                    and (not r.confirmed or j in r.confirmed))
    return (ranked[0][1], ranked[0][0]) if ranked else None


def format_key(r: KeyReport, from_log: bool = True) -> list[str]:
    """The lines of one key; from_log=False words a cache entry on its own (no run to speak of)."""
    where = f" in {r.function}" if r.function else ""
    times = "" if r.occurrences <= 1 else f" ({r.occurrences} occurrences in these logs; the latest is shown)"
    lines = [f"{r.kernel}  key={r.key}{where}{times}"]
    if r.source == "error":
        lines.append("  ERROR      no valid config: every config failed")
        for config, reasons in (r.error or {}).items():
            lines.append(f"    {{{config}}}: " + "; ".join(reasons))
        return lines
    assert r.winner is not None
    how = f"{r.stat}, {r.reduce} over {r.world} ranks" if r.world > 1 else f"{r.stat}, 1 rank"
    best = r.ms[r.winner] if r.winner < len(r.ms) else None
    cache = "the tuning cache" if r.shipped is None else (
        "a shipped config file" if r.shipped == "shipped" else f"the shipped config file {r.shipped}")
    origin = f"  [from {cache}, tuned {r.date or 'earlier'}]" if r.source == "cache" and from_log else ""
    lines.append(f"  chosen     #{r.winner} {{{r.configs[r.winner]}}}  "
                 f"{'-' if best is None else f'{best:.4f} ms'} ({how}){origin}")
    runner_up = _runner_up(r)
    if runner_up is not None and best is not None:
        up, up_ms = runner_up
        margin = up_ms - best
        pct = f", +{100 * margin / best:.1f}%" if best > 0 else ""
        where = f"; its screening time, on rank {r.screened_on[up]} alone" if up in r.screened_on else ""
        lines.append(f"  runner-up  #{up} {{{r.configs[up]}}}  {up_ms:.4f} ms  (+{margin:.4f} ms{pct} slower{where})")
    elif r.ms:
        lines.append("  runner-up  none (no other config has a time)")
    if r.band is not None:
        within = f"configs {r.ties} within it" if len(r.ties) > 1 else "no other config within it"
        decided = ("the fastest won" if r.tie_break is None else
                   f"the tie-break ({r.tie_break}) chose #{r.winner} over the fastest, #{r.fastest}")
        over = f" over the square root of {r.confirm_rounds} interleaved rounds" if r.confirm_rounds else ""
        lines.append(f"  near-ties  band {r.band:.1%} (the fastest's spread {r.spread or 0:.1%}{over}): {within}; "
                     f"{decided}")
    if r.split:
        back = (f"; #{', #'.join(map(str, r.readmitted))} dropped there, then timed in lockstep after all"
                if r.readmitted else "")
        alone = "; a config screened out ran on its screening rank alone" if r.screened_on else ""
        raced = _left_lockstep(r)
        alone += (f"; #{', #'.join(map(str, raced))} left the lockstep rounds early, far behind the fastest"
                  if raced else "")
        lines.append(f"  screening  split over {r.world} ranks (one rank per config), survivors timed on every "
                     f"rank{back}{alone}")
        for n, (j, rank) in enumerate(sorted(r.screened_on.items())):
            lines.append(f"  {'dropped' if n == 0 else '':<10} #{j} {{{r.configs[j]}}}: screened on rank {rank}: "
                         f"{_ms(r.per_rank[rank][j])} ms")
    if r.confirmed:
        lines.append(f"  {_confirmed_line(r)}")
    if r.incremental is not None:
        lines.append(f"  {_incremental_line(r.incremental)}")
    winner_times = [(rank, row[r.winner]) for rank, row in enumerate(r.per_rank) if r.winner < len(row)]
    finite = [t for _, t in winner_times if t is not None]
    if len(finite) > 1:
        spread = max(finite) - min(finite)
        per = ", ".join(f"rank {rank} failed" if t is None else f"rank {rank} {t:.4f} ms" for rank, t in winner_times)
        lines.append(f"  per rank   winner: {per}; spread {spread:.4f} ms ({100 * spread / max(finite):.1f}%)")
    elif finite:
        lines.append(f"  per rank   winner: rank 0 {finite[0]:.4f} ms (one rank)")
    entries = [(j, who, reason) for j in sorted(r.failures) for who, reason in r.failures[j].items()]
    failed = [e for e in entries if not same_binary(e[2])]
    if not failed:
        lines.append("  failures   none")
    # Then the configs left out of the timing as another config's binary: not failures.
    for heading, group in (("failures  ", failed), ("same bin. ", [e for e in entries if same_binary(e[2])])):
        for n, (j, who, reason) in enumerate(group):
            label = heading if n == 0 else " " * len(heading)
            lines.append(f"  {label} #{j} {{{r.configs[j] if j < len(r.configs) else '?'}}}: {who}: {reason}")
    original = (f"{r.executions} executions, {r.tuning_s or 0.0:.2f} s" if r.executions is not None
                else "unknown")
    if r.source == "tuned":
        lines.append(f"  tuning     decided after {original}")
        if r.compile is not None and "counts" in r.compile:
            lines.append(f"  compile    {precompile_text(r.compile)}")
    elif from_log:
        lines.append(f"  tuning     none in this run (cache hit); the original tuning took {original}")
    else:
        lines.append(f"  tuning     took {original}")
    if r.unexplored:
        lines.append(f"  budget     explored {len(r.configs) - len(r.unexplored)} of {len(r.configs)} configs; "
                     "the others never ran (docs/search.md)")
        if r.shared_rungs:
            lines.append(f"             {len(r.shared_rungs)} rungs compiled in one step with other keys' rungs; "
                         f"{sum(o for o, _ in r.shared_rungs)} configs left out of them, to what the budgets paid "
                         f"for; {sum(t for _, t in r.shared_rungs)} of the other keys' new binaries taken instead")
    if r.ms:
        left = _left_lockstep(r)
        lines.append(f"  {'configs':<10}{'ms':>10}  {'q20..q80':>19}"
                     + "".join(f"  {f'rank {k}':>10}" for k in range(len(r.per_rank))) + "  config")
        for j, config in enumerate(r.configs):
            if j in r.unexplored:
                continue
            mark = "*" if j == r.winner else " "
            q = (f"{r.q20[j]:.3f}..{r.q80[j]:.3f}" if j < len(r.q20) and r.q20[j] is not None
                 and j < len(r.q80) and r.q80[j] is not None else "-")
            ranks = "".join(f"  {_rank_ms(r, rank, j):>10}" for rank in range(len(r.per_rank)))
            # Why a config that did not win lost: a reader comparing with an exhaustive sweep finds its pick here.
            carried = ("  (carried over, scaled)" if j in r.carried else
                       f"  (screened out on rank {r.screened_on[j]}, not run on the others)" if j in r.screened_on
                       else f"  (left the lockstep rounds after the first: timed on rank {r.lockstep_out[j]} alone)"
                       if j in r.lockstep_out
                       else "  (left the lockstep rounds early)" if j in left
                       else "  (screened out: its screening time)" if (j in r.screened_out and j != r.winner
                                                                      and j not in r.failures)
                       else "  (per launch: not among the candidates re-timed end to end)"
                       if r.confirmed and r.end_to_end and j not in r.confirmed else
                       "  (end to end)" if r.confirmed and r.end_to_end else "")
            lines.append(f"    {mark} #{j:<3}  {_ms(r.ms[j] if j < len(r.ms) else None):>10}  {q:>19}{ranks}  "
                         f"{config}{carried}")
    return lines


def _confirmed_line(r: KeyReport) -> str:
    """E.g. "confirmed  #1, #2 re-timed interleaved before the decision: #2 ahead by 1.3%"."""
    assert r.confirmed and r.winner is not None  # (format_key's: a decided key)
    names = ", ".join(f"#{j}" for j in r.confirmed) + (
        " (end to end: their times are whole calls, the others' a launch's)" if r.end_to_end else "")
    others = [t for j in r.confirmed if j != r.winner and j < len(r.ms) and (t := r.ms[j]) is not None]
    best = r.ms[r.winner] if r.winner < len(r.ms) else None
    if not others or best is None or best <= 0:
        return f"confirmed  {names} re-timed interleaved before the decision"
    margin = min(others) / best - 1
    ahead = f"ahead by {margin:.1%}" if margin >= 0 else f"within the tie band, {-margin:.1%} behind the fastest"
    raced = [j for j in r.raced_out if j in r.confirmed]
    out = f"; {', '.join(f'#{j}' for j in raced)} left the race after a round, far behind" if raced else ""
    return f"confirmed  {names} re-timed interleaved before the decision: #{r.winner} {ahead}{out}"


def _incremental_line(i: dict[str, Any]) -> str:
    """E.g. "incremental: timed 1 new + 2 anchors of 9, carried 6, scale 1.02"."""
    failed = f" (+{len(i['carried_failed'])} failed before, still failed)" if i["carried_failed"] else ""
    scale = "none (no anchor has a time now: the carried configs were left out)" if i["scale"] is None else \
        f"{i['scale']:.2f}"
    left = f"; {i['removed']} left the list" if i["removed"] else ""
    return (f"incremental: timed {len(i['new'])} new + {len(i['anchors'])} anchors of {i['configs']}, "
            f"carried {len(i['carried'])}{failed}, scale {scale}{left}")


def format_points(f: PointReport) -> list[str]:
    """The function-level table: point, end-to-end time, per-rank spread, winner and margin."""
    margin = "" if f.margin is None else f", {f.margin * 100:.1f}% ahead of the runner-up"
    decided = "" if f.compared is None else " (decided on q80: a point's slow fifth)"
    out = [f"{f.function}: function-level space, winner point#{f.winner} {f.points[f.winner]}{margin} "
           f"(end to end, {f.stat}, {f.reduce} over {f.world} ranks){decided}",
           f"  {'':2}{'#':>3}  {'point':<40} {'end-to-end ms':>14} {'q80 ms':>9} {'per-rank spread':>22}  note"]
    for j, point in enumerate(f.points):
        times = [t for row in f.per_rank if j < len(row) and (t := row[j]) is not None]
        spread = f"{min(times):.4f}..{max(times):.4f}" if times else "-"
        # No time and no failure: never timed (a call's budget spent before the point's turn came).
        untimed = str(j) not in f.failures and (j >= len(f.ms) or f.ms[j] is None)
        note = ("FAILED " + f.failures[str(j)] if str(j) in f.failures else
                "screened out" if j in f.screened_out else "not timed" if untimed else "")
        mark = "*" if j == f.winner else " "
        ms = "-" if untimed else _ms(f.ms[j])
        q80 = "-" if untimed or f.compared is None or j >= len(f.compared) else _ms(f.compared[j])
        out.append(f"  {mark:2}{j:>3}  {str(point):<40} {ms:>14} {q80:>9} {spread:>22}  {note}")
    for k in f.kernels:
        out.append(f"     under the winner: {k['kernel']} key={tuple(k['key'])!r} -> {{{k['config']}}}")
    return out


def _secs(s: float) -> str:
    return f"{s:.3f} s" if abs(s) >= 1 else f"{s * 1e3:.3f} ms"


def format_online(o: OnlineReport) -> list[str]:
    """The cost of tuning online, per session: its calls' time above as many tuned calls, and per key the calls
    it was launched in until decided and their time above the tuned call's (tuned_call_s says which call)."""
    many = len(o.sessions) > 1
    lines = [f"{o.function}: tuned online over {o.calls} calls" + (f" in {len(o.sessions)} sessions" if many else "")]
    pad = "    " if many else "  "
    for n, session in enumerate(o.sessions, 1):
        tuned = tuned_call_s(session)
        fastest = min(session, key=lambda c: c.wall_s)
        total = sum(c.wall_s for c in session)
        costs = key_costs(session)
        ended = all(k.decided_at is not None for k in costs)
        cost = (f"({_secs(total)}), {_secs(total - tuned * len(session))} above {len(session)} tuned calls"
                + ("" if ended else "; not ended when the logs end"))
        if many:
            lines.append(f"  session {n}: {len(session)} calls {cost}")
        else:
            lines[0] += f" {cost}"
        last = (f"its last call, {_secs(session[-1].wall_s)}, also made the last decisions" if ended else
                "no call of it ran every key tuned")
        lines.append(f"{pad}tuned call {_secs(tuned)}: the session's fastest, call {fastest.call} (the calls after a "
                     f"session are not logged; {last})")
        for k in costs:
            until = (f"{k.calls} calls until decided at call {k.decided_at}" if k.decided_at is not None
                     else f"{k.calls} calls, not decided yet")
            lines.append(f"{pad}{k.name}: {until} ({k.slots} slots), {_secs(k.above_s)} above the tuned call")
    return lines


def format_serving(report: Report) -> list[str]:
    """Tune-ahead tables (per size: tuning cost, warm call, throughput) and the keys frozen calls missed."""
    out: list[str] = []
    for function, rows in report.ahead.items():
        out.append(f"{function}: tuned ahead, {len(rows)} sizes")
        out.extend(f"  {line}" for line in ahead_table([rows[size] for size in sorted(rows)]))
        out.append("")
    if report.frozen:
        out.append(f"freeze: {len(report.frozen)} key(s) had no tuned result and ran a borrowed config")
        for m in report.frozen.values():
            ran = f"the winner of {m.nearest}" if m.nearest else "the first config"
            out.append(f"  {m.kernel} key={m.key}: ran {ran}, {{{m.config}}}, met {m.count}x. To {m.fix}")
        out.append("")
    return out


def precompile_text(e: dict[str, Any]) -> str:
    """A key's precompile event in words: configs per place, compile time summed, wall time, parallelism."""
    n = e["counts"]
    par = fmt_parallelism(e.get("parallelism"))
    ranks = f"{n['ranks']} by other local ranks, " if n.get("ranks") else ""
    text = (f"{sum(n.values())} configs: {n['workers']} by workers{shared_ptxas_text(e)}, {n['here']} in-process, "
            f"{ranks}{n['cache']} "
            f"from Triton's cache; {e['compile_s']:.2f} s of compiles in {e['wall_s']:.2f} s (parallelism {par}"
            f"{cores_text(e)})")
    if e.get("undescribed"):
        text += f"; {len(e['undescribed'])} no worker could take: " + next(iter(e["undescribed"].values()))
    return text


def node_compile_lines(by_rank: dict[int, dict[str, Any]]) -> list[str]:
    """Per host with more than one rank: the ranks' compiles together, as the node's cores saw them (a rank's
    own line counts its share only: its parallelism is the node's divided among its local ranks)."""
    hosts: dict[str, list[dict[str, Any]]] = {}
    for e in by_rank.values():
        hosts.setdefault(str(e.get("call", "?")).split(":")[0], []).append(e)
    out = []
    for host, events in sorted(hosts.items()):
        compile_s = sum(e["compile_s"] for e in events)
        wall_s = max(e["wall_s"] for e in events)
        if len(events) < 2 or compile_s <= 0 or wall_s <= 0:
            continue  # one rank (its own line says it all), or nothing compiled (a warm call)
        compiled = sum(e["workers"] + e["here"] for e in events)
        cpu = ({"cores_busy": sum(e["cpu_s"] for e in events) / wall_s}
               if all(e.get("cpu_s") is not None for e in events) else {})
        out.append(f"node {host}: {len(events)} ranks compiled {compiled} configs, {compile_s:.1f} s of compiles in "
                   f"{wall_s:.1f} s, parallelism {fmt_parallelism(compile_s / wall_s)} over "
                   f"{sum(e['pool'] for e in events)} workers{cores_text(cpu)}")
    return out


def format_report(report: Report) -> str:
    out = [f"triton_ctx_tune report: {report.log_dir} (ranks {', '.join(map(str, report.ranks))})", ""]
    if report.calls:
        out.append(f"  {'function':<40} {'calls':>5} {'executions':>10} {'wall s':>8} {'world':>5}  device/timer")
        for c in report.calls.values():
            out.append(f"  {c.function:<40} {c.calls:>5} {c.executions:>10} {c.wall_s:>8.2f} {c.world:>5}  "
                       f"{c.device}/{c.timer}" + (f"  ({len(c.errors)} stopped by an error)" if c.errors else ""))
        for c in report.calls.values():
            if c.compile is not None:
                out.append(f"  {c.function}: {compile_line(c.compile)}")
                out.extend(f"  {c.function}: {line}" for line in node_compile_lines(c.compiles))
        for c in report.calls.values():
            if (b := c.budget_spent) is not None:
                out.append(f"  {c.function}: the call's budget ({b['limit']:g} {b['measure']}) was spent after "
                           f"{b['executions']} executions, {b['seconds']:.2f} s: what was still open was decided on "
                           "the samples taken")
        out.append("")
    for f in report.functions.values():
        out.extend(format_points(f))
        out.append("")
    for o in report.online.values():
        out.extend(format_online(o))
        out.append("")
    out.extend(format_serving(report))
    if not report.keys and not report.functions and not report.ahead and not report.frozen:
        out.append("No key was tuned or read from the cache in these logs.")
    for r in report.keys.values():
        out.extend(format_key(r))
        out.append("")
    if report.disagreed:
        out.append("precompile disagreed with the launch (precompile rejected these configs; their launch compiled "
                   "and ran them, so they were tuned):")
        for kernel, rows in report.disagreed.items():
            out.append(f"  {kernel}: {len(rows)} config(s)")
            out.extend(f"    {row}" for row in rows)
        out.append("")
    for p in report.problems:
        out.append(f"note: {p}")
    return "\n".join(out).rstrip() + "\n"


# ---- plot -------------------------------------------------------------------------------------


def _plot_formats() -> list[str] | None:
    """File extensions matplotlib can write, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only: no display on a cluster node
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_plot_path(path: Path) -> Path:
    """The file `plot` will write, checked before any work: an existing folder, a format matplotlib writes.

    A name without an extension gets ".png", and the caller reports that real name.
    """
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise CtxTuneError(f"cannot write the plot {path}: the directory {parent} {what}. Fix: create it "
                           f"(mkdir -p {parent}) or pass a path in an existing directory.")
    if path.is_dir():
        raise CtxTuneError(f"cannot write the plot {path}: it is a directory. Fix: pass a file name such as "
                           f"{path / 'latency.png'}.")
    formats = _plot_formats()
    ext = path.suffix[1:].lower()
    if formats is not None and ext not in formats:
        raise CtxTuneError(f"cannot write the plot {path}: matplotlib cannot write .{ext} files. Fix: end the name "
                           f"with one of {', '.join('.' + f for f in formats)} (.png if unsure).")
    return path


def plot(report: Report, path: Path) -> Path:
    """Per-config latency bars, one panel per (kernel, key), the winner highlighted; `path` from check_plot_path."""
    if _plot_formats() is None:
        raise MissingDependencyError("report --plot", "matplotlib", "plot")
    import matplotlib.pyplot as plt

    panels = [r for r in report.keys.values() if r.ms]
    if not panels:
        raise CtxTuneError(f"nothing to plot: the logs in {report.log_dir} have no timed decision or cache entry.")
    heights = [max(1.2, 0.45 * len(r.configs) + 0.9) for r in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    try:
        for ax, r in zip(axes[:, 0], panels):
            _draw(ax, r)
        fig.tight_layout()
        _save_atomically(fig, path)
    finally:
        plt.close(fig)
    return path


def _draw(ax: Any, r: KeyReport) -> None:
    ys = list(range(len(r.configs)))
    values = [t if t is not None else 0.0 for t in r.ms]
    colors = ["tab:orange" if j == r.winner else ("tab:red" if t is None else "tab:blue")
              for j, t in enumerate(r.ms)]
    ax.barh(ys, values, color=colors)
    if len(r.q20) == len(r.ms) == len(r.q80):
        lo = [max(0.0, v - q) if q is not None and t is not None else 0.0 for v, q, t in zip(values, r.q20, r.ms)]
        hi = [max(0.0, q - v) if q is not None and t is not None else 0.0 for v, q, t in zip(values, r.q80, r.ms)]
        ax.errorbar(values, ys, xerr=[lo, hi], fmt="none", ecolor="black", capsize=3, linewidth=1)
    for y, t in zip(ys, r.ms):
        ax.text(0 if t is None else t, y, " failed" if t is None else f" {t:.3f}", va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels([f"#{j} {c}" + (" (winner)" if j == r.winner else "") for j, c in enumerate(r.configs)],
                       fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms ({r.stat}, {r.reduce} over {r.world} ranks)" if r.world > 1 else f"ms ({r.stat}, 1 rank)")
    source = " [cache]" if r.source == "cache" else ""
    ax.set_title(f"{r.kernel} key={r.key}{source}", fontsize=10)


def _save_atomically(fig: Any, path: Path) -> None:
    """Into a temporary file beside `path`, then renamed over it: a failed or killed save leaves no half file."""
    ext = path.suffix[1:].lower()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=100, format=ext)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a plot is meant to be shared
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, Exception) and not isinstance(e, CtxTuneError):
            # Some formats need more than matplotlib (pgf: a LaTeX install); say so without a traceback.
            raise CtxTuneError(f"matplotlib could not write the plot {path} ({type(e).__name__}: {e}). "
                               "Fix: choose .png, .svg or .pdf.") from e
        raise
