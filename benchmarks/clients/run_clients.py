"""Real-client suite: training steps of real Triton libraries, tuned by plain triton.autotune or by contextual_autotune.

Clients (--clients, comma-separated; default fla_simple_gla,fla_norms,cce):
  fla_simple_gla  flash-linear-attention (fla-core 0.6.0) chunk_simple_gla with g_gamma, T=4096, 16 heads per rank,
                  K=V=128, bf16, a row-parallel output projection, a differentiable all_reduce, backward
  fla_norms       FLA's fused layer_norm (with residual) and rms_norm, data parallel, backward, gradient all_reduce
  cce             Apple's Cut Cross-Entropy (cut-cross-entropy 25.1.1), LM-head loss, data parallel, backward
  toy             a harness smoke test that runs anywhere, 2 CPU ranks included (not part of the results)
Arms (--arm): plain = call the step (every rank's Triton Autotuners tune alone); ours = the same step decorated
with contextual_autotune(is_dist=True, cache=False). Run one arm per process, so that each starts from a cold
Triton cache (a fresh TRITON_CACHE_DIR per job unless you set one) and empty Autotuner caches:

    ./launch benchmarks/clients/run_clients.py --arm plain --out $OUT/clients-plain.json
    ./launch benchmarks/clients/run_clients.py --arm ours  --out $OUT/clients-ours.json
    python benchmarks/clients/run_clients.py --merge $OUT/clients-{plain,ours}.json --out $OUT/clients.json

benchmarks/clients/run_all.sh does all three. Per client and arm it reports the first (tuning) call's wall time and
executions, keys tuned by the call vs keys seen in the libraries' Autotuner caches, rank agreement per key, the
gradients' relative errors vs a float32 PyTorch reference, the warm second call, and the steady-state step time.
`--self-check` checks the float32 references on CPU and exits.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import os
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLIENT_MODULES = {"fla_simple_gla": "client_fla_simple_gla", "fla_norms": "client_fla_norms", "cce": "client_cce",
                  "toy": "client_toy"}
DEFAULT_CLIENTS = ("fla_simple_gla", "fla_norms", "cce")

# Set before torch, triton or a client library is imported: together they make both arms tune from scratch.
FORCED_ENV = {
    "TRITON_CTX_TUNE_CACHE": "0",  # our persistent tuning cache would answer the ours arm from disk
    "TRITON_CACHE_AUTOTUNING": "0",  # Triton's on-disk tuning results (cache_results) would answer plain
    "FLA_CACHE_RESULTS": "0",  # FLA passes cache_results=True to its triton.autotune calls unless this is 0
    "FLA_CACHE_MODE": "disabled",  # FLA's shipped tuned-config files (fla/configs/<gpu>/) would skip tuning
    "FLA_DISABLE_BACKEND_DISPATCH": "1",  # FLA's Triton kernels only: no TileLang, Gluon or intra-card backends
    "CCE_AUTOTUNE": "1",  # CCE autotunes only when asked; otherwise it launches fixed configs
}
REPORTED_ENV = (*FORCED_ENV, "TRITON_CACHE_DIR", "TRITON_INTERPRET", "TRITON_CTX_TUNE_BACKEND", "NCCL_NVLS_ENABLE",
                "TRITON_CTX_TUNE_PRECOMPILE", "TRITON_CTX_TUNE_EARLY_STOP", "OMP_NUM_THREADS")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--arm", choices=("plain", "ours"), help="which autotuning runs the steps (one arm per process)")
    mode.add_argument("--self-check", action="store_true", help="check the float32 references on CPU, then exit")
    mode.add_argument("--merge", nargs="+", metavar="JSON", help="print one report over runs' JSON files and exit")
    p.add_argument("--clients", default=",".join(DEFAULT_CLIENTS),
                   help=f"comma-separated, from {', '.join(CLIENT_MODULES)} (default {','.join(DEFAULT_CLIENTS)})")
    p.add_argument("--out", help="JSON file (default benchmarks/results/clients/clients-<arm>-<world>ranks.json; "
                                 "with --merge: where the merged JSON goes, none if absent)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--early-workers", action="store_true",
                   help="ours: start the compile worker processes when the job starts (start_compile_workers()), "
                        "before the libraries are imported, as a training script would during its set-up")
    p.add_argument("--decorated-at-start", action="store_true",
                   help="ours: start the compile workers' zygote when the job starts, as decorating the step at "
                        "import would (the harness decorates it just before its first call)")
    p.add_argument("--profile", metavar="DIR",
                   help="sample every thread's stack during each client's first call on rank 0: DIR/<client>.txt, "
                   "also printed")
    p.add_argument("--small", action="store_true", help="tiny shapes (a quick functional run, not the benchmark)")
    p.add_argument("--step-iters", type=int, default=10, help="timed steady-state steps per client (default 10)")
    p.add_argument("--keep-triton-cache", action="store_true",
                   help="keep the Triton cache directory this script created (default: removed at exit)")
    args = p.parse_args(argv)
    args.clients = list(DEFAULT_CLIENTS) if args.clients == "all" else [c for c in args.clients.split(",") if c]
    unknown = [c for c in args.clients if c not in CLIENT_MODULES]
    if unknown or not args.clients:
        p.error(f"--clients: unknown {unknown}; choose from {', '.join(CLIENT_MODULES)}")
    return args


def setup_paths() -> None:
    # This folder (clients and helpers), benchmarks/ (benchlib) and the repository root (triton_ctx_tune).
    for i, path in enumerate((HERE, HERE.parent, ROOT)):
        if str(path) not in sys.path:
            sys.path.insert(i, str(path))


def setup_env(arm: str) -> dict[str, Any]:
    """FORCED_ENV, and the Triton cache directory: TRITON_CACHE_DIR if set, else a fresh one for this job."""
    os.environ.update(FORCED_ENV)
    given = os.environ.get("TRITON_CACHE_DIR")
    if given:
        path, created = given, False
    else:
        # One directory for the job's ranks, as ~/.triton/cache is on a node (our precompilation splits configs
        # among local ranks through it), new per job: torchrun's run id and pid are the ranks' shared parent's.
        run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        path = os.path.join(tempfile.gettempdir(), f"clients-triton-cache-{run}-{os.getppid()}-{arm}")
        os.environ["TRITON_CACHE_DIR"] = path
        created = True
    os.makedirs(path, exist_ok=True)
    return {"dir": path, "created_by_script": created, "entries_at_start": len(os.listdir(path))}


def single_process_defaults() -> None:
    """Let `python run_clients.py ...` run as one rank without torchrun."""
    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def load_specs(names: list[str]) -> list[Any]:
    return [importlib.import_module(CLIENT_MODULES[n]).SPEC for n in names]


def check_device(specs: list[Any]) -> bool:
    """True when CUDA GPUs run the kernels; exits with the reason if a client needs them and none is usable."""
    import torch

    from benchlib import interpreting

    gpu = torch.cuda.is_available() and not interpreting()
    need = [s.name for s in specs if s.needs_cuda]
    if need and not gpu:
        why = "TRITON_INTERPRET=1 is set" if interpreting() else "no CUDA device is visible"
        raise SystemExit(f"run_clients: {', '.join(need)} need CUDA GPUs ({why}): their libraries' Triton kernels "
                         "have no CPU path, and the Triton interpreter does not run them.\n  On CPU: "
                         "`python benchmarks/clients/run_clients.py --self-check` checks the float32 references; "
                         "`./launch benchmarks/clients/run_clients.py --arm ours --clients toy` runs the harness.")
    return gpu


def import_libraries(specs: list[Any]) -> None:
    """Import every client's library now, so a missing one stops every rank before any work."""
    for s in specs:
        try:
            importlib.import_module(s.import_name)
        except ImportError as e:
            raise SystemExit(
                f"run_clients: client {s.name} needs {s.requirement}, and `import {s.import_name}` failed: {e}\n"
                "  Install the optional extra: pip install -e '.[clients]'\n"
                "  Offline (the wheels in .whl/): python3 -m pip install --no-index --no-deps --target /tmp/site "
                ".whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH  (see benchmarks/clients/README.md)") from None


