"""One rank of a multi-process test, started by torchrun (see test_dist.py).

Runs the named scenarios in order and writes each one's outcome to OUT/SCENARIO.rank{r}.json,
so the test process can compare what every rank saw. An exception inside a scenario is part
of its outcome; the group stays usable because every rank raises at the same point.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

from tests.kernels import DEVICE, autotuner, chosen, costly, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402

FAST = dict(n_warmup=1, n_repeat=3, early_stop=False)


def rank() -> int:
    return dist.get_rank()


def _oor_on_rank1(blocks: set[int]) -> Callable[[dict[str, Any]], None]:
    """Config pre_hook that fails like a GPU with too little shared memory, on rank 1 only."""
    def hook(nargs: dict[str, Any]) -> None:
        if rank() == 1 and nargs["BLOCK"] in blocks:
            raise OutOfResources(262144, 232448, "shared memory")
    return hook


def _cfg(block: int, cost_ms: Callable[[dict[str, Any]], float] | None = None,
         fail_on_rank1: bool = False) -> triton.Config:
    def hook(nargs: dict[str, Any]) -> None:
        if fail_on_rank1:
            _oor_on_rank1({block})(nargs)
        if cost_ms is not None:
            costly(cost_ms)(nargs)
    return triton.Config({"BLOCK": block}, num_warps=4, pre_hook=hook)


def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _tuned(configs: list[triton.Config]) -> Any:
    return triton.autotune(configs=configs, key=["n"])(triton.jit(_add_one))


# 64 is fastest everywhere, but it fails on rank 1: everyone must fall back to 32.
fails_on_one_rank = _tuned([_cfg(16, lambda a: 60.0), _cfg(32, lambda a: 20.0), _cfg(64, fail_on_rank1=True)])
# Every config fails on rank 1.
fails_everywhere_on_rank1 = _tuned([_cfg(b, fail_on_rank1=True) for b in (16, 32, 64)])
# 32 is fastest on rank 0 but 90 ms slower on rank 1: MAX picks 16, MEAN picks 32.
skewed = [_cfg(16, lambda a: 60.0), _cfg(32, lambda a: 90.0 if rank() == 1 else 0.0), _cfg(64, lambda a: 120.0)]
skewed_max = _tuned(skewed)
skewed_mean = _tuned(list(skewed))
# Early stopping needs the consensus: on rank 0 alone 32 is the only config within 1.5x of the best,
# but rank 1 makes it the slowest, so MAX keeps 16 and 64 and 16 wins.
early = _tuned([_cfg(16, lambda a: 50.0), _cfg(32, lambda a: 200.0 if rank() == 1 else 0.0), _cfg(64, lambda a: 60.0)])
plain = _tuned([_cfg(16, lambda a: 30.0), _cfg(32), _cfg(64, lambda a: 60.0)])


def _add_one_tie(x_ptr, n, BLOCK: tl.constexpr):
    """_add_one under a name of its own: no other scenario's cache entry makes an incumbent for it."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


# A near-tie: 16 is 0.5% faster than 32, which comes first in the list; 64 is 2x slower. (Large declared
# costs: 0.5% of them is far more than the interpreter's own time, which differs between 16 and 32.)
near_tie = triton.autotune(configs=[_cfg(32, lambda a: 600.0 * 1.005), _cfg(16, lambda a: 600.0),
                                    _cfg(64, lambda a: 1200.0)], key=["n"])(triton.jit(_add_one_tie))


def _add_one_incr(x_ptr, n, BLOCK: tl.constexpr):
    """_add_one under a name of its own, for the incremental scenario's two config lists alone."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


# Incremental re-tuning: four configs (32 wins, 16 is the runner-up), then the same four and a faster 8.
_INCR = [_cfg(16, lambda a: 60.0), _cfg(32, lambda a: 40.0), _cfg(64, lambda a: 80.0), _cfg(128, lambda a: 100.0)]
incr_before = triton.autotune(configs=_INCR, key=["n"])(triton.jit(_add_one_incr))
incr_after = triton.autotune(configs=_INCR + [_cfg(8, lambda a: 20.0)], key=["n"])(triton.jit(_add_one_incr))


def _accumulate(src_ptr, acc_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(acc_ptr + offs, tl.load(acc_ptr + offs, mask=mask) + tl.load(src_ptr + offs, mask=mask), mask=mask)


# The backward pass's kernel: in place (acc += src) and skewed like `skewed`, so ranks tuning it
# alone would choose differently (rank 0: 32, rank 1: 16); the call's MAX consensus picks 16.
backward_accumulate = triton.autotune(configs=list(skewed), key=["n"], reset_to_zero=["acc_ptr"])(
    triton.jit(_accumulate))


class _ScaleWithAccumulatingBackward(torch.autograd.Function):
    """y = 3x; the gradient is accumulated into a zeroed buffer by an autotuned in-place kernel."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x * 3

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        acc = torch.zeros_like(grad)
        src = grad.contiguous() * 3
        backward_accumulate[grid(acc.numel())](src, acc, acc.numel())
        return acc


