"""Benchmark of issue 13: function-level tuning of an all-gather + GEMM op, jointly with its Triton kernel.

    ./launch benchmarks/bench_ag_gemm.py                                  # one rank per GPU, H200 sizes
    NPROC=2 ./launch benchmarks/bench_ag_gemm.py --small --out /tmp/agb   # CPU smoke (gloo, interpreter)

The op (benchmarks/ag_gemm_ops.py): C_r = all_gather(A) @ B_r, bf16, A [M, K] split by rows, B [K, N] by columns,
the gather cut into `chunks` pieces on a `comm_stream` setup (same | side | side_hi), GEMM chunk j waiting on
gather j; the GEMM is a @triton.autotune kernel whose key (per-chunk M) changes with chunks. Arms, in one run:
  ours           triton_ctx_tune.autotune(function space) around the op: points and kernel configs tuned jointly
  ours_e2e       the same with objective="end_to_end": the GEMM's configs judged by whole executions too
  ours_per_kernel  contextual_autotune(is_dist=True) on the op, the function space swept by hand: each point's
                 kernel tuned inside that point, then each point timed as Triton-distributed does
  tdist          Triton-distributed style: every (point, GEMM config) run whole, 5 warm-up + 10 timed runs
                 between CUDA events, barrier between points, MAX over ranks; the fastest wins
  gemm_alone     the GEMM tuned alone on the full gathered shape (do_bench per config, MAX over ranks), then
                 the function space swept with that config
  exhaustive     the oracle: every (point, GEMM config) timed carefully (per-call CUDA events with L2 flushed,
                 --exh-iters calls, --exh-rounds interleaved rounds, median of rounds of the MAX over ranks)
  budget10       ours with budget= (docs/function-spaces.md#budgets) at 10% of the exhaustive arm's cold time,
                 in seconds, for the whole call (each point's GEMM key gets a twelfth, and the call stops when
                 rank 0 finds it spent); needs exhaustive in --arms, which then runs first.
Each arm tunes twice: cold (a fresh TRITON_CACHE_DIR and fresh JITFunctions) and warm (same process, kernels
compiled, tuning caches cleared). Then every arm's chosen setup and the exhaustive best are re-measured the same
way (--rounds interleaved rounds of --op-iters calls, MAX over ranks per round, median of rounds), each checked
against a float32 torch reference. Rank 0 prints a markdown table and writes <out>/ag_gemm-<world>ranks-<gpu>.json.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARMS = ("ours", "ours_e2e", "ours_per_kernel", "tdist", "gemm_alone", "exhaustive", "budget10")
BUDGET_FRACTION = 0.10  # budget10: the exhaustive sweep's cold time, this fraction of it, for the call
UNAVAILABLE_OURS = "unavailable (triton_ctx_tune.autotune missing)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--small", action="store_true", help="tiny shapes and few repetitions, for CPU smoke runs")
    p.add_argument("--M", type=int, help="rows of A, all ranks together (default 8192; --small 32)")
    p.add_argument("--K", type=int, help="inner dimension (default 8192; --small 32)")
    p.add_argument("--N", type=int, help="columns of B, split over ranks (default 4096; --small 64). On 2 H200s "
                                         "the per-rank GEMM takes ~2.5x the gather at the default; --N 2048 "
                                         "makes them about equal")
    p.add_argument("--chunks", help="comma list of the chunks values (default 1,2,4,8; --small 1,2,4)")
    p.add_argument("--comm", default="same,side,side_hi", help="comma list of comm_stream setups (default all)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma list of arms to run (default {','.join(ARMS)})")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp16", "fp32"),
                   help="auto: bf16 on GPU, fp32 under the interpreter (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="folder of the JSON result (default benchmarks/results/<commit>)")
    p.add_argument("--no-warm", action="store_true", help="tune each arm once (cold) only")
    p.add_argument("--ours-objective", default="auto", choices=("auto", "per_launch", "end_to_end"),
                   help="ours: how the GEMM's configs are judged inside each point (default auto, the library's "
                        "default: per launch, and end to end for a point's close candidates, issue 35)")
    p.add_argument("--n-repeat", type=int, help="ours: n_repeat (default 5; --small 2)")
    p.add_argument("--n-warmup", type=int, help="ours: n_warmup (default 3; --small 1)")
    p.add_argument("--tdist-warmup", type=int, default=5, help="tdist: warm-up runs per point (default 5)")
    p.add_argument("--tdist-iters", type=int, default=10, help="tdist: timed runs per point (default 10)")
    p.add_argument("--rep-ms", type=int, help="gemm_alone: do_bench rep (ms) per config (default 100; --small 1)")
    p.add_argument("--exh-rounds", type=int, help="exhaustive: interleaved rounds (default 3; --small 1)")
    p.add_argument("--exh-iters", type=int, help="exhaustive: timed calls per combination (default 20; --small 2)")
    p.add_argument("--exh-warmup", type=int, help="exhaustive: warm-up calls per combination (default 3; --small 1)")
    p.add_argument("--rounds", type=int, help="re-measure: interleaved rounds (default 10; --small 2)")
    p.add_argument("--op-iters", type=int, help="re-measure: timed calls per round (default 30; --small 2)")
    args = p.parse_args(argv)
    defaults = {"M": (8192, 32), "K": (8192, 32), "N": (4096, 64), "chunks": ("1,2,4,8", "1,2,4"),
                "n_repeat": (5, 2), "n_warmup": (3, 1), "rep_ms": (100, 1), "exh_rounds": (3, 1),
                "exh_iters": (20, 2), "exh_warmup": (3, 1), "rounds": (10, 2), "op_iters": (30, 2)}
    for name, (big, tiny) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.small else big)
    args.chunks = tuple(int(c) for c in str(args.chunks).split(","))
    args.comm = tuple(s.strip() for s in args.comm.split(","))
    args.arms = tuple(s.strip() for s in args.arms.split(","))
    unknown = [a for a in args.arms if a not in ARMS] + [s for s in args.comm if s not in ("same", "side", "side_hi")]
    if unknown:
        p.error(f"unknown arm or comm setup: {unknown}")
    if "budget10" in args.arms:
        if "exhaustive" not in args.arms:
            p.error("budget10 needs exhaustive in --arms: its budget is a fraction of the exhaustive sweep's time")
        # The exhaustive sweep runs first: its cold time sets the budget.
        args.arms = ("exhaustive",) + tuple(a for a in args.arms if a != "exhaustive")
    return args


def setup_env() -> str:
    """Environment that must be in place before Triton compiles anything; returns the process's first cache dir."""
    os.environ["TRITON_CTX_TUNE_CACHE"] = "0"  # a persistent tuning cache would short-circuit tuning
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"  # and so would Triton's own (cache_results)
    path = tempfile.mkdtemp(prefix=f"bench-ag-triton-cache-r{os.environ.get('LOCAL_RANK', '0')}-")
    os.environ["TRITON_CACHE_DIR"] = path
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    first_cache = setup_env()
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    import torch.distributed as dist

    import benchlib

    benchlib.init_process_group()
    try:
        return run(args, benchlib.Ranks(), first_cache)
    finally:
        dist.destroy_process_group()


