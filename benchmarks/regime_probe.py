"""The MLP op's GELU configs timed inside the op in several regimes: what, in the tuner's way of timing a launch,
moves one config against another (RESULTS.md section 43).

Each sample is the median over --iters whole-op calls (the op's other kernels at fixed configs, L2 flushed before
each call) of GELU's span between two CUDA events. Regimes, applied just before GELU's start event:
  plain        nothing (the in-op oracle's regime)
  sleep-Xus    torch.cuda._sleep for X us first (the tuner's lead, which keeps the GPU ahead of the host)
  flush        an L2 flush first (flush_l2=True: Triton's _bench)
  sleep+flush  both, sleep first (the tuner's order with flush_l2=True)
  after-gemm0  gemm1 at config 0 (small tiles) instead of the tuner's pick, nothing else
  idle-Xms     before each op call, a synchronize and X ms of host time with the GPU idle (the tuner's steps keep
               the GPU busy about 1 ms in 4)
  idle+sleep+flush   idle-Xms (the largest X), then the tuner's lead and flush before GELU
Rounds are interleaved and rotated; each config's time is the median over rounds. After each GELU launch the
SM clock is read off a short torch.cuda._sleep between two events (cycles over elapsed time): "MHz".

    ./launch benchmarks/regime_probe.py --I 7168 --out /tmp/regimes    # one GPU; prints a table
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    from mlp_ops import probe_parser

    p = probe_parser(__doc__, "2,3,4,6")
    p.add_argument("--sleeps-us", default="200,1000", help="sleep regimes, us (default 200,1000)")
    p.add_argument("--idle-ms", default="3", help="idle regimes, ms of host time per op call (default 3)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    import benchlib
    from benchlib import Ranks, median
    from mlp_ops import KernelSet, Op, config_text, make_inputs
    from triton_ctx_tune.runtime import timing

    benchlib.init_process_group()
    ranks = Ranks()
    dtype = torch.bfloat16
    x, w1, w2, w1s, w2s = make_inputs(args.M, args.H, args.I, 0, dtype, ranks.device, ranks.rank, ranks.world)
    del w1, w2
    ks = KernelSet.fresh("regimes")
    op = Op("mlp", ks, x, w1s, w2s)
    gemm, gelu = ks.for_role("gemm1").configs, ks.for_role("gelu").configs
    cycles_per_us = timing._sleep_cycles_per_second() / 1e6
    regimes: dict[str, dict[str, Any]] = {"plain": {}}
    for us in (int(v) for v in args.sleeps_us.split(",") if v):
        regimes[f"sleep-{us}us"] = {"sleep_us": us}
    regimes["flush"] = {"flush": True}
    regimes["sleep+flush"] = {"sleep_us": int(args.sleeps_us.split(",")[-1]), "flush": True}
    regimes["after-gemm0"] = {"gemm1": 0}
    idles = [float(v) for v in args.idle_ms.split(",") if v]
    for ms in idles:
        regimes[f"idle-{ms:g}ms"] = {"idle_ms": ms}
    if idles:
        regimes["idle+sleep+flush"] = {"idle_ms": idles[-1], "sleep_us": int(args.sleeps_us.split(",")[-1] or 0),
                                       "flush": True}
    clock_cycles = 20_000
    clocks: dict[str, list[float]] = {}
    idx = [int(v) for v in args.configs.split(",")]

    def sample(cfg: int, name: str) -> float:
        regime = regimes[name]
        fixed = {"gemm1": gemm[regime.get("gemm1", args.gemm)], "gelu": gelu[cfg], "gemm2": gemm[args.gemm]}

        def before() -> None:
            if regime.get("sleep_us"):
                torch.cuda._sleep(int(regime["sleep_us"] * cycles_per_us))
            if regime.get("flush"):
                benchlib.flush_l2()

        def before_call() -> None:
            if regime.get("idle_ms"):
                torch.cuda.synchronize()
                time.sleep(regime["idle_ms"] / 1e3)

        marks: list[Any] = []

        def after() -> None:
            pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            pair[0].record()
            torch.cuda._sleep(clock_cycles)
            pair[1].record()
            marks.append(pair)

        ms = op.role_ms(ranks, "gelu", fixed, args.iters, before, before_call, after)
        torch.cuda.synchronize()
        mhz = [clock_cycles / (a.elapsed_time(b) * 1e3) for a, b in marks]
        clocks.setdefault(f"{name}|{cfg}", []).append(median(mhz))
        return ms

    cells = [(r, c) for r in regimes for c in idx]
    per_round: dict[str, list[float]] = {f"{r}|{c}": [] for r, c in cells}
    for k in range(args.rounds):
        for r, c in cells[k % len(cells):] + cells[:k % len(cells)]:
            per_round[f"{r}|{c}"].append(max(ranks.gather(sample(c, r))))
    lines = [f"GELU in the op, {args.rounds} rounds x {args.iters} calls, us (median over rounds); configs: "
             + "; ".join(f"#{c} {config_text(gelu[c])}" for c in idx)]
    for r in regimes:
        times = {c: 1e3 * median(per_round[f"{r}|{c}"]) for c in idx}
        best = min(times.values())
        mhz = median([m for c in idx for m in clocks.get(f"{r}|{c}", [])] or [0.0])
        lines.append(f"  {r:16s} " + "  ".join(f"#{c} {t:6.2f} ({t / best:.3f})" for c, t in times.items())
                     + f"  SM {mhz:5.0f} MHz")
    ranks.log("\n".join(lines))
    if ranks.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "regime_probe.json").write_text(json.dumps({"args": vars(args), "per_round_ms": per_round,
                                                                   "regimes": regimes, "sm_mhz": clocks}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