def _train_step(checkpointed: bool) -> dict[str, Any]:
    """A tuned training step: forward, backward on autograd's thread (on a GPU), an all_reduce of the gradient."""
    import threading

    import torch.utils.checkpoint

    w = torch.linspace(0.5, 1.5, 64, device=DEVICE)
    threads: set[str] = set()

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _ScaleWithAccumulatingBackward.apply(x) * w

    def hook(grad: torch.Tensor) -> torch.Tensor:
        threads.add("caller" if threading.current_thread() is threading.main_thread() else "other")
        return grad

    @contextual_autotune(is_dist=True, cache=False, **FAST)  # both variants tune: no persistent cache hit
    def step(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_(True)
        x.register_hook(hook)
        y = torch.utils.checkpoint.checkpoint(forward, x, use_reentrant=False) if checkpointed else forward(x)
        y.sum().backward()
        grad = x.grad
        dist.all_reduce(grad)
        return grad

    grad = step(ramp(64))
    expected = 3 * w * dist.get_world_size()
    tuned = sorted(f"{t.kernel} {t.key!r}" for t in step.last_call.tuned)
    return {"ok": bool(torch.equal(grad, expected)), "blocks": _blocks(backward_accumulate),
            "executions": step.last_call.executions, "tuned": tuned, "backward_threads": sorted(threads)}


def scenario_backward() -> dict[str, Any]:
    return _train_step(checkpointed=False)


def scenario_backward_checkpoint() -> dict[str, Any]:
    autotuner(backward_accumulate).cache.clear()
    return _train_step(checkpointed=True)


def ramp(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device=DEVICE)


def _blocks(kernel: Any) -> dict[str, int]:
    return {repr(k): v for k, v in chosen(kernel).items()}


def scenario_agree() -> dict[str, Any]:
    """Two kernels, one of them twice with two keys, plus the user's own all_reduce."""
    @contextual_autotune(is_dist=True, **FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        plain[grid(h.numel())](h, h.numel())
        g = torch.ones(40, device=DEVICE)
        plain[grid(g.numel())](g, g.numel())
        dist.all_reduce(h)  # the function's own collective stays in lockstep
        return h + g.sum()

    x = ramp(100)
    y = op(x)
    world = dist.get_world_size()
    ok = torch.allclose(y, (x + 1) * world + 80.0)
    again = op(x)
    return {"ok": bool(ok and torch.equal(again, y)), "blocks": _blocks(plain),
            "executions": op.last_call.executions, "second_executions": op.last_call.executions}


def _tune_add_one(kernel: Any, n: int = 64, **opts: Any) -> dict[str, Any]:
    """Tune x + 1 through one kernel; report what every rank needs to compare."""
    @contextual_autotune(is_dist=True, **{**FAST, **opts})
    def op(x: torch.Tensor):
        h = x.clone()
        kernel[grid(h.numel())](h, h.numel())
        return h

    x = ramp(n)
    y = op(x)
    return {"ok": bool(torch.equal(y, x + 1)), "blocks": _blocks(kernel), "executions": op.last_call.executions}


def scenario_one_rank_fails() -> dict[str, Any]:
    result = _tune_add_one(fails_on_one_rank)
    timings = {c.kwargs["BLOCK"]: t[0] for c, t in autotuner(fails_on_one_rank).configs_timings.items()}
    return {**result, "inf": sorted(b for b, t in timings.items() if t == float("inf"))}


def scenario_one_rank_fails_split() -> dict[str, Any]:
    """As one_rank_fails, with a split screening: 64 fails on rank 1 whichever rank screens it."""
    kernel = _tuned([_cfg(16, lambda a: 60.0), _cfg(32, lambda a: 20.0), _cfg(64, fail_on_rank1=True)])
    result = _tune_add_one(kernel, 96, cache=False, n_warmup=1, n_repeat=3, early_stop=1.5, confirm=False)
    timings = {c.kwargs["BLOCK"]: t[0] for c, t in autotuner(kernel).configs_timings.items()}
    return {**result, "inf": sorted(b for b, t in timings.items() if t == float("inf")), **_decision(96)}


def scenario_skew_max() -> dict[str, Any]:
    return _tune_add_one(skewed_max, reduce="max")


def scenario_skew_mean() -> dict[str, Any]:
    return _tune_add_one(skewed_mean, reduce="mean")


def scenario_early_stop() -> dict[str, Any]:
    return _tune_add_one(early, n_warmup=1, n_repeat=3, early_stop=1.5)


# Split screening (every rank the same costs): 8 configs, survivors within 1.5x of 100 ms are 140, 100, 120.
TABLE = [200.0, 140.0, 100.0, 400.0, 120.0, 500.0, 300.0, 250.0]


def _table_configs() -> list[triton.Config]:
    return [_cfg(b, lambda a, ms=ms: ms) for b, ms in zip((16, 32, 64, 128, 256, 512, 1024, 2048), TABLE)]


# _add_one's kernel, each scenario on a size of its own (so the events of its key are its own).
SPLIT_N = {True: 72, False: 80}
FAST_ON_RANK0_N = 88
split_table = {split: _tuned(_table_configs()) for split in SPLIT_N}
# Config #0 is fast on rank 0 only, which screens it; 32 (100 ms) is the true winner, 1024 never comes back.
fast_on_rank0 = _tuned([_cfg(16, lambda a: 0.0 if rank() == 0 else 300.0), _cfg(32, lambda a: 100.0),
                        _cfg(64, lambda a: 110.0), _cfg(1024, lambda a: 1000.0)])


def _decision(n: int) -> dict[str, Any]:
    log = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]) / f"rank-{rank()}.jsonl"
    events = [e for line in log.read_text().splitlines() if (e := json.loads(line)).get("key", [None])[:1] == [n]]
    (*_, last) = (e for e in events if e["event"] == "decision")
    return {"decision": {k: last[k] for k in ("winner", "split", "readmitted", "screened_out", "raced_out")},
            "screens": [e["kept"] for e in events if e["event"] == "screen"]}


