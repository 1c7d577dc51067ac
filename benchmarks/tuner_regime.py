"""The MLP op's GELU candidates as the tuner times them, against the same configs timed inside the op by the in-op
oracle's method, in one process: which part of the tuner's way of timing moves one config against another
(issue 35; RESULTS.md section 44).

The GEMMs get one config (the tuner's usual pick, --gemm), GELU a few (--configs), so each tuning call times only
GELU's candidates. Arms, interleaved over --calls rounds (each a fresh tuning call, Triton's cache warm):
  default        contextual_autotune's defaults (flush_l2="step" since RESULTS section 45: L2 flushed once per
                 re-execution; True before it)
  flush-launch   flush_l2=True (before each timed launch)   flush-step  flush_l2="step"   flush-off  flush_l2=False
  no-lead        no GPU sleep ahead of a timed launch (HostLead.take returns 0)
  no-restore     exactly_once=False (no copies of older state between re-executions)
For each call, GELU's per-config median from the decision event; then each arm's median over calls. The
in-op oracle (tables.in_op_oracle: plain, and with the tuner's lead sleep and flush) runs at the start and the end.

    ./launch benchmarks/tuner_regime.py --out /tmp/tuner_regime
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

ARMS = {"default": {}, "flush-launch": {"flush_l2": True}, "flush-step": {"flush_l2": "step"},
        "flush-off": {"flush_l2": False},
        "no-lead": {"no_lead": True}, "no-restore": {"exactly_once": False}}


def main() -> int:
    from mlp_ops import probe_parser

    p = probe_parser(__doc__, "2,4,6,7")
    p.add_argument("--calls", type=int, default=4, help="tuning calls per arm (default 4)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--rounds", type=int, default=10, help="in-op oracle rounds, at the start and at the end")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    import benchlib
    from benchlib import Ranks, median
    from mlp_ops import KernelSet, Op, config_text, make_inputs
    from tables import in_op_oracle
    from triton_ctx_tune import contextual_autotune
    from triton_ctx_tune.runtime import timing

    benchlib.init_process_group()
    ranks = Ranks()
    x, w1, w2, w1s, w2s = make_inputs(args.M, args.H, args.I, 0, torch.bfloat16, ranks.device, ranks.rank,
                                      ranks.world)
    del w1, w2
    idx = [int(v) for v in args.configs.split(",")]
    ks = KernelSet.fresh("tuner_regime")
    gemm_cfg, gelu_cfgs = ks.matmul.configs[args.gemm], [ks.gelu.configs[i] for i in idx]
    ks.matmul.configs, ks.gelu.configs = [gemm_cfg], list(gelu_cfgs)
    op = Op("mlp", ks, x, w1s, w2s)
    cycles_per_us = timing._sleep_cycles_per_second() / 1e6 if ranks.cuda else 0.0
    take = timing.HostLead.take

    def lead_and_flush() -> None:  # the tuner's order before a timed launch with flush_l2=True
        if ranks.cuda:
            torch.cuda._sleep(int(200 * cycles_per_us))
            benchlib.flush_l2()

    def oracle(tag: str) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for regime, before in (("plain", None), ("sleep200+flush", lead_and_flush)):
            timed = in_op_oracle(op, ranks, {"gemm1": gemm_cfg, "gemm2": gemm_cfg}, {"gelu": list(range(len(idx)))},
                                 args.rounds, 10, before)["gelu"]["ms"]
            out[f"{tag} {regime}"] = {int(j): 1e3 * ms for j, ms in timed.items()}
        return out

    results: dict[str, Any] = {"oracle": oracle("oracle, start"), "calls": {a: [] for a in args.arms.split(",")}}
    for c in range(args.calls):
        for arm in args.arms.split(","):
            spec = dict(ARMS[arm])
            no_lead = spec.pop("no_lead", False)
            log_dir = f"/tmp/tuner_regime_logs/{arm}-{c}"
            tuned = contextual_autotune(is_dist=True, log_dir=log_dir, quiet=True, cache=False, **spec)(
                lambda: op())
            ks.clear_caches()
            timing.HostLead.take = (lambda self, now: 0.0) if no_lead else take  # type: ignore[method-assign]
            try:
                tuned()
            finally:
                timing.HostLead.take = take  # type: ignore[method-assign]
            ranks.barrier()
            events: list[dict[str, Any]] = []
            for path in Path(log_dir).rglob(f"rank-{ranks.rank}.jsonl"):
                events += [json.loads(line) for line in open(path)]
            (d,) = [e for e in events if e["event"] == "decision" and e["kernel"] == "gelu_inplace_kernel"]
            results["calls"][arm].append({"winner": d["winner"], "reduced_us": [1e3 * v for v in d["reduced"]],
                                          "executions": d["executions"]})
    results["oracle"].update(oracle("oracle, end"))
    lines = ["GELU candidates (us): " + "; ".join(f"#{j} = config {i}: {config_text(gelu_cfgs[j])}"
                                                for j, i in enumerate(idx))]
    for name, times in results["oracle"].items():
        best = min(times.values())
        lines.append(f"  {name:28s} " + "  ".join(f"#{j} {t:6.2f} ({t / best:.3f})" for j, t in times.items()))
    for arm, calls in results["calls"].items():
        med = {j: median([c["reduced_us"][j] for c in calls]) for j in range(len(idx))}
        best = min(med.values())
        lines.append(f"  tuner {arm:22s} " + "  ".join(f"#{j} {t:6.2f} ({t / best:.3f})" for j, t in med.items())
                     + f"  winners {[c['winner'] for c in calls]}")
    ranks.log("\n".join(lines))
    if ranks.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "tuner_regime.json").write_text(json.dumps({"args": vars(args), **results}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
