"""What the schedule guard costs per tuning step: a step's collectives with their header check, and without.

A tuning step ends with (engine/schedule.py): agree on the step (4 int64), and in a deciding step the
timings' gather (keys x configs x 3 float64) and the decisions' broadcast (keys x configs int64). Each
runs through runtime/collectives.py, on the tuner's own gloo group; the guard adds one all-gather of a
7-int64 header before each. This times both ways, `--reps` times each from a line-up (a plain
barrier, untimed); a rep's time is the slowest rank's, since a step ends when the last rank is through.

    python benchmarks/bench_guard.py --worlds 2 4 8          # starts torchrun itself, one job per world size
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KEYS, CONFIGS = 6, 48  # FLA's step: 6 keys, up to 48 configs


def _rank_main(reps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from triton_ctx_tune.runtime.collectives import Collectives

    dist.init_process_group("gloo")
    comm = Collectives(True, timeout_s=120.0)
    agree = torch.zeros(4, dtype=torch.int64)
    timings = torch.rand(KEYS, CONFIGS, 3, dtype=torch.float64)
    keep = torch.zeros(KEYS, CONFIGS, dtype=torch.int64)

    def guarded_step(deciding: bool) -> None:
        comm.all_gather(agree, "agree on the step")
        if deciding:
            comm.all_gather(timings, "gather timings")
            comm.broadcast_from_root(keep, "broadcast decisions")

    def raw_step(deciding: bool) -> None:
        comm._raw_gather(agree, "agree on the step")
        if deciding:
            comm._raw_gather(timings, "gather timings")
            t = keep.clone()
            comm._wait(dist.broadcast(t, src=0, group=comm._group(), async_op=True), "broadcast decisions")

    arms: dict[str, Callable[[], None]] = {
        "step, guarded": lambda: guarded_step(False), "step, unguarded": lambda: raw_step(False),
        "deciding step, guarded": lambda: guarded_step(True), "deciding step, unguarded": lambda: raw_step(True)}
    comm.barrier("warm up")  # creates the tuner's group outside the timed spans
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(reps):
        for name, fn in arms.items():  # alternating arms: drift lands on all of them alike
            dist.barrier()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    slowest = {name: comm._raw_gather(torch.tensor(v, dtype=torch.float64), "times").amax(0).tolist()
               for name, v in times.items()}
    dist.destroy_process_group()
    return slowest


def _median(v: list[float]) -> float:
    return sorted(v)[len(v) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--out", help="JSON file for the results")
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_main:
        result = _rank_main(args.reps)
        if int(os.environ["RANK"]) == 0:
            Path(args.rank_out).write_text(json.dumps(result))
        return
    results = {}
    for world in args.worlds:
        tmp = Path(f"/tmp/bench_guard_{world}.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", __file__,
               "--rank-main", "--reps", str(args.reps), "--rank-out", str(tmp)]
        subprocess.run(cmd, check=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        slowest = json.loads(tmp.read_text())
        results[world] = {name: {"median_us": _median(v) * 1e6, "p90_us": sorted(v)[int(len(v) * 0.9)] * 1e6}
                          for name, v in slowest.items()}
        for kind in ("step", "deciding step"):
            g, u = results[world][f"{kind}, guarded"], results[world][f"{kind}, unguarded"]
            print(f"world {world}: {kind:13s}: guarded {g['median_us']:8.1f} us (p90 {g['p90_us']:8.1f}), unguarded "
                  f"{u['median_us']:8.1f} us (p90 {u['p90_us']:8.1f}): "
                  f"the guard adds {g['median_us'] - u['median_us']:7.1f} us",
                  flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
