"""Conformance zoo: real libraries' @triton.autotune kernels run as-is (plain) and under contextual_autotune (ours).

One arm per process, each from a cold Triton cache (and a cold FlagGems tuning database), at any world size:

    torchrun --nproc-per-node 2 benchmarks/zoo/run_zoo.py --arm ours --out DIR
    python benchmarks/zoo/run_zoo.py --arm plain --out DIR          # one process
    python benchmarks/zoo/merge.py DIR                              # the table, once both arms ran

Arms: plain calls each case's op; ours calls it decorated with contextual_autotune(is_dist=<world > 1>, cache=False).
Per case and rank it records whether it tuned (or the exception, by class and message), the config each key got
(read from the case's Autotuners' `.cache` after the call; a subclass whose cache cannot be listed, FlagGems'
LibTuner, by its `best_config`), whether the ranks agree on them, the output's error under the library's own
test tolerance (its output goes to DIR/outputs-<arm>-w<world>/, for merge.py to compare the arms), the first
call's time (synchronized, slowest rank: compile and tuning included) and the median of --steady-iters later calls.
A case whose library is not installed is skipped by name. DIR/zoo-<arm>-w<world>.json is rewritten after every case.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", choices=("plain", "ours"))
    p.add_argument("--out", help="folder for the arm's JSON and outputs (shared by every arm)")
    p.add_argument("--cases", default="default",
                   help="'default', 'all', or comma-separated case names or library prefixes (see --list)")
    p.add_argument("--steady-iters", type=int, default=20, help="timed later calls per case (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--keep-triton-cache", action="store_true",
                   help="keep the Triton cache directory this script created (default: removed at exit)")
    args = p.parse_args(argv)
    if not args.list and not (args.arm and args.out):
        p.error("--arm and --out are required (unless --list)")
    return args


def setup_paths() -> None:
    # This folder (cases, checks, kernels), benchmarks/clients (the clients and their helpers), benchmarks/
    # (benchlib) and the repository root (triton_ctx_tune).
    for i, path in enumerate((HERE, HERE.parent / "clients", HERE.parent, ROOT)):
        if str(path) not in sys.path:
            sys.path.insert(i, str(path))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_paths()
    if args.list:
        import cases

        for c in cases.CASES:
            print(f"{c.name:28s} {'' if c.default else '(opt-in) '}{c.requirement}: {c.summary}")
        return 0
    import run_clients

    # The clients' forced environment (no persistent tuning results in either arm, CCE_AUTOTUNE=1, FLA's Triton
    # kernels only) and a fresh TRITON_CACHE_DIR for this job unless one is given.
    cache = run_clients.setup_env(args.arm)
    # FlagGems' LibTuner keeps its results in an sqlite file under FLAGGEMS_CACHE_DIR: cold per job, and one per
    # rank, so that plain ranks tune alone (as Triton's in-memory Autotuner.cache does) and never wait on one
    # another's sqlite lock.
    os.environ.setdefault("FLAGGEMS_CACHE_DIR",
                          os.path.join(cache["dir"], f"flaggems-rank{os.environ.get('RANK', '0')}"))
    try:
        return run_job(args, cache)
    finally:
        if cache["created_by_script"] and not args.keep_triton_cache and os.environ.get("LOCAL_RANK", "0") == "0":
            import shutil

            shutil.rmtree(cache["dir"], ignore_errors=True)


def run_job(args: argparse.Namespace, cache: dict[str, Any]) -> int:
    import run_clients

    run_clients.single_process_defaults()
    import cases as zoo_cases
    import torch
    import torch.distributed as dist

    from benchlib import Ranks, init_process_group, interpreting, provenance, write_json
    from common import Context

    torch.backends.cuda.matmul.allow_tf32 = False  # the references are float64 / float32 (PyTorch's default)
    cuda = torch.cuda.is_available() and not interpreting()
    selected = zoo_cases.select(args.cases)
    init_process_group()
    try:
        ranks = Ranks()
        out_dir = Path(args.out)
        path = out_dir / f"zoo-{args.arm}-w{ranks.world}.json"
        meta = {**provenance(ranks), "arm": args.arm, "cases": [c.name for c in selected],
                "steady_iters": args.steady_iters, "triton_cache": cache,
                "env": {k: os.environ.get(k) for k in (*run_clients.FORCED_ENV, "TRITON_CACHE_DIR",
                                                       "FLAGGEMS_CACHE_DIR", "TRITON_INTERPRET")}}
        ranks.log(f"run_zoo: arm={args.arm} world={ranks.world} gpu={meta['gpu']} cases={len(selected)} "
                  f"TRITON_CACHE_DIR={cache['dir']}")
        run_clients.prime(ranks)
        ctx = Context(ranks, args.seed, small=False)
        records: list[dict[str, Any]] = []
        for case in selected:
            skip = skip_reason(case, cuda)
            if skip:
                ranks.log(f"{case.name}: {skip}")
                records.append({"case": case.name, "library": case.requirement, "arm": args.arm, "status": "skipped",
                                "reason": skip})
            else:
                ranks.log(f"=== {case.name} [{args.arm}]: {case.summary}")
                rec = run_case(case, ctx, args, out_dir)
                ranks.log(f"{case.name} [{args.arm}]: {describe(rec)}",
                          all_ranks=rec["status"] in ("error", "refused"))
                records.append(rec)
                run_clients.release_memory(ranks)
            if ranks.rank == 0:  # after every case: a job that is cut short keeps what it finished
                write_json(path, {"arm": args.arm, "world": ranks.world, "meta": meta, "results": records})
        ranks.log(f"wrote {path}")
        ranks.barrier()  # no rank still compiles into the cache directory when it is removed
        return 0
    finally:
        dist.destroy_process_group()


def skip_reason(case: Any, cuda: bool) -> str | None:
    if importlib.util.find_spec(case.library) is None:
        extra = "clients" if case.requirement.startswith(("fla-core", "cut-cross-entropy")) else "zoo"
        return f"skipped: {case.library} not installed (pip install -e '.[{extra}]')"
    if case.needs_cuda and not cuda:
        return "skipped: needs a CUDA GPU"
    return None


def describe(rec: dict[str, Any]) -> str:
    if rec["status"] in ("error", "refused"):
        return f"{rec['status'].upper()} at {rec['stage']}: {rec['error']}"
    return (f"{rec['status']}, {len(rec['keys'])} key(s), first call {rec['first_call_s']:.2f} s, steady "
            f"{rec['steady_ms']:.3f} ms, error ratio {rec['error_ratio']:.3g} ({'ok' if rec['ok'] else 'WRONG'}), "
            f"ranks agree on {rec['agreement']['agree']}/{rec['agreement']['total']}")


def _error_text(e: BaseException | None) -> str | None:
    return None if e is None else f"{type(e).__name__}: {e}"


def _is_refusal(e: BaseException) -> bool:
    """An exception raised by the tuner itself (a named refusal), rather than by the library or the kernel."""
    return type(e).__module__.startswith("triton_ctx_tune")


def chosen_configs(autotuners: list[Any]) -> dict[str, str]:
    """{key id: config} over the Autotuners' caches. FlagGems' LibTuner keeps its cache in an sqlite table with
    no listing; the config of its last launch (`best_config`, which LibTuner.run sets) stands in for its keys."""
    from common import key_id
    from triton_ctx_tune.runtime.compat import config_str, kernel_name

    found: dict[str, str] = {}
    for at in autotuners:
        cache = getattr(at, "cache", None)
        if isinstance(cache, dict):
            found.update({key_id(kernel_name(at), key): config_str(cfg) for key, cfg in list(cache.items())})
        elif getattr(at, "best_config", None) is not None:
            found[f"{kernel_name(at)} (last launch)"] = config_str(at.best_config)
    return found


def outside_space(autotuners: list[Any], picks: dict[str, str]) -> list[str]:
    """Keys whose config is none of their kernel's configs (a pruner that makes configs, or a wrong pick)."""
    from triton_ctx_tune.runtime.compat import config_str, kernel_name

    space: dict[str, set[str]] = {}
    for at in autotuners:
        space.setdefault(kernel_name(at), set()).update(config_str(c) for c in at.configs)
    return sorted(k for k, cfg in picks.items() if cfg not in space.get(k.split(" ", 1)[0], set()))