def scenario_split_table() -> dict[str, Any]:
    """The same cost table with the ranks sharing the screening, then in lockstep: the same winner."""
    out = {}
    for split, kernel in split_table.items():
        result = _tune_add_one(kernel, SPLIT_N[split], cache=False, n_warmup=1, n_repeat=3, early_stop=1.5,
                               split_screening=split, confirm=False)
        out["split" if split else "lockstep"] = {**result, **_decision(SPLIT_N[split])}
    return out


def scenario_fast_on_one_rank() -> dict[str, Any]:
    """#0 survives its one-rank screening alone; its lockstep time (the slowest rank's, 300 ms) shows the truth,
    and the configs it pushed out within 1.5x of that come back: 32 (100 ms) wins, 1024 (1000 ms) stays out."""
    result = _tune_add_one(fast_on_rank0, FAST_ON_RANK0_N, cache=False, n_warmup=1, n_repeat=3, early_stop=1.5,
                           confirm=False)
    return {**result, **_decision(FAST_ON_RANK0_N)}


def scenario_near_tie() -> dict[str, Any]:
    """Rank 0 breaks the tie and broadcasts how: every rank runs and logs the same choice."""
    result = _tune_add_one(near_tie)
    log = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]) / f"rank-{rank()}.jsonl"
    (*_, last) = (e for line in log.read_text().splitlines() if (e := json.loads(line))["event"] == "decision")
    return {**result, "decision": {k: last[k] for k in ("winner", "fastest", "ties", "tie_break", "band")}}


