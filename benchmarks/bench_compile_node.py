"""Cold compile on a node (issue 37): where each key's configs compile, and the cold step's time.

Runs, each arm a fresh job with a fresh, empty Triton cache (run_clients.py and bench_mlp.py make one per
job when TRITON_CACHE_DIR is unset; this script unsets it):

- FLA's training step (benchmarks/clients/client_fla_simple_gla.py: chunked simple GLA forward and backward,
  6 keys) at each world size of --worlds (default 1 and 2 ranks of one node), arms:
  ``ours`` (the default: compile workers), ``ours-noworkers`` (TRITON_CTX_TUNE_COMPILE_WORKERS=0), ``ours-w8``
  and ``ours-w12`` (8 or 12 workers per rank) and ``plain`` (triton.autotune alone);
- the MLP op's cold tuning (bench_mlp.py --table tuning), arms ``ours`` and ``ours-noworkers``, its plain
  triton.autotune baseline from the ``ours`` run.

For every run it prints the cold step (the first call's wall time, executions), the call's ``compile:`` line
(configs by place: workers, in-process, Triton's disk cache; parallelism = the configs' compile time summed
over the wall time), the time from the first launch to the first timed slot, and per key of rank 0 the
precompile counts. Everything goes under --out (default $OUT): logs, JSON, ctx logs, summary.txt, summary.json.

    python3 benchmarks/bench_compile_node.py [--worlds 1,2] [--ops fla,mlp] [--repeats 1]

Needs GPUs, and the FLA client's wheels installed (benchmarks/device_compile_node.sh does both).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPILE_LINE = re.compile(r"\[triton_ctx_tune\] (?P<function>[^:]+): (?P<line>compile: .*)$")

FLA_ARMS = {"ours": ("ours", {}), "ours-noworkers": ("ours", {"TRITON_CTX_TUNE_COMPILE_WORKERS": "0"}),
            "plain": ("plain", {}),
            # ours with rank 0's threads sampled (run_clients.py --profile): where the parent's time goes; the
            # sampler holds the GIL while it walks the stacks, so this arm's times are not the benchmark's.
            "ours-profile": ("ours", {}),
            # ours with smaller pools per rank: whether one worker per core (2 ranks x 16 on the 2-H200 host's 32
            # cores) or fewer finish the step's longest compiles sooner (section 35: the size did not matter).
            "ours-w8": ("ours", {"TRITON_CTX_TUNE_COMPILE_WORKERS": "8"}),
            "ours-w12": ("ours", {"TRITON_CTX_TUNE_COMPILE_WORKERS": "12"})}
MLP_ARMS = {"ours": {}, "ours-noworkers": {"TRITON_CTX_TUNE_COMPILE_WORKERS": "0"}}


def _env(extra: dict[str, str], nproc: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TRITON_CTX_TUNE_COMPILE_WORKERS")}
    # A rank that aborts (SIGABRT at exit, section 35) prints every thread's Python stack.
    env.update(PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", NPROC=str(nproc), **extra)
    return env


def _run(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[int, float, str]:
    """Run a job in its own process group (a job past its time is killed with its ranks); its output in `log`."""
    began = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = 124
    text = log.read_text(errors="replace")
    if code == 124:
        text += "\n[bench_compile_node] timed out\n"
        log.write_text(text)
    return code, time.perf_counter() - began, text


def _compile_lines(text: str) -> list[str]:
    return [m.group("function") + ": " + m.group("line") for m in map(COMPILE_LINE.search, text.splitlines()) if m]


def _events(logs: Path, kind: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted(logs.rglob("rank-0.jsonl")):
        for line in f.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("event") == kind:
                rows.append(row)
    return rows


def _call_lines(logs: Path) -> list[str]:
    """The "compile" events of rank 0's log, as the call's summary prints them (logs.compile_line)."""
    sys.path.insert(0, str(ROOT))
    from triton_ctx_tune.tools.logs import compile_line

    return [f"{e['function']}: {compile_line(e)}" for e in _events(logs, "compile")]


def _key_lines(logs: Path) -> list[str]:
    out = []
    for r in _events(logs, "precompile"):
        n = r.get("counts") or {}
        par = r.get("parallelism")
        out.append(f"    {r['kernel'][:28]:<28} {sum(n.values()):>3} configs: {n.get('workers', 0):>3} workers "
                   f"{n.get('here', 0):>3} here {n.get('cache', 0):>3} cache, {r.get('compile_s', 0.0):6.1f} s in "
                   f"{r.get('wall_s', 0.0):5.1f} s (x{par:.1f})" if par is not None else
                   f"    {r['kernel'][:28]:<28} {n}")
        phases = r.get("phases") or {}
        if phases:  # where this process spent the key's time (precompile.Compiled.phases)
            met = r.get("met_s")
            out.append(f"        met at {met if met is None else round(met, 2)} s; "
                       + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
        spans = sorted((a, b, int(i)) for i, (a, b) in (r.get("spans") or {}).items())
        if spans:  # each config of this rank's share: from its place in the gate to its end, from the key's start
            out.append("        spans: " + " ".join(f"#{i} {a:.1f}-{b:.1f}" for a, b, i in spans))
    return out


def fla(arm: str, world: int, rep: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    mode, extra = FLA_ARMS[arm]
    name = f"fla-{arm}-{world}r-{rep}"
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["./launch", "benchmarks/clients/run_clients.py", "--arm", mode, "--clients", "fla_simple_gla",
           "--step-iters", str(args.step_iters), "--out", str(run_dir / "result.json")] + (
        ["--small"] if args.small else []) + (["--profile", str(run_dir / "profile")] if arm == "ours-profile" else [])
    code, wall, text = _run(cmd, _env(extra, world), run_dir / "run.log", args.timeout_s)
    row: dict[str, Any] = {"op": "fla", "arm": arm, "world": world, "repeat": rep, "rc": code, "job_s": wall,
                           "compile": _compile_lines(text)}
    result = run_dir / "result.json"
    if result.exists():
        rec = json.loads(result.read_text())["results"][0]
        first = rec.get("first_call", {})
        row.update(cold_s=first.get("wall_s"), executions=first.get("executions"),
                   warm_s=rec.get("warm_call", {}).get("wall_s"))
    row["compile_events"] = _events(run_dir / "ctx_logs", "compile")
    row["compile"] = _call_lines(run_dir / "ctx_logs") or row["compile"]
    row["keys"] = _key_lines(run_dir / "ctx_logs")
    return row



def mlp_cold_rows(x: Any) -> Iterator[dict[str, Any]]:
    """The rows of bench_mlp.py's JSON that hold a cold tuning figure (ours_cold_s), wherever they nest."""
    if isinstance(x, dict):
        if "ours_cold_s" in x:
            yield x
        for v in x.values():
            yield from mlp_cold_rows(v)
    elif isinstance(x, list):
        for v in x:
            yield from mlp_cold_rows(v)