def libentry_launches(prefixes: tuple[str, ...]) -> dict[str, list[str]]:
    """FlagGems' LibEntry wrappers: per kernel, the config each of its cached launchers was compiled for.

    LibEntry keeps the kernel its first launch compiled, per argument signature, and never calls the autotuner
    for that signature again: whatever a tuner decides later, this config is what runs."""
    import gc

    found: dict[str, list[str]] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): the class is FlagGems' own, and isinstance may warn on some live objects.
        if type(obj).__name__ != "LibEntry" or not type(obj).__module__.startswith(prefixes):
            continue
        for per_device in obj.kernel_cache:
            for _kernel, constexprs, tuned, *_ in per_device.values():
                if tuned:  # an autotuned kernel's launcher (plain jit ones have no config)
                    found.setdefault(obj.jit_function.__name__, []).append(", ".join(
                        [f"{k}={v}" for k, v in tuned.items()]
                        + [f"num_warps={constexprs.get('num_warps')}", f"num_stages={constexprs.get('num_stages')}"]))
    return found


def libentry_mismatches(launches: dict[str, list[str]], picks: dict[str, str]) -> list[str]:
    """Kernels whose LibEntry launcher runs a config that none of the kernel's keys was given."""
    def matches(launch: str, pick: str) -> bool:
        return set(launch.split(", ")) <= set(pick.split(", "))
    return sorted(kernel for kernel, configs in launches.items()
                  if any(not any(matches(c, p) for k, p in picks.items() if k.split(" ", 1)[0] == kernel)
                         for c in configs))