def library_versions(specs: list[Any]) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for s in specs:
        if "==" not in s.requirement:  # the toy: no library of its own
            continue
        dist_name = s.requirement.split("==")[0]
        try:
            out[dist_name] = version(dist_name)
        except (PackageNotFoundError, ValueError):
            out[dist_name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_paths()
    if args.merge:
        import summary

        return summary.merge(args.merge, args.out)
    if args.self_check:
        import selfcheck

        return selfcheck.main()

    return run_arm(args)


def run_arm(args: argparse.Namespace, runner: Any = None) -> int:
    """One arm's job: the environment and Triton cache directory, then run_job; the directory this script made is
    removed at the end. `runner(args, ranks, specs, cache)` runs the clients (default run; train_loop.py has its
    own)."""
    cache = setup_env(args.arm)
    try:
        return run_job(args, cache, runner or run)
    finally:  # also after a fail-fast exit: the directory this script made is removed once
        if cache["created_by_script"] and not args.keep_triton_cache and os.environ.get("LOCAL_RANK", "0") == "0":
            import shutil

            shutil.rmtree(cache["dir"], ignore_errors=True)


def run_job(args: argparse.Namespace, cache: dict[str, Any], runner: Any = None) -> int:
    """Check the device and the libraries, start the process group, run the clients in this arm."""
    single_process_defaults()
    import torch
    import torch.distributed as dist

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 references must be float32 (PyTorch's default)
    specs = load_specs(args.clients)
    cuda = check_device(specs)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)  # before the libraries' imports, which query the current device
    if getattr(args, "early_workers", False) and args.arm == "ours":
        from triton_ctx_tune import start_compile_workers

        # They boot, importing the libraries' kernels, while this process does the same and builds the model.
        start_compile_workers(preload=tuple(s.import_name for s in specs))
    if getattr(args, "decorated_at_start", False) and args.arm == "ours":
        from triton_ctx_tune.compile import compile_workers

        compile_workers.prestart()  # what @contextual_autotune at a module's import does
    import_libraries(specs)
    backend = os.environ.get("TRITON_CTX_TUNE_BACKEND") or ("nccl" if cuda else "gloo")
    if cuda:
        dist.init_process_group(backend, device_id=torch.device("cuda", local))
    else:
        dist.init_process_group(backend)
    try:
        from benchlib import Ranks

        ranks = Ranks()
        status = (runner or run)(args, ranks, specs, cache)
        ranks.barrier()  # no rank still compiles into the cache directory when it is removed
        return status
    finally:
        dist.destroy_process_group()


# ---- the run ----------------------------------------------------------------------------------------

def run(args: argparse.Namespace, ranks: Any, specs: list[Any], cache: dict[str, Any]) -> int:
    import summary
    from benchlib import jsonable

    default_out = ROOT / "benchmarks" / "results" / "clients" / f"clients-{args.arm}-{ranks.world}ranks.json"
    out = Path(args.out) if args.out else default_out
    meta = job_meta("run_clients", args, ranks, specs, cache, step_iters=args.step_iters,
                    early_workers=args.early_workers)
    records = run_specs(
        args, ranks, specs, out, meta, heading=lambda spec: spec.summary,
        one=lambda spec, ctx, all_modules: run_client(spec, ctx, args, all_modules,
                                                      out.parent / "ctx_logs" / spec.name),
        describe=lambda rec: (f"first call {rec['first_call']['wall_s']:.2f} s, {rec['first_call']['executions']} "
                              f"executions, worst error {rec['first_call']['errors']['worst']:.2e}"))
    if ranks.rank == 0:
        summary.print_report(jsonable(records), f"run_clients: arm={args.arm} world={ranks.world} gpu={meta['gpu']} "
                                                f"commit={str(meta['git_commit'])[:10]}")
        print(f"wrote {out}", flush=True)
    failed = any(r.get("error") or not r["first_call"]["errors"]["ok"] for r in records)
    return 1 if failed else 0


def run_specs(args: argparse.Namespace, ranks: Any, specs: list[Any], out: Path, meta: dict[str, Any],
              heading: Callable[[Any], str], one: Callable[[Any, Any, tuple[str, ...]], dict[str, Any]],
              describe: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """Every client in turn, on every rank: `one(spec, ctx, all_modules)` is its record, an exception in it that
    client's error (the others still run); `describe(record)` is its log line. Rank 0 writes `out` after every
    client, so a later failure keeps the earlier results. Used by run (here) and train_loop.py."""
    from benchlib import write_json
    from common import Context

    prime(ranks)
    ctx = Context(ranks, args.seed, args.small)
    all_modules = tuple(m for s in specs for m in s.modules)
    records: list[dict[str, Any]] = []
    for spec in specs:
        ranks.log(f"=== {spec.name} [{args.arm}]: {heading(spec)}")
        try:
            rec = one(spec, ctx, all_modules)
        except Exception as e:  # noqa: BLE001 - keep the other clients' results
            traceback.print_exc()
            rec = {"client": spec.name, "arm": args.arm, "error": f"{type(e).__name__}: {e}"}
        ranks.log(f"{spec.name} [{args.arm}]: " + (f"FAILED {rec['error']}" if rec.get("error") else describe(rec)),
                  all_ranks=bool(rec.get("error")))
        records.append(rec)
        release_memory(ranks)
        if ranks.rank == 0:
            write_json(out, {"arm": args.arm, "meta": meta, "results": records})
    return records


def job_meta(script: str, args: argparse.Namespace, ranks: Any, specs: list[Any], cache: dict[str, Any],
             **extra: Any) -> dict[str, Any]:
    """A job's provenance, arm, clients, libraries and Triton cache (logged on rank 0, with a warning if not cold)."""
    from benchlib import provenance

    meta = {**provenance(ranks), "arm": args.arm, "clients": [s.name for s in specs], "small": args.small,
            "seed": args.seed, **extra, "libraries": library_versions(specs),
            "triton_cache": {**cache, "entries_at_start_per_rank": ranks.gather(cache["entries_at_start"])},
            "env": {k: os.environ.get(k) for k in REPORTED_ENV}}
    ranks.log(f"{script}: arm={args.arm} clients={meta['clients']} world={ranks.world} gpu={meta['gpu']} "
              f"torch={meta['torch']} triton={meta['triton']} libraries={meta['libraries']} "
              f"TRITON_CACHE_DIR={cache['dir']} (entries at start per rank: "
              f"{meta['triton_cache']['entries_at_start_per_rank']})")
    if any(meta["triton_cache"]["entries_at_start_per_rank"]):
        ranks.log(f"WARNING: TRITON_CACHE_DIR={cache['dir']} was not empty at start: "
                  "this arm's compilation is not cold")
    return meta


def prime(ranks: Any) -> None:
    """Pay the once-per-process costs (CUDA context, NCCL communicator, cuBLAS) before anything is timed."""
    import torch
    import torch.distributed as dist

    x = torch.ones(1024, device=ranks.device)
    dist.all_reduce(x)
    (x[:64].reshape(8, 8) @ x[:64].reshape(8, 8)).sum().item()
    ranks.barrier()


def release_memory(ranks: Any) -> None:
    import torch

    gc.collect()
    if ranks.cuda:
        torch.cuda.empty_cache()


def run_client(spec: Any, ctx: Any, args: argparse.Namespace, all_modules: tuple[str, ...], log_dir: Path
               ) -> dict[str, Any]:
    """Build the client's step, run its first (tuning) call and a warm one in this arm, and record what happened."""
    from benchlib import op_ms, timed
    from common import agreement, clear_caches, configs_per_kernel, errors, key_id, library_autotuners, seen_keys
    from triton_ctx_tune import contextual_autotune

    ranks, ours = ctx.ranks, args.arm == "ours"
    work = spec.build(ctx)  # inputs and the float32 reference: before any timing
    # Cold Autotuner caches for this arm: every client library's, so keys left by an earlier client cannot hit.
    cleared = clear_caches(library_autotuners(all_modules))
    work.step.__qualname__ = work.step.__name__  # the name the tuner's logs and summary lines use
    step = work.step
    if ours:
        step = contextual_autotune(is_dist=True, cache=False, log_dir=str(log_dir))(work.step)

    profiler = _profiler(args, ranks)
    out, wall, per_rank = timed(ranks, step)
    if profiler is not None:
        _report_profile(profiler, Path(args.profile) / f"{spec.name}.txt")
    first_stats = step.last_call if ours else None
    first_errors = errors(ranks, work, out)
    autotuners = library_autotuners(spec.modules)
    seen = seen_keys(autotuners)
    agree = agreement(ranks, seen)
    tuned = [key_id(t.kernel, t.key) for t in first_stats.tuned] if first_stats else []

    out2, wall2, per_rank2 = timed(ranks, step)
    warm_executions = step.last_call.executions if ours else 1
    warm_errors = errors(ranks, work, out2)
    step_ms = op_ms(ranks, step, iters=args.step_iters, warmup=1)
    seen_later = sorted(set(seen_keys(autotuners)) - set(seen))

    used = [at for at in autotuners if at.cache]
    return {
        "client": spec.name, "arm": args.arm, "library": spec.requirement, "summary": spec.summary,
        "shapes": work.shapes, "autotuner_entries_cleared": cleared,
        "first_call": {"wall_s": wall, "wall_s_per_rank": per_rank,
                       "executions": first_stats.executions if first_stats else 1,
                       "tuner_wall_s": first_stats.wall_s if first_stats else None, "errors": first_errors},
        "keys": {"seen": sorted(seen), "tuned": tuned, "tuned_of_seen": len(set(tuned) & set(seen)),
                 "seen_not_tuned": sorted(set(seen) - set(tuned)), "tuned_not_seen": sorted(set(tuned) - set(seen)),
                 "new_after_first_call": seen_later},
        "tuned_detail": [dataclasses.asdict(t) for t in first_stats.tuned] if first_stats else [],
        "configs_per_kernel": configs_per_kernel(used),
        "agreement": agree,
        "warm_call": {"wall_s": wall2, "wall_s_per_rank": per_rank2, "executions": warm_executions,
                      "errors": warm_errors},
        "step_ms": step_ms,
        "ctx_log_dir": str(log_dir) if ours else None,
    }


def _profiler(args: argparse.Namespace, ranks: Any) -> Any:
    """A started stack sampler (every thread) on rank 0 when --profile is given; timed() runs the call next."""
    if not args.profile or ranks.rank != 0:
        return None
    from stack_sampler import StackSampler

    return StackSampler().start()


def _report_profile(sampler: Any, path: Path) -> None:
    text = sampler.stop()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