def mlp(arm: str, world: int, rep: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    name = f"mlp-{arm}-{world}r-{rep}"
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["./launch", "benchmarks/bench_mlp.py", "--table", "tuning", "--out", str(run_dir)] + (
        ["--small"] if args.small else [])
    if arm != "ours":
        cmd.append("--no-vanilla")
    code, wall, text = _run(cmd, _env(MLP_ARMS[arm], world), run_dir / "run.log", args.timeout_s)
    row: dict[str, Any] = {"op": "mlp", "arm": arm, "world": world, "repeat": rep, "rc": code, "job_s": wall,
                           "compile": _compile_lines(text)}

    for f in sorted(run_dir.glob("*.json")):
        for r in mlp_cold_rows(json.loads(f.read_text())):
            row.update(cold_s=r.get("ours_cold_s"), warm_s=r.get("ours_warm_s"), executions=r.get("ours_executions"),
                       plain_cold_s=r.get("vanilla_cold_s"))
            break
    row["compile_events"] = _events(run_dir / "ctx_logs", "compile")
    row["compile"] = _call_lines(run_dir / "ctx_logs") or row["compile"]  # bench_mlp's calls are quiet
    row["keys"] = _key_lines(run_dir / "ctx_logs")
    return row


def fmt(row: dict[str, Any]) -> list[str]:
    cold = "-" if row.get("cold_s") is None else f"{row['cold_s']:.2f} s"
    warm = "-" if row.get("warm_s") is None else f"{row['warm_s']:.3f} s"
    plain = f", plain triton.autotune cold {row['plain_cold_s']:.2f} s" if row.get("plain_cold_s") else ""
    lines = [f"{row['op'].upper():<4} {row['arm']:<15} world={row['world']} #{row['repeat']}: cold step {cold} "
             f"({row.get('executions', '-')} executions; warm {warm}){plain}; rc={row['rc']}"]
    lines += [f"    {c}" for c in row.get("compile", [])]
    lines += row.get("keys", [])
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"), help="output folder (default $OUT)")
    p.add_argument("--worlds", default="1,2", help="ranks per job, comma-separated (default 1,2)")
    p.add_argument("--ops", default="fla,mlp", help="fla, mlp or both (default fla,mlp)")
    p.add_argument("--arms", default="ours,ours-noworkers,plain", help="arms, comma-separated (plain: FLA only)")
    p.add_argument("--repeats", type=int, default=1, help="rounds; arms alternate within a round (default 1)")
    p.add_argument("--once", default="", help="arms that run in the first round only, e.g. plain (2 minutes a run)")
    p.add_argument("--step-iters", type=int, default=3, help="FLA warm steps timed after the cold one (default 3)")
    p.add_argument("--timeout-s", type=float, default=420.0, help="per job (default 420)")
    p.add_argument("--small", action="store_true", help="tiny shapes (a functional smoke run, not the benchmark)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    worlds = [int(w) for w in args.worlds.split(",") if w]
    arms = [a for a in args.arms.split(",") if a]
    rows: list[dict[str, Any]] = []
    summary = out / "summary.txt"
    for rep in range(1, args.repeats + 1):
        for world in worlds:
            for op in [o for o in args.ops.split(",") if o]:
                for arm in arms:
                    if (op == "mlp" and arm not in MLP_ARMS) or (rep > 1 and arm in args.once.split(",")):
                        continue
                    row = (fla if op == "fla" else mlp)(arm, world, rep, out, args)
                    rows.append(row)
                    text = "\n".join(fmt(row))
                    print(text, flush=True)
                    with summary.open("a") as f:
                        f.write(text + "\n")
                    (out / "summary.json").write_text(json.dumps(rows, indent=1, default=str))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
