"""One rank of the randomized schedule test (test_schedule.py), started by torchrun.

Runs every schedule of a JSON file in order, each a small program of autotuned kernels drawn at random:
its keys, config counts, launches per execution, a key first met in a later call, per-rank first-launch
delays (as a slow compile would give), a config failing on one rank, one rank's timings scaled, either
driver (re-execution or online), split screening on or off, and sometimes a function-level point space.
Each schedule logs into a folder of its own; the rank writes its outcome per schedule to
OUT/schedules.rank{r}.json: winners, executions per call, the in-place state after the calls, the error
if the schedule raised. The test compares them and the ranks' 'collective' log events.

A rank leaves normally (destroy_process_group, then the interpreter's own exit): the test asserts exit
code 0 on every rank.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

from tests.kernels import DEVICE, grid, spend  # noqa: E402
from triton_ctx_tune import autotune, contextual_autotune  # noqa: E402
from triton_ctx_tune.runtime.compat import config_str  # noqa: E402

# Up to 9 configs: BLOCK x num_warps (the interpreter ignores warps; the tuner tells them apart).
CONFIGS = [(b, w) for b in (16, 32, 64) for w in (1, 2, 4)]


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _hook(key: dict[str, Any], index: int, rank: int) -> Any:
    cost = key["costs"][index] * (key["scale"] if rank == key["slow_rank"] else 1.0)
    fails = key["fail"] is not None and key["fail"] == [rank, index]
    delay = key["delay_ms"] if rank == key["delay_rank"] else 0.0
    first = [True]

    def hook(nargs: dict[str, Any]) -> None:
        if fails:
            raise OutOfResources(262144, 232448, "shared memory")
        if first[0] and delay:
            first[0] = False
            time.sleep(delay / 1e3)  # a real delay: this rank falls behind, as a slow compile makes it
        if cost:
            spend(cost)
    return hook


@triton.jit
def _add_one_compiling(x_ptr, n, BLOCK: tl.constexpr, SLOW: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _slow_compile(key: dict[str, Any], rank: int) -> Any:
    """A heuristic that sleeps in the compile-only launch (precompile's) of one config on one rank: to the tuner,
    a compile that takes that long there (the launches themselves are not slowed)."""
    delay_rank, index, ms = key["compile_delay"]
    block, warps = CONFIGS[index]

    def slow(args: dict[str, Any]) -> int:
        if rank == delay_rank and args.get("warmup") and args["BLOCK"] == block and args.get("num_warps") == warps:
            time.sleep(ms / 1e3)
        return 0
    return slow


def _kernel(key: dict[str, Any], rank: int) -> Any:
    configs = [triton.Config({"BLOCK": b}, num_warps=w, pre_hook=_hook(key, i, rank))
               for i, (b, w) in enumerate(CONFIGS[:key["configs"]])]
    if key.get("compile_delay") is None:
        return triton.autotune(configs=configs, key=["n"], restore_value=["x_ptr"])(_add_one)
    return triton.autotune(configs=configs, key=["n"], restore_value=["x_ptr"])(
        triton.heuristics({"SLOW": _slow_compile(key, rank)})(_add_one_compiling))


def run_schedule(s: dict[str, Any], logs: Path) -> dict[str, Any]:
    rank = dist.get_rank()
    kernels = [_kernel(k, rank) for k in s["keys"]]
    xs = [torch.zeros(k["n"], device=DEVICE) for k in s["keys"]]
    calls = {"n": 0}

    def body(call: int, extra: int = 0) -> None:
        for k, at, x in zip(s["keys"], kernels, xs):
            if call >= k["first_call"]:
                for _ in range(k["launches"] + (extra if k is s["keys"][0] else 0)):
                    at[grid(k["n"])](x, k["n"])

    options = dict(n_warmup=s["n_warmup"], n_repeat=s["n_repeat"], cache=False, log_dir=str(logs),
                   split_screening=s["split"], online=s["driver"] == "online", precompile=s["precompile"])
    if s["early_stop"] is False:
        options["early_stop"] = False
    if s.get("budget") is not None:
        options["budget"] = s["budget"]
    if s["space"]:
        @autotune(config_space=[{"extra": 0}, {"extra": 1}], key_fn=lambda call: 0, is_dist=True,
                  **{k: v for k, v in options.items() if k != "online"})
        def fn(call: int, *, extra: int) -> None:
            calls["n"] += 1
            body(call, extra)
            spend(s["point_costs"][extra])
    else:
        @contextual_autotune(is_dist=True, **options)
        def fn(call: int) -> None:
            calls["n"] += 1
            body(call)

    executions, launched = [], [0] * len(xs)
    for call in range(s["calls"]):
        before = calls["n"]
        fn(call)
        executions.append(calls["n"] - before)
        for i, k in enumerate(s["keys"]):
            if call >= k["first_call"]:
                launched[i] += k["launches"]
        if s["driver"] == "online" and call >= s["min_calls"] - 1 and getattr(fn, "_online", None) is None:
            break
    online_open = getattr(fn, "_online", None) is not None
    return {"executions": executions, "online_open": online_open,
            "winners": {f"{i}:{key!r}": config_str(c) for i, at in enumerate(kernels) for key, c in at.cache.items()},
            # each call changed the state once: as many +1s as the calls' launches (a point's extra launches
            # count for the point that ran last; the space is re-executed only, so only key 0 varies)
            "state_ok": [bool(torch.all(x == launched[i])) for i, x in enumerate(xs)] if not s["space"] else None,
            "state": [float(x[0]) for x in xs]}


def mismatch(out: Path) -> None:
    """The last rank skips step 2's end (the test-only hook): every rank must raise ScheduleMismatchError
    within seconds, with the older state the call found."""
    from triton_ctx_tune.engine import schedule

    rank, world = dist.get_rank(), dist.get_world_size()
    schedule.skip_step_end = lambda function, r, step: r == world - 1 and step == 2
    key = {"configs": 4, "costs": [0.0, 1.0, 2.0, 3.0], "fail": None, "slow_rank": None, "scale": 1.0,
           "delay_rank": None, "delay_ms": 0.0}
    at = _kernel(key, rank)
    x = torch.zeros(32, device=DEVICE)

    @contextual_autotune(is_dist=True, n_warmup=1, n_repeat=2, cache=False, log_dir=str(out / "logs-mismatch"))
    def fn() -> None:
        at[grid(32)](x, 32)

    start = time.monotonic()
    try:
        fn()
        row: dict[str, Any] = {"error_type": None}
    except Exception as e:  # noqa: BLE001 (the outcome under test)
        row = {"error_type": type(e).__name__, "error": str(e)}
    row.update(seconds=time.monotonic() - start, x=float(x.abs().sum()))
    schedule.skip_step_end = None
    (out / f"mismatch.rank{rank}.json").write_text(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("schedules", help="a JSON file of schedules, or 'mismatch'")
    args = parser.parse_args()
    dist.init_process_group(os.environ.get("TRITON_CTX_TUNE_BACKEND", "gloo"), timeout=datetime.timedelta(seconds=60))
    out, rank = Path(args.out), dist.get_rank()
    if args.schedules == "mismatch":
        mismatch(out)
        dist.destroy_process_group()
        return
    results = []
    for s in json.loads(Path(args.schedules).read_text()):
        (out / "progress").mkdir(exist_ok=True)
        (out / "progress" / f"rank{rank}").write_text(str(s["id"]))  # which schedule a hang was in
        start = time.monotonic()
        try:
            row = run_schedule(s, out / f"logs-{s['id']}")
        except Exception as e:  # noqa: BLE001 (the outcome under test: every rank must raise alike)
            row = {"error_type": type(e).__name__, "error": str(e)[:2000], "traceback": traceback.format_exc()[-3000:]}
        row.update(id=s["id"], wall_s=time.monotonic() - start)
        results.append(row)
    (out / f"schedules.rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
