"""The MLP op (bench_mlp's `mlp` variant at full size) with fixed picks, against each other in interleaved rounds:
what a kernel choice costs the op as a whole, in two regimes. "flushed" times each call alone after an L2 flush
(bench_mlp's op ratio); "sustained" times 30 calls back to back between one pair of events, as a busy program
runs them. RESULTS.md section 37.

    NPROC=2 ./launch benchmarks/op_ab.py --out /tmp/ab    # a GPU host; prints each pick's ratio to the first
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Picks by config index (bench_mlp's large space): gemm1, GELU, gemm2. The first is what the tuner chose in 15 of
# 15 cold runs (GEMMs at 3 stages, GELU BLOCK 2048); the others swap the GEMMs to 4 stages, GELU to 1024, or both.
PICKS = {"A g13 gelu2048": (13, 4, 13), "B g14 gelu2048": (14, 4, 14), "C g13 gelu1024": (13, 2, 13),
         "D g14 gelu1024": (14, 2, 14)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    p.add_argument("--iters", type=int, default=30, help="op calls per sample (default 30)")
    p.add_argument("--size", default="4096,4096,14336", help="M,H,I (default 4096,4096,14336)")
    p.add_argument("--out", default="benchmarks/results", help="folder for op_ab.json")
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    import benchlib
    from benchlib import Ranks, median, op_ms
    from mlp_ops import KernelSet, Op, config_text, make_inputs

    benchlib.init_process_group()
    ranks = Ranks()
    M, H, I = (int(v) for v in args.size.split(","))
    dtype = torch.bfloat16 if ranks.cuda else torch.float32
    x, w1, w2, w1s, w2s = make_inputs(M, H, I, 0, dtype, ranks.device, ranks.rank, ranks.world)
    del w1, w2
    ks = KernelSet.fresh("ab")
    op = Op("mlp", ks, x, w1s, w2s)
    g, e = ks.for_role("gemm1").configs, ks.for_role("gelu").configs
    # (Modulo: the CPU smoke run's small space has fewer configs.)
    picks = {n: {"gemm1": g[a % len(g)], "gelu": e[b % len(e)], "gemm2": g[c % len(g)]}
             for n, (a, b, c) in PICKS.items()}
    ranks.log("\n".join(f"{n}: {({role: config_text(c) for role, c in pick.items()})}" for n, pick in picks.items()))

    def sustained(call: Callable[[], Any]) -> float:
        for _ in range(3):
            call()
        ranks.barrier()
        if not ranks.cuda:
            began = time.perf_counter()
            for _ in range(args.iters):
                call()
            return (time.perf_counter() - began) * 1e3 / args.iters
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            call()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / args.iters

    names = list(picks)
    out: dict[str, dict[str, list[float]]] = {"flushed": {n: [] for n in names}, "sustained": {n: [] for n in names}}
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            call = lambda pick=picks[n]: op(fixed=pick)  # noqa: E731
            out["flushed"][n].append(max(ranks.gather(op_ms(ranks, call, args.iters, 2))))
            out["sustained"][n].append(max(ranks.gather(sustained(call))))
    lines = []
    for regime, times in out.items():
        first = times[names[0]]
        lines.append(f"{regime}: {names[0]} median {median(first):.4f} ms (the slowest rank per round)")
        for n in names[1:]:
            ratios = [b / a for a, b in zip(first, times[n])]
            lines.append(f"  {n} / {names[0][0]}: median {median(ratios):.4f}, below 1 in "
                         f"{sum(q < 1 for q in ratios)} of {len(ratios)}, range {min(ratios):.4f} to {max(ratios):.4f}")
    ranks.log("\n".join(lines))
    if ranks.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "op_ab.json").write_text(json.dumps({"picks": PICKS, "times": out}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
