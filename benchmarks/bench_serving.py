"""The serving probe (issue 25): a tuned MLP under a stream of requests whose token count M changes.

    ./launch benchmarks/bench_serving.py --out benchmarks/results/serving       # one process per GPU
    NPROC=1 ./launch benchmarks/bench_serving.py --small --out /tmp/serving     # CPU smoke (interpreter)

The op is examples/tp_mlp.py's: GEMM -> in-place GELU -> GEMM -> all_reduce (bf16, H=4096, I=14336 split
over ranks), on fresh copies of the example's two @triton.autotune kernels per arm. Arms, each with its own
Triton cache directory and tuning-cache directory, so each starts as a server process does, cold:

  fixed    every kernel launched with one hand-picked config (mlp_ops.named_default): never tunes
  fixed-autotuner  the same configs, each kernel's only config, launched through Triton's Autotuner.run:
           what a launch through any autotuner's dispatch costs on the host
  vanilla  plain triton.autotune: each new M is tuned by Triton on the request that meets it
  ours     contextual_autotune(is_dist=True): one warm-up call at --warm-M, then the requests (today's default)
  ahead    contextual_autotune(is_dist=True, buckets={"M": "pow2", "n_elements": "pow2"}, freeze=True):
           tune_ahead over every bucket up to the largest request, then the requests, frozen

Every arm serves the same --requests requests, M drawn (seeded) from --sizes; each is synchronized and timed
on the host. A request whose call tuned (ours: `last_call.executions > 1`; vanilla: Autotuner.cache grew)
counts as tuning on the request path. Then the steady state: the same requests again, the arms interleaved
request by request.

Also measured: tune_ahead over the request sizes themselves, per M (no buckets), against tuning one size cold
alone, times the number of sizes; each size's kernel time (do_bench per kernel, summed) under the bucketed
winners against the per-M winners (the loss from bucketing); and, with 2 or more ranks, the tune-ahead of a
collective-free variant (no all_reduce, is_dist=False, a data-parallel server) in lockstep and spread.
Rank 0 writes <out>/serving-<world>ranks-<gpu>.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048]
SMALL_SIZES = [1, 3, 4, 8, 12, 16]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/serving")
    p.add_argument("--small", action="store_true", help="tiny shapes and few requests, for CPU smoke runs")
    p.add_argument("--requests", type=int, help="requests per arm (default 200; --small 12)")
    p.add_argument("--warm-M", type=int, help="the 'ours' arm's warm-up size (default 512; --small 8)")
    p.add_argument("--arms", default="fixed,fixed-autotuner,vanilla,ours,ahead",
                   help="comma-separated subset of the arms")
    p.add_argument("--no-extras", action="store_true", help="skip the per-M tune-ahead, loss and spread parts")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.sizes = SMALL_SIZES if args.small else SIZES
    args.H, args.I = (32, 64) if args.small else (4096, 14336)
    args.requests = args.requests or (12 if args.small else 200)
    args.warm_M = args.warm_M or (8 if args.small else 512)
    args.arms = [a for a in args.arms.split(",") if a]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"  # Triton's own result cache would hide vanilla's tuning
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import benchlib  # noqa: E402  (imports torch and triton: after the environment is set)

    benchlib.init_process_group()
    ranks = benchlib.Ranks()
    try:
        result = run(args, ranks)
        if ranks.rank == 0:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"serving-{ranks.world}ranks-{benchlib.gpu_short_name(benchlib.gpu_name())}.json"
            benchlib.write_json(path, {"provenance": benchlib.provenance(ranks), "args": vars(args), **result})
            print(f"wrote {path}")
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


class Arm:
    """One arm's kernels, caches and op; `fn(x)` is the function a server calls."""

    def __init__(self, name: str, args: argparse.Namespace, ranks: Any, shards: tuple, collective: bool = True,
                 **tune: Any) -> None:
        import torch.distributed as dist

        from mlp_ops import KernelSet, gelu_, matmul, named_default
        from triton_ctx_tune import contextual_autotune

        self.name, self.ranks = name, ranks
        run_dir = os.environ.get("TORCHELASTIC_RUN_ID") or str(os.getpid())
        root = Path(tempfile.gettempdir()) / f"bench-serving-{run_dir}-{name}-r{ranks.rank}"
        os.environ["TRITON_CACHE_DIR"] = str(root / "triton")  # Triton reads it at every compile
        from benchlib import host_do_bench, interpreting

        # Under the interpreter Triton's own do_bench cannot run: a host-clock stand-in keeps vanilla's path.
        self.ks = KernelSet.fresh(name, do_bench=host_do_bench if interpreting() and name == "vanilla" else None)
        w1s, w2s = self.shards = shards
        fixed = None
        if name == "fixed":
            fixed = {"m": named_default(self.ks.matmul, "matmul")[1], "g": named_default(self.ks.gelu, "gelu")[1]}
        if name == "fixed-autotuner":  # the same configs, launched through Triton's Autotuner.run (one config each)
            self.ks.matmul.configs = [named_default(self.ks.matmul, "matmul")[1]]
            self.ks.gelu.configs = [named_default(self.ks.gelu, "gelu")[1]]

        def mlp(x):
            import torch

            h = torch.empty(x.shape[0], w1s.shape[1], dtype=x.dtype, device=x.device)
            matmul(self.ks, x, w1s, h, fixed and fixed["m"])
            gelu_(self.ks, h, fixed and fixed["g"])
            y = torch.empty(x.shape[0], w2s.shape[1], dtype=x.dtype, device=x.device)
            matmul(self.ks, h, w2s, y, fixed and fixed["m"])
            if collective:
                dist.all_reduce(y)
            return y

        mlp.__name__ = mlp.__qualname__ = f"serving_{name}"
        self.tuned = None
        if tune:
            self.tuned = contextual_autotune(log_dir=str(root / "logs"), cache_dir=str(root / "cache"), quiet=True,
                                             **tune)(mlp)
        self.fn: Callable[[Any], Any] = self.tuned if self.tuned is not None else mlp

    def picks(self, x: Any) -> list[Any]:
        """The Config each launch of the op at x's M runs (gemm1, gelu, gemm2), read from Autotuner.cache."""
        import torch

        from mlp_ops import matmul_args, triton_key

        h = torch.empty(x.shape[0], self.shards[0].shape[1], dtype=x.dtype, device=x.device)
        y = torch.empty(x.shape[0], self.shards[1].shape[1], dtype=x.dtype, device=x.device)
        keys = [(self.ks.matmul, triton_key(self.ks.matmul, matmul_args(x, self.shards[0], h))),
                (self.ks.gelu, triton_key(self.ks.gelu, (h, h.numel()))),
                (self.ks.matmul, triton_key(self.ks.matmul, matmul_args(h, self.shards[1], y)))]
        return [at.cache.get(k) for at, k in keys]

    def kernels_ms(self, x: Any, configs: list[Any], rep_ms: int) -> float:
        """GPU time of the op's three kernels at x's M with `configs` (do_bench each, summed)."""
        import torch

        from benchlib import kernel_ms
        from mlp_ops import gelu_, matmul

        w1s, w2s = self.shards
        h = torch.empty(x.shape[0], w1s.shape[1], dtype=x.dtype, device=x.device)
        matmul(self.ks, x, w1s, h, configs[0])
        act = h.clone()
        y = torch.empty(x.shape[0], w2s.shape[1], dtype=x.dtype, device=x.device)
        return (kernel_ms(lambda: matmul(self.ks, x, w1s, h, configs[0]), rep_ms)
                + kernel_ms(lambda: gelu_(self.ks, act, configs[1]), rep_ms)
                + kernel_ms(lambda: matmul(self.ks, h, w2s, y, configs[2]), rep_ms))

    def cached_keys(self) -> int:
        return sum(len(at.cache) for at in self.ks.autotuners().values())

    def tuned_on_last_call(self, keys_before: int) -> bool:
        """Ours: the call re-executed the function. Plain triton.autotune: it benchmarked a new key."""
        if self.tuned is None:
            return self.name == "vanilla" and self.cached_keys() > keys_before
        stats = self.tuned.last_call
        return stats is not None and stats.executions > 1