def run_case(case: Any, ctx: Any, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Build the case, make its first (tuning) call in this arm, then record keys, agreement, error and times."""
    import torch
    from checks import to_cpu

    from benchlib import op_ms
    from common import agreement, key_id, library_autotuners
    from triton_ctx_tune import contextual_autotune

    ranks, ours = ctx.ranks, args.arm == "ours"
    rec: dict[str, Any] = {"case": case.name, "library": case.requirement, "summary": case.summary, "arm": args.arm}
    built, error = None, None
    try:
        built = case.build(ctx)
    except Exception as e:  # noqa: BLE001 - a library that fails to set up is this case's result, not the run's
        traceback.print_exc()
        error = e
    failed = [t for t in ranks.gather(_error_text(error)) if t]  # every rank takes the same branch below
    if failed:
        return {**rec, "status": "error", "stage": "build", "error": failed[0]}
    rec.update(shapes=built.shapes, tolerance=built.tolerance.as_dict())

    before = chosen_configs(library_autotuners(case.modules))

    def zoo_case() -> Any:
        return built.call()
    zoo_case.__qualname__ = zoo_case.__name__ = case.name.replace(".", "_")  # the name the tuner's logs use
    fn = zoo_case
    if ours:
        fn = contextual_autotune(is_dist=ranks.world > 1, cache=False,
                                 log_dir=str(out_dir / f"ctx_logs-w{ranks.world}" / case.name))(zoo_case)

    ranks.barrier()
    t0 = time.perf_counter()
    out = None
    try:
        out = fn()
        ranks.sync()
    except Exception as e:  # noqa: BLE001 - the exception, by class and message, is what the zoo records
        traceback.print_exc()
        error = e
    wall = time.perf_counter() - t0
    gathered = ranks.gather((wall, _error_text(error), error is not None and _is_refusal(error)))
    failed = [(text, refused) for _, text, refused in gathered if text]
    if failed:
        return {**rec, "status": "refused" if failed[0][1] else "error", "stage": "first call",
                "error": failed[0][0], "errors_per_rank": [text for _, text, _ in gathered]}

    autotuners = library_autotuners(case.modules)  # again: a library may build Autotuners on first use
    after = chosen_configs(autotuners)
    picks = {k: v for k, v in after.items() if before.get(k) != v}
    ratio = ranks.max(_finite(built.check(out) if built.check else built.tolerance.ratio(out, built.reference)))
    outputs = out_dir / f"outputs-{args.arm}-w{ranks.world}"
    outputs.mkdir(parents=True, exist_ok=True)
    torch.save(to_cpu(out), outputs / f"{case.name}.rank{ranks.rank}.pt")

    launches = libentry_launches(case.modules)
    rec.update(first_call_s=max(w for w, _, _ in gathered), first_call_s_per_rank=[w for w, _, _ in gathered],
               keys=picks, keys_outside_space=outside_space(autotuners, picks), libentry_launches=launches,
               libentry_mismatches=libentry_mismatches(launches, picks),
               agreement=agreement(ranks, picks), error_ratio=ratio, ok=ratio <= 1.0)
    if ours:
        stats = fn.last_call
        tuned = {key_id(t.kernel, t.key): t.config for t in stats.tuned}
        rec.update(status="tuned" if tuned else "not tuned", executions=stats.executions, tuner_wall_s=stats.wall_s,
                   tuned=tuned, tuned_agreement=agreement(ranks, tuned),
                   seen_not_tuned=sorted(set(picks) - set(tuned)))
    else:
        rec.update(status="tuned" if picks else "no autotuned launch")
    rec["steady_ms"] = op_ms(ranks, fn, iters=args.steady_iters, warmup=1)
    return rec


def _finite(x: float) -> float:
    # A nan would compare false both ways and could vanish in a max over ranks.
    return float("inf") if x != x else x


if __name__ == "__main__":
    sys.exit(main())
