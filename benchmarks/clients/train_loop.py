"""Training-loop benchmark: each real client's step followed by an AdamW step, --steps times, in four arms.

One training step is one function: the client's step (forward, backward, its gradient all_reduce; it zeroes the
gradients first, as the client does) then AdamW (lr 1e-4) over the client's trainable tensors (Workload.params).
Arms (--arm), one per process, each from a cold Triton cache (a fresh TRITON_CACHE_DIR per job unless you set one):
  fixed   every Autotuner of the client's library runs one config: the first of its configs that the library's own
          pruning (prune_configs_by) keeps, without benchmarking. The reference arm.
  plain   the loop as written: every rank's @triton.autotune tunes alone on the first step (Triton's do_bench)
  reexec  the step function decorated with contextual_autotune(is_dist=True, cache=False): its first call
          re-executes the step to tune every key, with exactly-once semantics (one step's effect on the state)
  online  contextual_autotune(is_dist=True, cache=False, online=True): every call runs the step once, calls take
          tuning slots until every key is decided (the tuned function's _online is None), then calls are warm:
          the first call after that is the first that runs every key tuned

    ./launch benchmarks/clients/train_loop.py --arm fixed --out $OUT/train-fixed.json      # and plain, reexec, online
    python benchmarks/clients/train_loop.py --merge $OUT/train-{fixed,plain,reexec,online}.json --out $OUT/train.json

benchmarks/clients/run_train_all.sh OUT does all five. Per client and arm: every step's wall time (slowest rank,
synchronized) and loss (the step's output as a float: the value of a scalar, the RMS of a tensor; rank 0), the time
until the first step that runs every key tuned has ended (step 1, except online: the first call after the session
ended), the extra time until then (each step's time above the tuned step's, summed over the steps up to and including
that one; the tuned step: the median of the last 10 steps after it), the total of the first 50 steps, the steady step
(median of the last 10), the final parameters (SHA-256 per rank and tensor, norms, a strided sample) and the tuner's
executions or calls.
On CPU: TRITON_INTERPRET=1 NPROC=2 ./launch benchmarks/clients/train_loop.py --arm reexec --clients toy --small.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from run_clients import CLIENT_MODULES, ROOT, job_meta, run_arm, run_specs, setup_paths

ARMS = ("fixed", "plain", "reexec", "online")
DEFAULT_CLIENTS = ("fla_simple_gla", "cce")
TOTAL_STEPS = 50  # "total" is the time of the first this-many steps
STEADY_STEPS = 10  # "steady" is the median of the last this-many steps
SAMPLE = 1024  # elements of each final parameter kept for the within-tolerance comparison
PARAM_RTOL = 2e-2  # bf16: final parameters "within tolerance" of the fixed arm's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--arm", choices=ARMS, help="how the loop's kernels get their configs (one arm per process)")
    mode.add_argument("--merge", nargs="+", metavar="JSON", help="print one table per client over the arms' JSON "
                                                                 "files and exit")
    p.add_argument("--clients", default=",".join(DEFAULT_CLIENTS),
                   help=f"comma-separated, from {', '.join(CLIENT_MODULES)} (default {','.join(DEFAULT_CLIENTS)})")
    p.add_argument("--out", help="JSON file (default benchmarks/results/clients/train-<arm>-<world>ranks.json; "
                                 "with --merge: where the merged JSON goes, none if absent)")
    p.add_argument("--steps", type=int, default=50, help="training steps per client (default 50)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="tiny shapes (a quick functional run, not the benchmark)")
    p.add_argument("--keep-triton-cache", action="store_true",
                   help="keep the Triton cache directory this script created (default: removed at exit)")
    args = p.parse_args(argv)
    args.clients = [c for c in args.clients.split(",") if c]
    unknown = [c for c in args.clients if c not in CLIENT_MODULES]
    if unknown or not args.clients:
        p.error(f"--clients: unknown {unknown}; choose from {', '.join(CLIENT_MODULES)}")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_paths()
    if args.merge:
        return merge(args.merge, args.out)
    return run_arm(args, run)


# ---- the run ----------------------------------------------------------------------------------------

def run(args: argparse.Namespace, ranks: Any, specs: list[Any], cache: dict[str, Any]) -> int:
    default_out = ROOT / "benchmarks" / "results" / "clients" / f"train-{args.arm}-{ranks.world}ranks.json"
    out = Path(args.out) if args.out else default_out
    meta = job_meta("train_loop", args, ranks, specs, cache, steps=args.steps, lr=args.lr)
    records = run_specs(
        args, ranks, specs, out, meta, heading=lambda spec: f"{args.steps} steps of {spec.summary}, then AdamW",
        one=lambda spec, ctx, all_modules: train_client(
            spec, ctx, args, all_modules, out.parent / "ctx_logs" / f"train-{args.arm}" / spec.name),
        describe=lambda rec: (f"first tuned step ended at {_fmt(rec['first_tuned']['at_s'], '.2f')} s (call "
                              f"{rec['first_tuned']['call']}), {_fmt(rec['first_tuned']['extra_s'], '.2f')} s extra "
                              f"until then, first {rec['total']['steps']} steps {rec['total']['s']:.2f} s, steady "
                              f"{rec['steady_ms']:.3f} ms, {_tuning_cell(rec)}"))
    if ranks.rank == 0:
        print(f"wrote {out}", flush=True)
    return 1 if any(r.get("error") for r in records) else 0


def train_client(spec: Any, ctx: Any, args: argparse.Namespace, all_modules: tuple[str, ...], log_dir: Path
                 ) -> dict[str, Any]:
    """Build the client, run --steps training steps in this arm, and record times, losses and final parameters."""
    import torch

    from common import clear_caches, library_autotuners
    from triton_ctx_tune import contextual_autotune

    ranks = ctx.ranks
    work = spec.build(ctx)  # inputs and the float32 reference: before any timing
    if not work.params:
        raise RuntimeError(f"client {spec.name} names no trainable tensors (Workload.params)")
    cleared = clear_caches(library_autotuners(all_modules))  # no key left by an earlier client can hit
    opt = torch.optim.AdamW(work.params, lr=args.lr)
    client_step = work.step

    def train_step() -> torch.Tensor:
        out = client_step()  # zeroes the gradients, forward, backward, gradient all_reduce
        opt.step()
        return out

    train_step.__name__ = train_step.__qualname__ = f"train_{spec.name}"  # the name the tuner's logs use
    step: Callable[[], torch.Tensor] = train_step
    if args.arm in ("reexec", "online"):
        step = contextual_autotune(is_dist=True, cache=False, online=args.arm == "online",
                                   log_dir=str(log_dir))(train_step)
    unpin = pin_first_configs(library_autotuners(spec.modules)) if args.arm == "fixed" else None
    pinned = None
    try:
        loop = run_loop(ranks, step, args.steps, args.arm)
    finally:
        if unpin is not None:
            pinned = unpin()
    times = [max(per_step) for per_step in zip(*ranks.gather(loop["times"]))]  # slowest rank, per step
    n_total = min(TOTAL_STEPS, len(times))
    call = loop["first_tuned_call"]
    return {
        "client": spec.name, "arm": args.arm, "library": spec.requirement, "summary": spec.summary,
        "shapes": work.shapes, "steps": args.steps, "lr": args.lr, "autotuner_entries_cleared": cleared,
        "pinned": pinned, "step_s": times, "losses": loop["losses"],
        "first_tuned": first_tuned(times, call),
        "total": {"steps": n_total, "s": sum(times[:n_total])},
        "steady_ms": 1e3 * _median(times[-STEADY_STEPS:]),
        "tuning": loop["tuning"],
        "params": final_params(ranks, work.params),
        "ctx_log_dir": str(log_dir) if args.arm in ("reexec", "online") else None,
    }


def run_loop(ranks: Any, step: Callable[[], Any], steps: int, arm: str) -> dict[str, Any]:
    """Call step `steps` times, each timed alone (synchronized before both clock reads); losses read after the loop."""
    import torch

    outs, times, active, calls, tuned = [], [], [], [], []
    tuning: dict[str, Any] = {}
    ranks.barrier()
    for i in range(steps):
        ranks.sync()
        t0 = time.perf_counter()
        out = step()
        ranks.sync()
        times.append(time.perf_counter() - t0)
        outs.append(_as_loss(out))  # on the device: no host round trip between steps
        if arm == "reexec" and i == 0:
            first = step.last_call
            tuning = {"executions": first.executions, "keys_tuned": len(first.tuned), "tuner_wall_s": first.wall_s}
        elif arm == "online":
            active.append(step._online is not None)  # the session goes on into the next call
            calls.append(step.last_call.executions)  # the session's running total, or a warm call's 1
            tuned.append(len(step.last_call.tuned))  # the session's keys decided so far
    first_tuned_call = 1
    if arm == "online":
        decided = next((i + 1 for i, going_on in enumerate(active) if not going_on), None)
        tuning = {"calls_until_decided": decided, "session_calls": calls[decided - 1] if decided else calls[-1],
                  "session_active_after_call": active, "keys_tuned": tuned[decided - 1] if decided else tuned[-1]}
        # The session ended at the end of call `decided`: the next call is the first that runs every key tuned.
        first_tuned_call = decided + 1 if decided is not None and decided < steps else None
    return {"times": times, "losses": torch.stack(outs).cpu().tolist(), "first_tuned_call": first_tuned_call,
            "tuning": tuning or {"executions": 1}}


def first_tuned(times: list[float], call: int | None) -> dict[str, Any]:
    """The first step that runs every key tuned (1-based `call`; None: not within the loop) and what it took to get
    there: at_s, the time from the start of step 1 to its end; tuned_step_ms, the tuned step's time (the median of the
    last STEADY_STEPS steps after it; None without any); extra_s, each step's time above the tuned step's, summed over
    the steps up to and including that one (the tuning's cost in time the loop spent)."""
    if call is None:
        return {"call": None, "at_s": None, "tuned_step_ms": None, "extra_s": None}
    after = times[call:][-STEADY_STEPS:]
    tuned = _median(after) if after else None
    return {"call": call, "at_s": sum(times[:call]), "tuned_step_ms": None if tuned is None else 1e3 * tuned,
            "extra_s": None if tuned is None else sum(t - tuned for t in times[:call])}


def _as_loss(out: Any) -> Any:
    """The step's checked output as one number: a scalar's value, a tensor's RMS (float32)."""
    out = out.detach().float()
    return out.reshape(()) if out.numel() == 1 else out.square().mean().sqrt()


def pin_first_configs(autotuners: list[Any]) -> Callable[[], None]:
    """Fixed arm: each Autotuner launches the first config its library's pruning keeps, and benchmarks nothing.

    Instance attributes over Autotuner.prune_configs (keep the first of what the library's prune_configs_by keeps;
    with none, configs[0]) and _bench (a Triton that benchmarks a single pruned config gets a zero timing instead of
    running it). Triton's run then caches that config per key. Returns the undo, which returns {key: config pinned}.
    """
    from common import seen_keys

    for at in autotuners:
        library_prune = at.prune_configs
        at.prune_configs = lambda *args, _prune=library_prune, **kwargs: list(_prune(*args, **kwargs))[:1]
        at._bench = lambda *args, config=None, **kwargs: [0.0, 0.0, 0.0]

    def unpin() -> dict[str, str]:
        pinned = seen_keys(autotuners)
        for at in autotuners:
            for name in ("prune_configs", "_bench"):
                at.__dict__.pop(name, None)
            at.cache.clear()
        return pinned
    return unpin


def final_params(ranks: Any, params: list[Any]) -> dict[str, Any]:
    """Every rank's final parameters: SHA-256 of the bytes, float32 norm and a strided sample, per tensor."""
    import torch

    mine = []
    for p in params:
        t = p.detach().contiguous()
        flat = t.reshape(-1)
        k = min(SAMPLE, flat.numel())  # evenly spaced indices, first and last included (int64: no float rounding)
        idx = torch.arange(k, device=flat.device) * (flat.numel() - 1) // max(k - 1, 1)
        mine.append({"shape": list(t.shape), "dtype": str(t.dtype),
                     "sha256": hashlib.sha256(t.cpu().view(torch.uint8).numpy().tobytes()).hexdigest(),
                     "norm": float(t.float().norm()), "sample": flat[idx].float().cpu().tolist()})
    return {"per_rank": ranks.gather(mine)}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


# ---- the report -------------------------------------------------------------------------------------

COLUMNS = ("arm", "first tuned step at (s)", "extra until then (s)", "total first N steps (s)", "vs fixed",
           "steady step (ms)", "max |loss - fixed|", "params = fixed (bitwise / 2e-2)", "executions or calls")


def _fmt(v: Any, fmt: str) -> str:
    from summary import _num

    return _num(v, fmt)


def _tuning_cell(rec: dict[str, Any]) -> str:
    tuning = rec["tuning"]
    if rec["arm"] == "online":
        n = tuning["calls_until_decided"]
        return f"decided after {n} calls" if n else f"not decided in {tuning['session_calls']} calls"
    if rec["arm"] == "reexec":
        return f"{tuning['executions']} executions (1st call)"
    return "1 per step"


def params_vs(rec: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """Bitwise equality of every rank's final parameters, and closeness: relative error of each sample and norm."""
    mine, theirs = rec["params"]["per_rank"], ref["params"]["per_rank"]
    bitwise = [[p["sha256"] for p in r] for r in mine] == [[p["sha256"] for p in r] for r in theirs]
    if [[p["shape"] for p in r] for r in mine] != [[p["shape"] for p in r] for r in theirs]:
        return {"bitwise": False, "max_rel_err": None, "close": False}  # not the same parameters
    worst = 0.0
    for rank_a, rank_b in zip(mine, theirs):
        for a, b in zip(rank_a, rank_b):
            diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a["sample"], b["sample"])))
            base = math.sqrt(sum(y * y for y in b["sample"]))
            worst = max(worst, diff / max(base, 1e-30), abs(a["norm"] - b["norm"]) / max(b["norm"], 1e-30))
    return {"bitwise": bitwise, "max_rel_err": worst, "close": worst <= PARAM_RTOL}