# ---- the shared state of one run -----------------------------------------------------------------------

@dataclass
class Choice:
    """A chosen setup: a point of the function space and the GEMM config every chunk of it launches."""
    point: Any  # ag_gemm_ops.Point
    config: Any  # triton Config

    def to_json(self) -> dict[str, Any]:
        from ag_gemm_ops import config_text

        return {"point": self.point.kwargs(), "config": config_text(self.config)}


@dataclass
class ArmRun:
    wall_s: float
    choice: Choice | None
    runs: int  # whole-op executions while tuning
    details: dict[str, Any] = field(default_factory=dict)
    outputs: list[float] = field(default_factory=list)  # rel errors of outputs the tuning itself returned


class ArmUnavailable(Exception):
    pass


@dataclass
class Ctx:
    args: argparse.Namespace
    ranks: Any  # benchlib.Ranks
    comm: Any  # ag_gemm_ops.Comm
    a: Any
    b: Any
    ref: Any
    space: list
    configs: list
    log_dir: str
    budget_s: float | None = None  # budget10: seconds for the call (set once the exhaustive arm has run)

    def op(self, gemm: Any) -> Any:
        from ag_gemm_ops import AgGemm

        return AgGemm(gemm, self.comm, self.ranks.world)

    def fixed(self, op: Any, point: Any, config: Any) -> Callable[[], Any]:
        return lambda: op(self.a, self.b, point.chunks, point.comm_stream, config)


