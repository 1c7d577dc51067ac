"""Benchmark contextual_autotune on the tensor-parallel MLP of examples/tp_mlp.py.

    ./launch benchmarks/bench_mlp.py --table all --out benchmarks/results            # one process per GPU
    NPROC=2 ./launch benchmarks/bench_mlp.py --small --table all --out /tmp/bench    # CPU smoke (interpreter)

The op (bf16, M=4096 tokens, H=4096 hidden, I=14336 intermediate split over ranks): GEMM (autotuned, the
example's large config space) -> in-place GELU (autotuned) -> GEMM (same kernel, second key) -> all_reduce;
`--variant single` is GEMM -> GELU -> all_reduce. Tables (--table):
  tuning       first-call tuning time, cold (fresh TRITON_CACHE_DIR) and warm (compiled, caches cleared), for
               contextual_autotune and for plain triton.autotune; executions; vanilla's first-call correctness
  consistency  chosen configs on every rank, first-call and steady-state output vs a float32 torch reference
  scaling      warm tuning wall time and executions at this world size (merge_results.py compares sizes)
  dispatch     host time per launch of a tiny autotuned kernel on its cache hit: ours vs direct vs vanilla
  quality      regret of the chosen configs vs an exhaustive do_bench and vs every config timed inside the op;
               whole-op latency vs the exhaustive winners
  all          every table in one process (tuning first: it needs the empty Triton cache)
Rank 0 writes <out>/<table>[-single]-<world>ranks-<gpu>.json after each table and prints a summary at the end.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path

TABLES = ("tuning", "consistency", "scaling", "dispatch", "quality")  # the order of --table all


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--table", default="all", choices=TABLES + ("all",))
    p.add_argument("--out", default="benchmarks/results",
                   help="folder of the JSON results (default benchmarks/results)")
    p.add_argument("--variant", default="mlp", choices=("mlp", "single", "both"),
                   help="mlp: GEMM-GELU-GEMM-all_reduce (default); single: GEMM-GELU-all_reduce; "
                        "both: one, then the other")
    p.add_argument("--small", action="store_true", help="tiny shapes and few repetitions, for CPU smoke runs")
    p.add_argument("--M", type=int, help="tokens (default 4096; --small 32)")
    p.add_argument("--H", type=int, help="hidden size (default 4096; --small 64)")
    p.add_argument("--I", type=int, help="intermediate size, split over ranks (default 14336; --small 96)")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp16", "fp32"),
                   help="auto: bf16 on GPU, fp32 under the interpreter (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-repeat", type=int, default=5, help="contextual_autotune n_repeat (default 5)")
    p.add_argument("--n-warmup", type=int, default=3, help="contextual_autotune n_warmup (default 3)")
    p.add_argument("--no-vanilla", action="store_true", help="skip the plain triton.autotune baseline")
    p.add_argument("--flush-l2", default="step", choices=("true", "step", "false"),
                   help="contextual_autotune flush_l2 of ours: step (the library's default: once per re-execution), "
                        "true (before each timed launch), false")
    p.add_argument("--objective", default="auto", choices=("auto", "per_launch", "end_to_end"),
                   help="contextual_autotune objective of ours (default auto)")
    p.add_argument("--rep-ms", type=int, help="quality: do_bench rep (ms) per config (default 200)")
    p.add_argument("--rounds", type=int, help="quality: interleaved op-latency rounds (default 10; --small 2)")
    p.add_argument("--retime-rounds", type=int,
                   help="quality: interleaved rounds re-timing the exhaustive pass's close configs "
                        "(default 5; --small 2)")
    p.add_argument("--quality-calls", type=int, default=1,
                   help="quality: tuning calls scored (each with its caches cleared; the first one cold; default 1)")
    p.add_argument("--preheat-s", type=float, default=0.0,
                   help="seconds of back-to-back GEMM launches (fixed config, no collective) before each tuning "
                        "call of ours, so that it tunes on a GPU as hot as the do_bench oracle's; its scratch launches "
                        "compile the op's first configs, so a preheated call's wall time is not a cold one "
                        "(default 0)")
    p.add_argument("--op-iters", type=int, help="timed op calls per round (default 30; --small 2)")
    p.add_argument("--in-op-rounds", type=int,
                   help="quality: interleaved rounds of the in-op oracle, every config timed inside the op "
                        "(default 30; --small 2)")
    p.add_argument("--in-op-iters", type=int, help="quality: op calls per in-op sample (default 10; --small 2)")
    p.add_argument("--dispatch-rounds", type=int, help="dispatch: rounds (default 40; --small 3)")
    p.add_argument("--dispatch-launches", type=int, help="dispatch: launches per round (default 1000; --small 5)")
    p.add_argument("--dispatch-n", type=int, default=1024, help="dispatch: elements of the add kernel (default 1024)")
    p.add_argument("--scaling-repeats", type=int, help="scaling: timed tuning calls (default 3; --small 2)")
    args = p.parse_args(argv)
    small = args.small
    defaults = {"M": (4096, 32), "H": (4096, 64), "I": (14336, 96), "rep_ms": (200, 1), "rounds": (10, 2),
                "retime_rounds": (5, 2), "op_iters": (30, 2), "in_op_rounds": (30, 2), "in_op_iters": (10, 2),
                "dispatch_rounds": (40, 3),
                "dispatch_launches": (1000, 5), "scaling_repeats": (3, 2)}
    for name, (big, tiny) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if small else big)
    return args


def setup_env(args: argparse.Namespace) -> str | None:
    """Environment that must be in place before Triton compiles anything; returns the process's first cache dir."""
    os.environ["TRITON_CTX_TUNE_CACHE"] = "0"  # our persistent tuning cache would short-circuit tuning
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"  # and so would Triton's own (cache_results) for vanilla
    if args.table in ("tuning", "all"):
        local = os.environ.get("LOCAL_RANK", "0")
        path = tempfile.mkdtemp(prefix=f"bench-triton-cache-r{local}-process-")
        os.environ["TRITON_CACHE_DIR"] = path
        return path
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    first_cache = setup_env(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    import torch.distributed as dist

    import benchlib
    from benchlib import Ranks

    benchlib.init_process_group()
    try:
        ranks = Ranks()
        return run(args, ranks, first_cache)
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace, ranks, first_cache: str | None) -> int:
    import torch

    import mlp_ops
    import tables
    from benchlib import provenance, write_json

    if args.I % ranks.world:
        raise SystemExit(f"--I {args.I} does not split over {ranks.world} ranks; pick a multiple of {ranks.world}")
    if args.dtype == "auto":
        dtype = torch.bfloat16 if ranks.cuda else torch.float32
    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    meta = provenance(ranks)
    out = Path(args.out)
    tag = f"{ranks.world}ranks-{meta['gpu_short']}"
    log_dir = str(out / "ctx_logs" / tag)
    caches = tables.CacheDirs()
    if first_cache:
        caches.made.append(first_cache)
    variants = ["mlp", "single"] if args.variant == "both" else [args.variant]
    wanted = list(TABLES) if args.table == "all" else [args.table]
    ranks.log(f"bench_mlp: tables={wanted} variants={variants} world={ranks.world} gpu={meta['gpu']} "
              f"backend={meta['backend']} dtype={str(dtype).removeprefix('torch.')} M={args.M} H={args.H} I={args.I} "
              f"(I/rank={args.I // ranks.world}) configs={mlp_ops.example_size()} "
              f"triton={meta['triton']} torch={meta['torch']} TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR')}")
    if meta["interpreter"]:
        ranks.log("note: " + tables.INTERPRETER_NOTE)
    tables.prime(ranks)

    results: list[tuple[str, tables.TableResult | None, str | None]] = []
    failed = False
    try:
        for vi, variant in enumerate(variants):
            bench = tables.Bench(args, ranks, variant, dtype, log_dir)
            ranks.log(f"[{variant}] inputs ready: matmul {len(bench.ours_ks.matmul.configs)} configs, "
                      f"gelu {len(bench.ours_ks.gelu.configs)} configs")
            for table in wanted:
                if table == "dispatch" and vi > 0:
                    continue  # does not depend on the op variant
                ranks.log(f"=== table {table}" + ("" if table == "dispatch" else f" ({variant})"))
                try:
                    if table == "tuning":
                        res = tables.table_tuning(bench, caches)
                    elif table == "consistency":
                        res = tables.table_consistency(bench)
                    elif table == "scaling":
                        res = tables.table_scaling(bench)
                    elif table == "dispatch":
                        res = tables.table_dispatch(args, ranks, log_dir)
                    else:
                        res = tables.table_quality(bench)
                except Exception as e:  # noqa: BLE001 - keep the other tables' results
                    failed = True
                    ranks.log(f"table {table} FAILED: {type(e).__name__}: {e}", all_ranks=True)
                    traceback.print_exc()
                    results.append((table, None, f"{type(e).__name__}: {e}"))
                    continue
                name = table if res.variant in (None, "mlp") else f"{table}-{res.variant}"
                if ranks.rank == 0:
                    path = out / f"{name}-{tag}.json"
                    write_json(path, {**res.to_json(), "meta": {**meta, **shape_meta(args, dtype, ranks, mlp_ops)}})
                    ranks.log(f"wrote {path}")
                results.append((table, res, None))
            del bench
            if ranks.cuda:
                torch.cuda.empty_cache()
    finally:
        caches.cleanup()
    if ranks.rank == 0:
        print_summary(results, meta)
    return 1 if failed else 0