def compare(rec: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, Any]:
    """One arm against the fixed arm: total time ratio, worst loss difference, final parameters."""
    if ref is None or ref.get("error") or rec.get("error"):
        return {}
    n = min(len(rec["losses"]), len(ref["losses"]))
    return {"vs_fixed": rec["total"]["s"] / ref["total"]["s"] if ref["total"]["s"] else None,
            "max_loss_diff": max(math.inf if a is None or b is None else abs(a - b)  # None: a non-finite loss
                                 for a, b in zip(rec["losses"][:n], ref["losses"][:n])),
            "loss_steps_compared": n, "params": params_vs(rec, ref)}


def table_row(rec: dict[str, Any], cmp: dict[str, Any]) -> list[str]:
    if rec.get("error"):
        return [rec["arm"], f"FAILED: {rec['error'][:80]}"]
    first = rec["first_tuned"]
    at = f"{_fmt(first['at_s'], '.2f')} (call {first['call']})" if first["call"] else "not tuned yet"
    params = cmp.get("params")
    eq = "-" if params is None else (f"{'yes' if params['bitwise'] else 'no'} / {'yes' if params['close'] else 'NO'}"
                                     f" ({_fmt(params['max_rel_err'], '.1e')})")
    extra = first.get("extra_s")  # (files of older versions have none)
    return [rec["arm"], at, "-" if extra is None else _fmt(extra, ".2f"),
            f"{_fmt(rec['total']['s'], '.2f')} ({rec['total']['steps']})",
            _fmt(cmp.get("vs_fixed"), ".2f") + "x" if cmp.get("vs_fixed") else "-", _fmt(rec["steady_ms"], ".3f"),
            _fmt(cmp.get("max_loss_diff"), ".2e"), eq, _tuning_cell(rec)]