def tdist_ms(ranks: Any, fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Triton-distributed's timing of one point: warm-up runs, then `iters` runs between two CUDA events; the
    slowest rank's mean ms."""
    import time

    import torch

    ranks.barrier()
    for _ in range(warmup):
        fn()
    if not ranks.cuda:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return ranks.max((time.perf_counter() - t0) * 1e3 / iters)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return ranks.max(start.elapsed_time(end) / iters)


def guarded(ranks: Any, label: str, fn: Callable[[], float]) -> float:
    """fn(), or inf where the config cannot run here (compile failures such as shared memory are the same on
    every rank, so every rank skips it together)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a combination that cannot run is not a candidate
        ranks.log(f"  {label} failed: {type(e).__name__}: {str(e)[:200]}", all_ranks=True)
        return math.inf


def argmin(xs: list[float]) -> int:
    return min(range(len(xs)), key=lambda i: xs[i])


# ---- the arms ------------------------------------------------------------------------------------------

def arm_ours(ctx: Ctx, gemm: Any, objective: str | None = None, budgeted: bool = False) -> ArmRun:
    import triton_ctx_tune
    from ag_gemm_ops import Point
    from benchlib import rel_fro, timed

    autotune = getattr(triton_ctx_tune, "autotune", None)
    if autotune is None:
        raise ArmUnavailable(UNAVAILABLE_OURS)
    op = ctx.op(gemm)

    def ag_gemm(a_shard, b_shard, chunks: int = 1, comm_stream: str = "same"):
        return op(a_shard, b_shard, chunks, comm_stream)

    def key_fn(a_shard, b_shard, *args: Any, **kwargs: Any) -> tuple:
        return tuple(a_shard.shape), tuple(b_shard.shape), str(a_shard.dtype)

    a = ctx.args
    extra: dict[str, Any] = {}
    if budgeted:
        if ctx.budget_s is None:
            raise ArmUnavailable("unavailable (budget10 needs the exhaustive arm's time)")
        extra["budget"] = ctx.budget_s
    tuned = autotune([p.kwargs() for p in ctx.space], key_fn=key_fn, prune_fn=None, is_dist=True,
                     n_repeat=a.n_repeat, n_warmup=a.n_warmup, quiet=True, log_dir=ctx.log_dir,
                     objective=objective or a.ours_objective, **extra)(ag_gemm)
    gemm.cache.clear()
    c, wall, per_rank = timed(ctx.ranks, lambda: tuned(ctx.a, ctx.b))
    stats = tuned.last_call
    point = getattr(stats, "point", None)
    choice = None
    if point is not None:
        p = Point(int(point["chunks"]), str(point["comm_stream"]))
        cfg = op.tuned_config(ctx.a, ctx.b, p.chunks)
        choice = Choice(p, cfg) if cfg is not None else None
    details = {"wall_s_per_rank": per_rank, "last_call_wall_s": getattr(stats, "wall_s", None),
               "point": point, "gemm_cache": {str(k): str(v) for k, v in gemm.cache.items()},
               "budget_s": extra.get("budget")}
    if choice is None:
        details["note"] = "no chosen setup: last_call.point missing or its GEMM key not in the Autotuner cache"
    return ArmRun(wall, choice, int(getattr(stats, "executions", 0)), details, [rel_fro(c, ctx.ref)])


def arm_ours_per_kernel(ctx: Ctx, gemm: Any) -> ArmRun:
    from benchlib import rel_fro, timed
    from triton_ctx_tune import contextual_autotune

    op = ctx.op(gemm)
    a = ctx.args

    def ag_gemm_point(a_shard, b_shard, chunks: int, comm_stream: str):
        return op(a_shard, b_shard, chunks, comm_stream)

    tuned = contextual_autotune(is_dist=True, n_repeat=a.n_repeat, n_warmup=a.n_warmup, quiet=True,
                                log_dir=ctx.log_dir)(ag_gemm_point)
    outputs: list[Any] = []
    rows: list[dict[str, Any]] = []

    def sweep() -> None:
        for p in ctx.space:
            gemm.cache.clear()  # tuned inside this point, not inherited from a point sharing its key
            outputs.append(tuned(ctx.a, ctx.b, **p.kwargs()))
            cfg = op.tuned_config(ctx.a, ctx.b, p.chunks)
            ms = guarded(ctx.ranks, p.text(), lambda p=p, cfg=cfg: tdist_ms(ctx.ranks, ctx.fixed(op, p, cfg),
                                                                            a.tdist_warmup, a.tdist_iters))
            rows.append({"point": p, "config": cfg, "executions": tuned.last_call.executions, "ms": ms})

    _, wall, per_rank = timed(ctx.ranks, sweep)
    best = argmin([r["ms"] for r in rows])
    runs = sum(r["executions"] + a.tdist_warmup + a.tdist_iters for r in rows)
    from ag_gemm_ops import config_text

    details = {"wall_s_per_rank": per_rank, "points": [{"point": r["point"].kwargs(), "ms": r["ms"],
                                                        "config": config_text(r["config"]),
                                                        "executions": r["executions"]} for r in rows]}
    return ArmRun(wall, Choice(rows[best]["point"], rows[best]["config"]), runs, details,
                  [rel_fro(outputs[best], ctx.ref)])


def arm_tdist(ctx: Ctx, gemm: Any) -> ArmRun:
    from ag_gemm_ops import config_text
    from benchlib import timed

    op = ctx.op(gemm)
    a = ctx.args
    combos = [(p, c) for p in ctx.space for c in ctx.configs]
    times: list[float] = []

    def sweep() -> None:
        for p, c in combos:
            times.append(guarded(ctx.ranks, f"{p.text()} {{{config_text(c)}}}",
                                 lambda p=p, c=c: tdist_ms(ctx.ranks, ctx.fixed(op, p, c), a.tdist_warmup,
                                                           a.tdist_iters)))

    _, wall, per_rank = timed(ctx.ranks, sweep)
    best = argmin(times)
    details = {"wall_s_per_rank": per_rank, "ms": [{"point": p.kwargs(), "config": config_text(c), "ms": t}
                                                   for (p, c), t in zip(combos, times)]}
    return ArmRun(wall, Choice(*combos[best]), len(combos) * (a.tdist_warmup + a.tdist_iters), details)


def arm_gemm_alone(ctx: Ctx, gemm: Any) -> ArmRun:
    import torch
    import torch.distributed as dist

    from ag_gemm_ops import config_text
    from benchlib import kernel_ms, timed

    op = ctx.op(gemm)
    a = ctx.args
    found: dict[str, Any] = {}

    def tune() -> None:
        m, K = ctx.a.shape
        M = m * ctx.ranks.world
        full = torch.empty(M, K, dtype=ctx.a.dtype, device=ctx.a.device)
        dist.all_gather_into_tensor(full, ctx.a)
        c = torch.empty(M, ctx.b.shape[1], dtype=ctx.a.dtype, device=ctx.a.device)
        mine = [guarded(ctx.ranks, config_text(cfg),
                        lambda cfg=cfg: kernel_ms(lambda: op.matmul(full, ctx.b, c, M, M, cfg), a.rep_ms))
                for cfg in ctx.configs]
        per_rank = ctx.ranks.gather(mine)
        reduced = [max(col) for col in zip(*per_rank)]
        cfg = ctx.configs[argmin(reduced)]
        pts = [guarded(ctx.ranks, p.text(), lambda p=p: tdist_ms(ctx.ranks, ctx.fixed(op, p, cfg), a.tdist_warmup,
                                                                   a.tdist_iters)) for p in ctx.space]
        found.update(config=cfg, gemm_ms=reduced, point_ms=pts)

    _, wall, per_rank = timed(ctx.ranks, tune)
    best = argmin(found["point_ms"])
    details = {"wall_s_per_rank": per_rank, "gemm_ms_max_over_ranks": dict(zip(map(config_text, ctx.configs),
                                                                               found["gemm_ms"])),
               "point_ms": [{"point": p.kwargs(), "ms": t} for p, t in zip(ctx.space, found["point_ms"])]}
    return ArmRun(wall, Choice(ctx.space[best], found["config"]), 1 + len(ctx.space) * (a.tdist_warmup + a.tdist_iters),
                  details)


def arm_exhaustive(ctx: Ctx, gemm: Any) -> ArmRun:
    from ag_gemm_ops import config_text
    from benchlib import median, op_ms, timed

    op = ctx.op(gemm)
    a = ctx.args
    combos = [(p, c) for p in ctx.space for c in ctx.configs]
    per_round: list[list[float]] = [[] for _ in combos]

    def sweep() -> None:
        # Rounds outside, combinations inside: a slow stretch of the machine lands on every combination once.
        for _ in range(a.exh_rounds):
            for i, (p, c) in enumerate(combos):
                per_round[i].append(guarded(ctx.ranks, f"{p.text()} {{{config_text(c)}}}",
                                            lambda p=p, c=c: ctx.ranks.max(op_ms(ctx.ranks, ctx.fixed(op, p, c),
                                                                                 a.exh_iters, a.exh_warmup))))

    _, wall, per_rank = timed(ctx.ranks, sweep)
    ms = [median(r) if all(math.isfinite(x) for x in r) else math.inf for r in per_round]
    best = argmin(ms)
    details = {"wall_s_per_rank": per_rank, "combos_total": len(combos),
               "combos_timed": sum(math.isfinite(x) for x in ms), "best_ms": ms[best],
               "ms": [{"point": p.kwargs(), "config": config_text(c), "ms": t, "ms_per_round": r}
                      for (p, c), t, r in zip(combos, ms, per_round)]}
    return ArmRun(wall, Choice(*combos[best]), len(combos) * a.exh_rounds * (a.exh_iters + a.exh_warmup), details)


ARM_FUNCS: dict[str, Callable[[Ctx, Any], ArmRun]] = {
    # ours_e2e: the GEMM's configs judged by whole executions too (objective="end_to_end"), as the README
    # advises for kernels that overlap communication: its chunks run while the next all-gather does.
    "ours": arm_ours, "ours_e2e": functools.partial(arm_ours, objective="end_to_end"),
                                                      "ours_per_kernel": arm_ours_per_kernel, "tdist": arm_tdist,
                                                      "gemm_alone": arm_gemm_alone,
    "exhaustive": arm_exhaustive, "budget10": functools.partial(arm_ours, budgeted=True)}


# ---- the run -------------------------------------------------------------------------------------------

def run(args: argparse.Namespace, ranks: Any, first_cache: str) -> int:
    import torch

    import ag_gemm_ops as ops
    import tables
    from benchlib import provenance, write_json

    size = ops.space_size()
    ops.check_sizes(args.M, args.K, args.N, ranks.world, args.chunks)
    dtype = ({"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(args.dtype)
             or (torch.bfloat16 if ranks.cuda else torch.float32))
    meta = provenance(ranks)
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / str(meta["git_commit"])[:7]
    tag = f"{ranks.world}ranks-{meta['gpu_short']}" + ("-small" if args.small else "")
    caches = tables.CacheDirs()
    caches.made.append(first_cache)
    a, b, ref = ops.make_inputs(args.M, args.K, args.N, args.seed, dtype, ranks.device, ranks.rank, ranks.world)
    ctx = Ctx(args, ranks, ops.Comm(ranks.cuda), a, b, ref, ops.function_space(args.chunks, args.comm),
              ops.gemm_configs(size), str(out / "ctx_logs" / tag))
    ranks.log(f"bench_ag_gemm: world={ranks.world} gpu={meta['gpu']} backend={meta['backend']} "
              f"dtype={str(dtype).removeprefix('torch.')} M={args.M} K={args.K} N={args.N} (N/rank="
              f"{args.N // ranks.world}) points={len(ctx.space)} gemm configs={len(ctx.configs)} arms={args.arms}")
    tables.prime(ranks)
    results: dict[str, dict[str, Any]] = {}
    try:
        space_check = check_space(ctx)
        for arm in args.arms:
            results[arm] = tune_arm(ctx, arm, caches)
            if arm == "exhaustive" and results[arm].get("cold"):
                ctx.budget_s = BUDGET_FRACTION * results[arm]["cold"]["wall_s"]
        remeasure(ctx, results)
    finally:
        caches.cleanup()
    summary = summarize(ctx, results, ops.tolerance(dtype))
    if ranks.rank == 0:
        data = {"bench": "ag_gemm", "summary": summary, "space_check": space_check, "arms": results,
                "meta": {**meta, "M": args.M, "K": args.K, "N": args.N, "N_per_rank": args.N // ranks.world,
                         "dtype": str(dtype).removeprefix("torch."), "config_space": size,
                         "points": [p.kwargs() for p in ctx.space],
                         "gemm_configs": [ops.config_text(c) for c in ctx.configs],
                         "args": vars(args), "notes": NOTES}}
        path = out / f"ag_gemm-{tag}.json"
        write_json(path, data)
        print_table(summary, meta, results)
        print(f"- every (point, GEMM config) checked: {space_check['combos']} combinations, max rel err "
              f"{space_check['max_rel_err']:.3g}, all correct: {space_check['all_correct']}", flush=True)
        print(f"wrote {path}", flush=True)
    return 1 if any(r.get("status") == "failed" for r in results.values()) else 0


NOTES = [
    "tuning wall times are the slowest rank's, from a barrier to the synchronized end of the arm's tuning; cold: "
    "fresh TRITON_CACHE_DIR and fresh JITFunctions, warm: same process, kernels compiled, tuning caches cleared",
    "e2e latency: every chosen setup and the exhaustive best re-measured in the same interleaved rounds, each "
    "round the MAX over ranks of a per-call median (CUDA events, L2 flushed before each call); ratio = median "
    "over rounds of setup / exhaustive best",
    "tdist cannot double as the exhaustive sweep: it times one 10-run window per combination after 5 warm-ups, "
    "back-to-back runs without L2 flushing and a single round, so its per-combination noise is larger than the "
    "2% the target resolves; the exhaustive arm uses per-call events, more calls and several rounds",
    "ours_per_kernel: each point's GEMM key is tuned inside that point (Autotuner cache cleared per point), then "
    "the point is timed the tdist way with that config; runs count tuning executions plus timing runs",
]


def check_space(ctx: Ctx) -> dict[str, Any]:
    """Every (point, GEMM config) run once with forced configs and checked against the reference: the arms only
    check the setups they choose, and chunked points store through the segmented row map."""
    from ag_gemm_ops import config_text, fresh_gemm, tolerance
    from benchlib import rel_fro

    op = ctx.op(fresh_gemm())
    errs = {}
    for p in ctx.space:
        for c in ctx.configs:
            errs[f"{p.text()} {{{config_text(c)}}}"] = rel_fro(ctx.fixed(op, p, c)(), ctx.ref)
    worst = [max(col) for col in zip(*ctx.ranks.gather(list(errs.values())))]
    tol = tolerance(ctx.a.dtype)
    ctx.ranks.log(f"space check: {len(worst)} combinations, max rel err {max(worst):.2e} (tolerance {tol:g})")
    return {"combos": len(worst), "max_rel_err": max(worst), "all_correct": max(worst) < tol,
            "rel_err": dict(zip(errs, worst))}


def tune_arm(ctx: Ctx, arm: str, caches: Any) -> dict[str, Any]:
    """Cold then warm tuning of one arm; a dict for the JSON (the Choice objects kept under '_choice')."""
    from ag_gemm_ops import fresh_gemm

    ranks = ctx.ranks
    gemm = fresh_gemm()
    rec: dict[str, Any] = {"status": "ok"}
    for phase in ("cold",) if ctx.args.no_warm else ("cold", "warm"):
        if phase == "cold":
            caches.fresh(f"ag-{arm}-cold")
        ranks.log(f"arm {arm}: {phase} tuning ...")
        try:
            r = ARM_FUNCS[arm](ctx, gemm)
        except ArmUnavailable as e:
            ranks.log(f"arm {arm}: {e}")
            return {"status": str(e)}
        except Exception as e:  # noqa: BLE001 - keep the other arms' results
            ranks.log(f"arm {arm} FAILED: {type(e).__name__}: {e}", all_ranks=True)
            traceback.print_exc()
            return {"status": "failed", "error": f"{type(e).__name__}: {e}"}
        err = ranks.max(max(r.outputs)) if r.outputs else None
        rec[phase] = {"wall_s": r.wall_s, "runs": r.runs, "choice": r.choice.to_json() if r.choice else None,
                      "tuning_output_rel_err": err, "details": r.details}
        if phase == "cold":
            rec["_choice"] = r.choice
        ranks.log(f"arm {arm}: {phase} {r.wall_s:.2f} s, {r.runs} runs, chose "
                  f"{r.choice.to_json() if r.choice else None}")
    return rec


def remeasure(ctx: Ctx, results: dict[str, dict[str, Any]]) -> None:
    """Every chosen setup and the exhaustive best, timed the same way in interleaved rounds, and checked."""
    from ag_gemm_ops import fresh_gemm
    from benchlib import median, op_ms, rel_fro

    ranks, a = ctx.ranks, ctx.args
    setups = {arm: rec["_choice"] for arm, rec in results.items() if rec.get("_choice") is not None}
    if not setups:
        return
    op = ctx.op(fresh_gemm())
    names = list(setups)
    rounds: dict[str, list[float]] = {n: [] for n in names}
    ranks.log(f"re-measure: {a.rounds} interleaved rounds x {names} ({a.op_iters} calls each)")
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            ch = setups[name]
            rounds[name].append(ranks.max(op_ms(ranks, ctx.fixed(op, ch.point, ch.config), a.op_iters, 2)))
    for name, ch in setups.items():
        c = ctx.fixed(op, ch.point, ch.config)()
        rec = results[name]
        rec["e2e_ms"] = median(rounds[name])
        rec["e2e_ms_per_round"] = rounds[name]
        rec["rel_err"] = ranks.max(rel_fro(c, ctx.ref))
        if "exhaustive" in setups:
            rec["ratio_to_exhaustive"] = median([x / e for x, e in zip(rounds[name], rounds["exhaustive"])])


def summarize(ctx: Ctx, results: dict[str, dict[str, Any]], tol: float) -> dict[str, Any]:
    """Per-arm rows and the two targets of issue 13; drops the Choice objects from the records."""
    rows = {}
    for arm, rec in results.items():
        ch = rec.pop("_choice", None)
        errs = [e for e in (rec.get("rel_err"), rec.get("cold", {}).get("tuning_output_rel_err"),
                            rec.get("warm", {}).get("tuning_output_rel_err")) if e is not None]
        rows[arm] = {"status": rec["status"], "cold_s": rec.get("cold", {}).get("wall_s"),
                     "warm_s": rec.get("warm", {}).get("wall_s"), "runs": rec.get("cold", {}).get("runs"),
                     "choice": ch.to_json() if ch else None, "e2e_ms": rec.get("e2e_ms"),
                     "ratio_to_exhaustive": rec.get("ratio_to_exhaustive"),
                     "rel_err": max(errs) if errs else None, "correct": bool(errs) and max(errs) < tol}
    targets = []
    exh = rows.get("exhaustive")
    for name in ("ours", "ours_e2e", "budget10"):
        ours = rows.get(name)
        if not (ours and exh and ours["status"] == "ok" and exh["status"] == "ok"):
            continue
        # Issue 35: the default within 1.02 at under a third of the sweep's time; budget10 within 1.03 at the
        # tenth of the sweep's cold time its budget is (the cold phase: the warm one has no budget of its own).
        budgeted = name == "budget10"
        r = ours["ratio_to_exhaustive"]
        limit = 1.03 if budgeted else 1.02
        targets.append({"name": f"{name} e2e / exhaustive best", "value": r, "goal": f"<= {limit}",
                        "ok": r is not None and r <= limit})
        for phase in ("cold_s",) if budgeted else ("cold_s", "warm_s"):
            if ours[phase] is not None and exh[phase]:
                v = ours[phase] / exh[phase]
                goal = BUDGET_FRACTION if budgeted else 1 / 3
                targets.append({"name": f"{name} tuning time / exhaustive sweep ({phase[:-2]})", "value": v,
                                "goal": f"<= {goal:g}" if budgeted else "< 1/3", "ok": v <= goal if budgeted
                                else v < goal})
    return {"rows": rows, "targets": targets, "tolerance": tol}


def _f(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def print_table(summary: dict[str, Any], meta: dict[str, Any], results: dict[str, Any]) -> None:
    print(f"\n## ag_gemm: world={meta['world']} gpu={meta['gpu']} torch={meta['torch']} triton={meta['triton']} "
          f"triton_ctx_tune={meta['triton_ctx_tune']} commit={str(meta['git_commit'])[:10]}")
    if meta["interpreter"]:
        print("(TRITON_INTERPRET=1: host-clock timings of the interpreter; targets are not meaningful here)")
    print("\n| arm | tuning cold s | tuning warm s | runs | chosen point | GEMM config | e2e ms | / exhaustive best "
          "| rel err | correct |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arm, row in summary["rows"].items():
        if row["status"] != "ok":
            print(f"| {arm} | {row['status']} | | | | | | | | |")
            continue
        ch = row["choice"] or {}
        point = ", ".join(f"{k}={v}" for k, v in ch.get("point", {}).items()) or "-"
        print(f"| {arm} | {_f(row['cold_s'])} | {_f(row['warm_s'])} | {_f(row['runs'])} | {point} | "
              f"{ch.get('config', '-')} | {_f(row['e2e_ms'])} | {_f(row['ratio_to_exhaustive'])} | "
              f"{_f(row['rel_err'], 3)} | {row['correct']} |")
    for t in summary["targets"]:
        print(f"- {'PASS' if t['ok'] else 'MISS'} {t['name']}: {_f(t['value'])} (target {t['goal']})")
    exh = results.get("exhaustive", {}).get("cold", {}).get("details", {})
    if exh:
        print(f"- exhaustive: {exh.get('combos_timed')}/{exh.get('combos_total')} combinations timed")
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
