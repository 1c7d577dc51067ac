"""What one tuning step's collectives cost at W ranks, through the tuner's own Collectives (gloo, or NCCL).

A tuning step makes these collectives (engine/session.py, engine/decisions.py, engine/executor.py,
compile/precompile.py, store/cache.py, store/quarantine.py):
  every step           agree on the step's digest: one all_gather of 3 int64 (digest, failure flag)
  a deciding step      + all_gather of every rank's (stat, q20, q80) per key and config, float64
                       + broadcast of rank 0's keep-mask per key and config, int64
  the step meeting keys + per key: the cache lookup's agree (2 int64 of payload), the quarantine's
                       share_failures, precompile's two share_failures (int64 flags, one per config)
The timings gathered are three numbers per config, not the raw samples; a raw-sample variant (n_repeat=5)
is measured beside them to show what payload size changes.

Each collective runs `--reps` times from a line-up (a plain dist.barrier, untimed); a rep's time is the
slowest rank's, since a step ends for everyone when the last rank is through. Median and p90 per
collective and per step kind. The same gather as a plain blocking dist.all_gather shows what the
Collectives' deadline (a polling wait) adds. Then, unless --no-tuning, a real tuning call of a trivial
kernel (8 configs, the interpreter on the CPU) with every Collectives method timed (the outermost call only).

    python benchmarks/bench_collectives.py --worlds 2 4 8 --out benchmarks/results/<commit>-collectives-cpu
    # it starts torchrun --standalone --nproc_per_node W itself, one job per world size, each with a deadline
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KEYS, CONFIGS, STATS, N_REPEAT = 6, 48, 3, 5  # FLA's step: 6 keys, up to 48 configs; (stat, q20, q80) per config
DEADLINE_S = 600


# ---- worker: one rank ---------------------------------------------------------------------------

def _ops(comm: Any, dist: Any, torch: Any) -> dict[str, Callable[[], Any]]:
    """Each collective as a tuning step makes it, on payloads of FLA's size."""
    rank = dist.get_rank()
    digest = json.dumps({"new": [], "launches": 6, "measured": None, "failed": None}, sort_keys=True).encode()
    timings = torch.rand(KEYS, CONFIGS, STATS, dtype=torch.float64)
    samples = torch.rand(KEYS, CONFIGS, N_REPEAT, dtype=torch.float64)
    keep = torch.zeros(KEYS, CONFIGS, dtype=torch.int64)
    lookup_identity = b'{"kernel": "chunk_fwd_kernel_h", "key": "(64, False, ...)"}'

    def agree() -> None:
        comm.agree(digest, "agree on what to tune", lambda: digest, payload=(0,))

    def cache_lookup() -> None:
        comm.agree(lookup_identity, "look up the tuning cache", lambda: lookup_identity, payload=(0, -1))

    def gather_timings() -> None:
        comm.all_gather(timings, "gather timings")

    def gather_samples() -> None:
        comm.all_gather(samples, "gather raw samples (not what the tuner sends)")

    def broadcast_keep() -> None:
        comm.broadcast_from_root(keep, "broadcast decisions")

    def share_none() -> None:
        comm.share_failures({}, CONFIGS, "share precompile results")

    def share_one() -> None:  # the rare path: one rank's config failed, so the reasons are gathered too
        comm.share_failures({7: "OutOfResources: shared memory"} if rank == 1 else {}, CONFIGS, "share failures")

    def raw_gather_timings() -> None:
        out = [torch.empty_like(timings) for _ in range(dist.get_world_size())]
        dist.all_gather(out, timings)

    def plain_step() -> None:
        agree()

    def deciding_step() -> None:
        agree()
        gather_timings()
        broadcast_keep()

    def meeting_step() -> None:
        for _ in range(KEYS):
            cache_lookup()  # in the execution, at each key's first launch
        agree()
        for _ in range(KEYS):
            share_none()  # quarantine
            share_none()  # precompile: compile results
            share_none()  # precompile: load results

    return {"agree": agree, "cache_lookup_agree": cache_lookup, "gather_timings_6x48x3": gather_timings,
            "gather_samples_6x48x5": gather_samples, "broadcast_keep_6x48": broadcast_keep,
            "share_failures_none_48": share_none, "share_failures_one_48": share_one,
            "raw_dist_all_gather_6x48x3": raw_gather_timings,
            "step_plain": plain_step, "step_deciding": deciding_step, "step_meeting_6_keys": meeting_step}


def _quantiles(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]
    return {"median_ms": q(0.5) * 1e3, "p90_ms": q(0.9) * 1e3, "min_ms": s[0] * 1e3, "max_ms": s[-1] * 1e3}