def merge(paths: list[str], out: str | None) -> int:
    """One table per client over the arms' JSON files, against the fixed arm; writes them as one JSON if out."""
    from summary import format_table

    runs = [json.loads(Path(p).read_text()) for p in paths]
    records = [rec for r in runs for rec in r["results"]]
    clients = list(dict.fromkeys(rec["client"] for rec in records))
    merged = []
    for client in clients:
        mine = sorted((r for r in records if r["client"] == client),
                      key=lambda r: ARMS.index(r["arm"]) if r["arm"] in ARMS else len(ARMS))
        ref = next((r for r in mine if r["arm"] == "fixed"), None)
        rows = []
        for rec in mine:
            cmp = compare(rec, ref)
            merged.append({**rec, "vs_fixed": cmp})
            rows.append(table_row(rec, cmp))
        meta = runs[0]["meta"]
        print(f"\n=== {client}: {meta.get('steps')} steps, world {meta.get('world')}, {meta.get('gpu')}, "
              f"libraries {meta.get('libraries')}")
        print("\n".join(format_table(list(COLUMNS), rows)))
    print("\ncolumns: first tuned step at = seconds from the first step to the end of the first step that runs every "
          "key tuned\n  (fixed, plain and reexec: step 1; online: the first call after the session ended, the call "
          "after the one that\n  decided the last key); extra until then = each step's time above the tuned step's, "
          "summed over the steps up to\n  and including that one (the tuned step: the median of the last "
          f"{STEADY_STEPS} steps after it); total = the first\n  min({TOTAL_STEPS}, steps) steps; vs fixed = total / "
          f"fixed's total; steady = median of "
          f"the last {STEADY_STEPS} steps; steps are the slowest\n  rank's, synchronized; loss = rank 0's step output "
          f"(a scalar's value, a tensor's RMS); params = fixed: every rank's final\n  tensors bit for bit / within "
          f"{PARAM_RTOL:g} relative (strided sample and norm; worst in brackets); "
          f"executions of reexec's\n  first call, "
          "calls online took to decide every key", flush=True)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"runs": [{"file": p, "arm": r["arm"], "meta": r["meta"]}
                                                  for r, p in zip(runs, paths)], "results": merged}, indent=1) + "\n")
        print(f"wrote {out}")
    return 0 if all(not r.get("error") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