def _flops(args: argparse.Namespace, world: int) -> Callable[[Any], float]:
    return lambda x: 4.0 * x.shape[0] * args.H * (args.I // world)


def serve(arms: list[Arm], xs: dict[int, Any], order: list[int]) -> dict[str, dict[str, Any]]:
    """The request stream, each call synchronized and timed on the host; with several arms, interleaved
    request by request, so that the machine's drift hits every arm alike."""
    import numpy as np

    times: dict[str, list[float]] = {arm.name: [] for arm in arms}
    tuned = {arm.name: 0 for arm in arms}
    stalled = {arm.name: 0.0 for arm in arms}
    for M in order:
        for arm in arms:
            arm.ranks.sync()
            keys = arm.cached_keys()
            t0 = time.perf_counter()
            arm.fn(xs[M])
            arm.ranks.sync()
            dt = time.perf_counter() - t0
            times[arm.name].append(dt * 1e3)
            if arm.tuned_on_last_call(keys):
                tuned[arm.name] += 1
                stalled[arm.name] += dt
    return {name: {"requests": len(ms), "tuning_calls_on_path": tuned[name], "stall_s": stalled[name],
                   "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
                   "max_ms": float(np.max(ms)), "total_s": float(np.sum(ms) / 1e3)} for name, ms in times.items()}


def run(args: argparse.Namespace, ranks: Any) -> dict[str, Any]:
    import random

    import torch

    from benchlib import geomean
    from mlp_ops import make_inputs
    from tables import prime

    dtype = torch.float32 if not ranks.cuda else torch.bfloat16
    top = max(args.sizes)
    x, _, _, w1s, w2s = make_inputs(top, args.H, args.I, args.seed, dtype, ranks.device, ranks.rank, ranks.world)
    xs = {M: x[:M] for M in args.sizes}
    rng = random.Random(args.seed)
    order = [rng.choice(args.sizes) for _ in range(args.requests)]
    prime(ranks)
    tp = dict(is_dist=True, flops=_flops(args, ranks.world))
    result: dict[str, Any] = {"sizes": args.sizes, "arms": {}, "order": order}
    arms: dict[str, Arm] = {}
    for name in args.arms:
        ranks.log(f"arm {name} ...")
        if name in ("fixed", "fixed-autotuner", "vanilla"):
            arm = Arm(name, args, ranks, (w1s, w2s))
            rec: dict[str, Any] = {}
        elif name == "ours":
            arm = Arm(name, args, ranks, (w1s, w2s), **tp)
            t0 = time.perf_counter()
            arm.fn(xs[args.warm_M] if args.warm_M in xs else x[:args.warm_M])
            ranks.sync()
            rec = {"warm_up_s": time.perf_counter() - t0}
        elif name == "ahead":
            arm = Arm(name, args, ranks, (w1s, w2s), buckets={"M": "pow2", "n_elements": "pow2"}, freeze=True, **tp)
            t0 = time.perf_counter()
            rows = arm.tuned.tune_ahead(dim="M", up_to=top, inputs_for=lambda M: (x[:M],))
            ranks.sync()
            rec = {"tune_ahead_s": time.perf_counter() - t0, "tune_ahead_rows": [vars(r) for r in rows]}
        else:
            raise SystemExit(f"--arms: unknown arm {name!r}; expected fixed, fixed-autotuner, vanilla, ours or ahead")
        ranks.barrier()
        rec.update(serve([arm], xs, order)[arm.name])
        result["arms"][name] = rec
        arms[name] = arm
        ranks.log(f"arm {name}: {rec}")

    # Steady state: the same requests again, every shape met and compiled, the arms interleaved request by
    # request, so that the machine's drift (clocks, other tenants) hits every arm alike.
    steady = serve(list(arms.values()), xs, order)
    for name, rec in steady.items():
        result["arms"][name]["steady"] = rec
    ranks.log(f"steady: {steady}")

    if not args.no_extras:
        result["per_m"] = per_m_extras(args, ranks, x, (w1s, w2s), tp, arms.get("ahead"), geomean)
        if ranks.world >= 2:
            result["spread"] = spread_extras(args, ranks, x, (w1s, w2s))
    return result


def per_m_extras(args: argparse.Namespace, ranks: Any, x: Any, shards: tuple, tp: dict[str, Any],
                 ahead: Arm | None, geomean: Callable[..., float]) -> dict[str, Any]:
    """Tune-ahead of every size per M against one size alone; op time per size, bucketed against per-M."""
    one = Arm("one-size", args, ranks, shards, **tp)
    t0 = time.perf_counter()
    one.fn(x[:args.warm_M])
    ranks.sync()
    one_s = time.perf_counter() - t0
    per_m = Arm("per-m", args, ranks, shards, **tp)
    t0 = time.perf_counter()
    rows = per_m.tuned.tune_ahead(sizes=args.sizes, inputs_for=lambda M: (x[:M],))
    ranks.sync()
    ahead_s = time.perf_counter() - t0
    out: dict[str, Any] = {"one_size_cold_s": one_s, "one_size_M": args.warm_M, "tune_ahead_all_sizes_s": ahead_s,
                           "ratio_to_one_size_times_n": ahead_s / (one_s * len(args.sizes)),
                           "rows": [vars(r) for r in rows]}
    if ahead is not None:
        from mlp_ops import config_text

        rep_ms = 1 if not ranks.cuda else 50
        loss = {}
        for M in args.sizes:
            bucket_cfgs, exact_cfgs = ahead.picks(x[:M]), per_m.picks(x[:M])
            if any(c is None for c in bucket_cfgs + exact_cfgs):
                loss[M] = {"missing": True}
                continue
            # Both sets on the same kernels and buffers, so only the configs differ.
            bucketed = per_m.kernels_ms(x[:M], bucket_cfgs, rep_ms)
            exact = per_m.kernels_ms(x[:M], exact_cfgs, rep_ms)
            loss[M] = {"bucketed_ms": bucketed, "per_m_ms": exact, "ratio": bucketed / exact,
                       "bucketed_configs": [config_text(c) for c in bucket_cfgs],
                       "per_m_configs": [config_text(c) for c in exact_cfgs]}
        out["bucketing"] = loss
        out["bucketing_geomean_ratio"] = geomean([v["ratio"] for v in loss.values() if "ratio" in v])
    return out


def spread_extras(args: argparse.Namespace, ranks: Any, x: Any, shards: tuple) -> dict[str, Any]:
    """A collective-free variant (a data-parallel server): tune-ahead of every size in lockstep, then spread."""
    out: dict[str, Any] = {}
    for mode in ("lockstep", "spread"):
        arm = Arm(f"dp-{mode}", args, ranks, shards, collective=False, is_dist=False)
        ranks.barrier()
        t0 = time.perf_counter()
        arm.tuned.tune_ahead(sizes=args.sizes, inputs_for=lambda M: (x[:M],), spread=mode == "spread")
        ranks.sync()
        out[f"{mode}_s"] = ranks.max(time.perf_counter() - t0)
    out["spread_over_lockstep"] = out["spread_s"] / out["lockstep_s"]
    return out


if __name__ == "__main__":
    sys.exit(main())