def shape_meta(args: argparse.Namespace, dtype, ranks, mlp_ops) -> dict:
    return {"M": args.M, "H": args.H, "I": args.I, "I_per_rank": args.I // ranks.world,
            "dtype": str(dtype).removeprefix("torch."), "config_space": mlp_ops.example_size(),
            "n_repeat": args.n_repeat, "n_warmup": args.n_warmup, "small": args.small,
            "args": {k: v for k, v in vars(args).items()},
            "env": {k: os.environ.get(k) for k in ("TRITON_CTX_TUNE_CACHE", "TRITON_CACHE_AUTOTUNING",
                                                   "TRITON_INTERPRET", "TRITON_CTX_TUNE_BACKEND", "NCCL_NVLS_ENABLE",
                                                   "OMP_NUM_THREADS")}}


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def print_summary(results, meta) -> None:
    print("\n" + "=" * 100)
    print(f"bench_mlp summary: world={meta['world']} gpu={meta['gpu']} driver={meta['driver']} torch={meta['torch']} "
          f"triton={meta['triton']} triton_ctx_tune={meta['triton_ctx_tune']} commit={str(meta['git_commit'])[:10]}")
    if meta["interpreter"]:
        print("(TRITON_INTERPRET=1: timings are interpreter host timings, "
              "PASS/MISS are not meaningful for time targets)")
    for table, res, err in results:
        if res is None:
            print(f"\n[{table}] FAILED: {err}")
            continue
        print(f"\n[{table}{'' if res.variant is None else ' / ' + res.variant}]")
        width = max(len(k) for k in res.summary) if res.summary else 0
        for k, v in res.summary.items():
            print(f"  {k:<{width}}  {_fmt(v)}")
        for t in res.targets:
            verdict = "info" if t.ok is None else ("PASS" if t.ok else "MISS")
            print(f"  {verdict:<4}  {t.name}: {_fmt(t.value)} (target {t.goal}){'  -- ' + t.note if t.note else ''}")
    print("\ntarget 'tuning time at 4 ranks <= 1.2x at 1 rank': run benchmarks/merge_results.py over the scaling files")
    print("=" * 100, flush=True)


if __name__ == "__main__":
    sys.exit(main())