def measure(reps: int, warmup: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from triton_ctx_tune.runtime.collectives import Collectives

    comm = Collectives(True, timeout_s=300.0)
    out: dict[str, Any] = {}
    for name, op in _ops(comm, dist, torch).items():
        for _ in range(warmup):
            op()
        mine = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            mine.append(time.perf_counter() - t0)
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        slowest = [max(ranks) for ranks in zip(*everyone)]
        out[name] = {"slowest_rank": _quantiles(slowest), "rank0": _quantiles(everyone[0])}
    return out


class CollectiveClock:
    """Times every Collectives method a tuning call makes (outermost calls only: agree calls all_gather)."""

    METHODS = ("agree", "all_gather", "all_gather_bytes", "broadcast_from_root", "barrier", "share_failures")

    def __init__(self) -> None:
        self.depth = 0
        self.seconds = 0.0
        self.calls: dict[str, int] = {}
        self.by_what: dict[str, float] = {}

    def install(self) -> None:
        from triton_ctx_tune.runtime import collectives

        for name in self.METHODS:
            original = getattr(collectives.Collectives, name)
            setattr(collectives.Collectives, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        clock = self

        @functools.wraps(original)
        def timed(comm: Any, *args: Any, **kwargs: Any) -> Any:
            if clock.depth or not comm.active:
                return original(comm, *args, **kwargs)
            clock.depth += 1
            t0 = time.perf_counter()
            try:
                return original(comm, *args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                clock.depth -= 1
                clock.seconds += dt
                what = f"{name}: {args[1] if name == 'agree' else args[-1] if args else '?'}"
                clock.calls[what] = clock.calls.get(what, 0) + 1
                clock.by_what[what] = clock.by_what.get(what, 0.0) + dt
        return timed


def tuning_call(n_configs: int) -> dict[str, Any]:
    """A real tuning call: one kernel, `n_configs` configs, the tuner's defaults but n_warmup=1, n_repeat=3."""
    import torch
    import torch.distributed as dist
    import triton
    import triton.language as tl

    from triton_ctx_tune import contextual_autotune

    clock = CollectiveClock()
    clock.install()

    grid = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64, 128, 256) for w in (2, 4)]

    @triton.autotune(configs=grid[:n_configs], key=["n"])
    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    @contextual_autotune(is_dist=True, cache=False, n_warmup=1, n_repeat=3)
    def op(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        add_one[lambda meta: (triton.cdiv(h.numel(), meta["BLOCK"]),)](h, h.numel())
        return h

    x = torch.arange(256, dtype=torch.float32)
    dist.barrier()
    t0 = time.perf_counter()
    op(x)
    wall = time.perf_counter() - t0
    record = {"wall_s": wall, "executions": op.last_call.executions, "collective_s": clock.seconds,
              "collective_calls": sum(clock.calls.values()), "calls": clock.calls, "by_what_s": clock.by_what}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, record)
    return {"per_rank": everyone}


def worker(args: argparse.Namespace) -> None:
    import datetime

    import torch.distributed as dist

    from benchmarks import benchlib

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    ranks = benchlib.Ranks()
    result: dict[str, Any] = {"meta": benchlib.provenance(ranks), "reps": args.reps, "warmup": args.warmup,
                              "payload": {"keys": KEYS, "configs": CONFIGS, "stats": STATS, "n_repeat": N_REPEAT},
                              "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()}
    ranks.log(f"world {ranks.world}: {args.reps} reps per collective")
    result["collectives"] = measure(args.reps, args.warmup)
    if not args.no_tuning:
        ranks.log("a real tuning call")
        result["tuning_call"] = tuning_call(args.tuning_configs)
    result["loadavg_at_end"] = os.getloadavg()  # other jobs on the machine share its cores
    if ranks.rank == 0:
        benchlib.write_json(Path(args.out) / f"collectives-{ranks.world}ranks.json", result)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # skip the interpreter's teardown under gloo (tests/dist_worker.py says why)


# ---- parent: one torchrun per world size -----------------------------------------------------------

def launch(world: int, args: argparse.Namespace) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               TRITON_CTX_TUNE_QUIET="1", TRITON_CTX_TUNE_LOG_DIR=str(Path(args.out) / f"logs-{world}ranks"),
               BENCH_COLLECTIVES_WORKER="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", __file__,
           "--out", args.out, "--reps", str(args.reps), "--warmup", str(args.warmup),
           "--tuning-configs", str(args.tuning_configs)] + (["--no-tuning"] if args.no_tuning else [])
    with open(Path(args.out) / f"stdout-{world}ranks.txt", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.deadline)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its ranks share its session
            proc.wait()
            raise SystemExit(f"{world} ranks: still running after {args.deadline} s, killed") from None
    if rc != 0:
        raise SystemExit(f"{world} ranks: torchrun exited with {rc}; see stdout-{world}ranks.txt")


def table(out: Path, worlds: list[int]) -> str:
    """Markdown: one row per collective, median / p90 of the slowest rank per world size (ms)."""
    results = {w: json.loads((out / f"collectives-{w}ranks.json").read_text()) for w in worlds}
    names = list(results[worlds[0]]["collectives"])
    head = "| collective | " + " | ".join(f"{w} ranks median / p90 (ms)" for w in worlds) + " |"
    lines = [head, "|---" * (len(worlds) + 1) + "|"]
    for name in names:
        cells = [results[w]["collectives"][name]["slowest_rank"] for w in worlds]
        lines.append(f"| {name} | " + " | ".join(f"{c['median_ms']:.3f} / {c['p90_ms']:.3f}" for c in cells) + " |")
    if all("tuning_call" in r for r in results.values()):
        lines += ["", "| ranks | executions | wall s (slowest rank) | in collectives s (rank 0) | collective calls "
                  "(rank 0) | per execution ms (rank 0) |", "|---|---|---|---|---|---|"]
        for w in worlds:
            rows = results[w]["tuning_call"]["per_rank"]
            r0 = rows[0]
            lines.append(f"| {w} | {r0['executions']} | {max(r['wall_s'] for r in rows):.3f} | "
                         f"{r0['collective_s']:.3f} | {r0['collective_calls']} | "
                         f"{r0['collective_s'] / r0['executions'] * 1e3:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--tuning-configs", type=int, default=8)
    parser.add_argument("--no-tuning", action="store_true")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds per world size")
    args = parser.parse_args()
    if os.environ.get("BENCH_COLLECTIVES_WORKER"):
        worker(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for world in args.worlds:
        started = time.monotonic()
        launch(world, args)
        print(f"{world} ranks: {time.monotonic() - started:.1f} s", flush=True)
    text = table(out, args.worlds)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