def scenario_incremental() -> dict[str, Any]:
    """A config added after a tuning: every rank times the same configs (the new one and the anchors, as
    rank 0 planned from its cache entry) and picks the same winner."""
    first = _tune_add_one(incr_before)
    result = _tune_add_one(incr_after)
    log = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]) / f"rank-{rank()}.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    mine = [e for e in events if e["call"] == events[-1]["call"]]  # the second call's
    timed: dict[str, int] = {}
    for e in mine:
        if e["event"] == "slot" and e["timed"]:
            timed[str(e["config_index"])] = timed.get(str(e["config_index"]), 0) + 1
    (inc,) = [e for e in mine if e["event"] == "incremental"]
    (decision,) = [e for e in mine if e["event"] == "decision"]
    return {**result, "first_executions": first["executions"], "timed": timed,
            "incremental": {k: inc[k] for k in ("new", "anchors", "carried", "carried_failed", "removed", "scale")},
            "decision": {k: decision[k] for k in ("winner", "reduced", "per_rank")}}


def scenario_all_fail_on_rank1() -> dict[str, Any]:
    return _tune_add_one(fails_everywhere_on_rank1)  # raises NoValidConfigError on every rank


def scenario_mismatch() -> dict[str, Any]:
    return _tune_add_one(plain, n=64 + 8 * rank())  # rank-dependent shape: raises RankMismatchError


def scenario_straggler() -> dict[str, Any]:
    """Rank 1 already has the key cached, so it never joins the tuning: rank 0 must not hang."""
    @contextual_autotune(is_dist=True, timeout_s=3.0, **FAST)
    def op(x: torch.Tensor):
        h = x.clone()
        plain[grid(h.numel())](h, h.numel())
        return h

    x = ramp(48)
    if rank() == 1:
        autotuner(plain).cache[(48, "torch.float32")] = triton.Config({"BLOCK": 16})
    start = time.monotonic()
    try:
        op(x)
    finally:
        if rank() == 1:
            time.sleep(6.0)  # stay alive past rank 0's deadline, as a busy rank would
    return {"ok": True, "elapsed": time.monotonic() - start}


def scenario_late_peer() -> dict[str, Any]:
    """A collective whose peer comes 0.6 s late, waited for in slices of 0.05 s: the wait spans several slices
    and returns every rank's payload, not a slice's "Operation timed out!"."""
    from triton_ctx_tune.runtime import collectives

    collectives.WAIT_SLICE_S = 0.05
    comm = collectives.Collectives(True, timeout_s=20.0)
    comm.all_gather(torch.zeros(1, dtype=torch.int64), "make the group")  # (its making lines the ranks up)
    if rank() == 1:
        time.sleep(0.6)
    start = time.monotonic()
    rows = comm.all_gather(torch.tensor([rank() + 10], dtype=torch.int64), "late peer")
    waited = time.monotonic() - start
    again = comm.all_gather(torch.tensor([rank() + 20], dtype=torch.int64), "on time")  # the group still works
    return {"ok": True, "rows": rows.flatten().tolist(), "again": again.flatten().tolist(), "waited_s": waited}


def init_group() -> str:
    """Join the torchrun group: NCCL on GPUs (one per local rank), else gloo. Returns the backend."""
    backend = os.environ.get("TRITON_CTX_TUNE_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    # NCCL creates its communicator at the first collective, blocking until every rank arrives; a real
    # job has long done that before it tunes, and the tuner's deadlines start from there.
    dist.barrier()
    return backend


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def main(scenarios: dict[str, Callable[[], dict[str, Any]]] = SCENARIOS) -> None:
    """Run the named scenarios on this rank (also the main of function_worker.py, with its own)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("scenarios", nargs="+", choices=sorted(scenarios))
    args = parser.parse_args()
    backend = init_group()
    out = Path(args.out)
    for name in args.scenarios:
        start = time.monotonic()
        try:
            result = scenarios[name]()
        except Exception as e:  # noqa: BLE001 (the outcome under test)
            result = {"error_type": type(e).__name__, "error": str(e), "traceback": traceback.format_exc()}
        result.update(rank=rank(), world=dist.get_world_size(), backend=backend, wall_s=time.monotonic() - start)
        (out / f"{name}.rank{rank()}.json").write_text(json.dumps(result))
    if "straggler" in args.scenarios:
        os._exit(0)  # rank 0's timed-out collective is still pending; don't wait on it
    dist.destroy_process_group()
    # A normal exit: run_ranks asserts exit code 0 on every rank (runtime/clean_exit.py says why a rank
    # once aborted at interpreter teardown).


if __name__ == "__main__":
    main()
