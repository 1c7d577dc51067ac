"""What a tuned function costs per call once every key is tuned: the bare function vs the decorators.

The function makes three tiny autotuned launches (one kernel, two keys), so the host dominates.
Arms run in alternating rounds, in one process:
  bare      the function itself, Triton's own Autotuner.run
  ours      @contextual_autotune (its dispatcher resident on Autotuner.run)
  td        Triton-distributed's @contextual_autotune, loaded from --td-path (never vendored)
  ours-tuning-miss  (not timed) a call whose key is new, to show the promise: it is tuned by a call of ours,
                    never by Triton alone. This function writes in place (restore_value), so a warm call, which
                    is not watched, defers the key (its first config runs, untuned) and the next call tunes it
                    (docs/exactly-once.md, "New keys in later calls").
Each arm installs its own Autotuner.run before its round, outside the timed span, so no arm pays
for another's patch.

  python benchmarks/bench_call_cost.py [--td-path .../python/triton_dist/autotuner.py] [--rounds 30 --calls 2000]
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

from benchmarks import benchlib  # noqa: E402

PRISTINE_RUN = Autotuner.__dict__["run"]

from triton_ctx_tune import contextual_autotune  # noqa: E402
from triton_ctx_tune.runtime import patch  # noqa: E402

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 1), (256, 2), (512, 4), (1024, 4))]


def make_kernel() -> Any:
    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    # A fresh Autotuner per arm, so that no arm's tuning result serves another.
    return triton.autotune(configs=CONFIGS, key=["n"], restore_value=["x_ptr"])(add_one)


def make_function(kernel: Any) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def three_launches(a: torch.Tensor, b: torch.Tensor) -> None:
        kernel[lambda m: (triton.cdiv(a.numel(), m["BLOCK"]),)](a, a.numel())
        kernel[lambda m: (triton.cdiv(b.numel(), m["BLOCK"]),)](b, b.numel())
        kernel[lambda m: (triton.cdiv(a.numel(), m["BLOCK"]),)](a, a.numel())
    return three_launches


def load_td(path: str) -> Any:
    """Triton-distributed's decorator module, from a file. Importing it patches Autotuner.run."""
    spec = importlib.util.spec_from_file_location("td_autotuner", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--td-path {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_call_us(fn: Callable[[], None], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--td-path", help="python/triton_dist/autotuner.py of a Triton-distributed checkout")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_call_cost needs a CUDA GPU: it measures host overhead around real launches")

    a = torch.randn(1 << 12, device="cuda")
    b = torch.randn(1 << 14, device="cuda")
    arms: dict[str, tuple[Callable[[], None], Any]] = {}

    bare_fn = make_function(make_kernel())
    arms["bare"] = (lambda: bare_fn(a, b), PRISTINE_RUN)

    ours_fn = contextual_autotune(is_dist=False, cache=False, log_dir=False, quiet=True)(make_function(make_kernel()))
    ours_fn(a, b)  # tunes both keys; from here on every call is warm
    assert patch.resident and ours_fn.last_call.executions > 1
    arms["ours"] = (lambda: ours_fn(a, b), Autotuner.__dict__["run"])

    if args.td_path:
        import torch.distributed as dist

        if not dist.is_initialized():  # its logging asks for the rank even with is_dist=False
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
        Autotuner.run = PRISTINE_RUN  # type: ignore[method-assign]
        td = load_td(args.td_path)
        td_run = Autotuner.__dict__["run"]
        td_fn = td.contextual_autotune(is_dist=False)(make_function(make_kernel()))
        td_fn(a, b)
        arms["td"] = (lambda: td_fn(a, b), td_run)

    for fn, run in arms.values():  # warm every arm's compiled kernels and caches
        Autotuner.run = run  # type: ignore[method-assign]
        per_call_us(fn, 200)

    samples: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for name in order:
            fn, run = arms[name]
            Autotuner.run = run  # type: ignore[method-assign]
            samples[name].append(per_call_us(fn, args.calls))

    # The promise: a new key met by a warm call is tuned by the tuner (that call, or the next when the call
    # cannot be undone), never through Triton alone.
    Autotuner.run = arms["ours"][1]  # type: ignore[method-assign]
    c = torch.randn(1 << 13, device="cuda")
    miss: dict[str, Any] = {"calls": []}
    for _ in range(2):
        ours_fn(a, c)
        miss["calls"].append({"executions": ours_fn.last_call.executions,
                              "deferred": [f"{k} {key!r}" for k, key in ours_fn.last_call.deferred],
                              "tuned": [f"{t.kernel} {t.key!r}" for t in ours_fn.last_call.tuned]})
    Autotuner.run = PRISTINE_RUN  # type: ignore[method-assign]

    bare = benchlib.median(samples["bare"])
    rows = []
    for name, xs in samples.items():
        med = benchlib.median(xs)
        rows.append({"arm": name, "median_us": med, "min_us": min(xs), "max_us": max(xs), "extra_us": med - bare,
                     "extra_per_launch_us": (med - bare) / 3})
    print(f"{'arm':6} {'median us/call':>15} {'range':>17} {'extra us':>9}")
    for row in rows:
        print(f"{row['arm']:6} {row['median_us']:15.2f} {row['min_us']:8.2f}-{row['max_us']:<8.2f} "
              f"{row['extra_us']:9.2f}")
    for i, call in enumerate(miss["calls"]):
        print(f"{'warm call meeting a new key' if i == 0 else 'the call after it'}: {call['executions']} executions, "
              f"deferred {call['deferred']}, tuned {call['tuned']}")
    if args.out:
        benchlib.write_json(args.out, {"rows": rows, "samples": samples, "miss": miss, "rounds": args.rounds,
                                       "calls": args.calls, "provenance": benchlib.provenance(None)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
