"""Shared helpers of the benchmarks: ranks, clocks, statistics and the provenance of a result file.

Import this only after the environment is set up (TRITON_CACHE_DIR and friends): it imports torch and triton.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import triton

ROOT = Path(__file__).resolve().parent.parent
_T0 = time.perf_counter()


def init_process_group() -> None:
    """Join the launcher's group: NCCL with one GPU per local rank, or gloo on the CPU (the interpreter)."""
    cuda = torch.cuda.is_available() and not interpreting()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    backend = os.environ.get("TRITON_CTX_TUNE_BACKEND") or ("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(local)
        dist.init_process_group(backend, device_id=torch.device("cuda", local))
    else:
        dist.init_process_group(backend)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off", "no")


# ---- ranks --------------------------------------------------------------------------------------

class Ranks:
    """The default process group, with the few collectives the benchmarks need (objects, not tensors)."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")

    @property
    def cuda(self) -> bool:
        return torch.cuda.is_available() and not interpreting()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def barrier(self) -> None:
        self.sync()
        dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's object, in rank order, on every rank."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def max(self, value: float) -> float:
        return max(self.gather(float(value)))

    def log(self, msg: str, all_ranks: bool = False) -> None:
        """A progress line (rank 0 only unless all_ranks), flushed so a killed job still shows where it was."""
        if all_ranks or self.rank == 0:
            print(f"[bench r{self.rank} +{time.perf_counter() - _T0:7.1f}s] {msg}", flush=True)


def timed(ranks: Ranks, fn: Callable[[], Any]) -> tuple[Any, float, list[float]]:
    """Run fn once on every rank from a barrier; (its result, the slowest rank's seconds, every rank's seconds)."""
    ranks.barrier()
    t0 = time.perf_counter()
    out = fn()
    ranks.sync()
    dt = time.perf_counter() - t0
    per_rank = ranks.gather(dt)
    return out, max(per_rank), per_rank


# ---- clocks -------------------------------------------------------------------------------------

_flush_buf: torch.Tensor | None = None


def flush_l2() -> None:
    """Clear L2 the way triton.testing.do_bench does (256 MiB written), outside any timed span."""
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    _flush_buf.zero_()


def host_do_bench(fn: Callable[[], Any], quantiles: Sequence[float] = (0.5, 0.2, 0.8), reps: int = 3) -> list[float]:
    """A host-clock stand-in for Triton's do_bench, for the interpreter (kernels run synchronously there)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return [float(np.quantile(times, q)) for q in quantiles]


def kernel_ms(fn: Callable[[], Any], rep_ms: int, host_reps: int = 3) -> float:
    """Median ms of one launch: triton.testing.do_bench on a GPU (L2 flushed), host clock under the interpreter.

    Per-rank only: the number of runs depends on the rank's own timings, so fn must not contain collectives.
    """
    if interpreting() or not torch.cuda.is_available():
        return host_do_bench(fn, (0.5,), host_reps)[0]
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])[0])


def op_ms(ranks: Ranks, fn: Callable[[], Any], iters: int, warmup: int) -> float:
    """Median ms of one call of fn over a fixed number of calls, the same on every rank (fn may hold collectives).

    Each call is timed alone (CUDA events, L2 flushed before it, as do_bench does); the host clock on CPU.
    """
    for _ in range(warmup):
        fn()
    ranks.barrier()
    if not ranks.cuda:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        flush_l2()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in zip(starts, ends)]))


# ---- statistics ---------------------------------------------------------------------------------

def median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=np.float64)))


def iqr(xs: Sequence[float]) -> list[float]:
    q25, q75 = np.quantile(np.asarray(xs, dtype=np.float64), [0.25, 0.75])
    return [float(q25), float(q75)]


def geomean(xs: Sequence[float]) -> float:
    arr = np.asarray(xs, dtype=np.float64)
    return float(np.exp(np.log(arr).mean())) if len(arr) else math.nan


def rel_fro(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want||_F / ||want||_F in float32."""
    want = want.float()
    return float((got.float() - want).norm()) / max(float(want.norm()), 1e-30)


# ---- provenance ---------------------------------------------------------------------------------

def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def gpu_name() -> str:
    if torch.cuda.is_available() and not interpreting():
        return torch.cuda.get_device_name()
    return "cpu (Triton interpreter)" if interpreting() else "cpu"


def gpu_short_name(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'cpu (...)' -> 'cpu'."""
    words = [w for w in re.split(r"[\s_]+", name) if w and w.lower() not in ("nvidia", "tesla", "geforce", "amd")]
    short = re.sub(r"[^a-z0-9.]+", "", words[0].lower()) if words else "unknown"
    return short or "unknown"


def triton_ctx_tune_version() -> str:
    try:
        import triton_ctx_tune

        return triton_ctx_tune.__version__
    except Exception as e:  # noqa: BLE001 - provenance must not stop a benchmark
        return f"unavailable ({type(e).__name__})"


def provenance(ranks: Ranks | None) -> dict[str, Any]:
    """Hardware, versions, date and commit of a result; `ranks` is None for a single-process benchmark."""
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    commit = _run(["git", "rev-parse", "HEAD"]) or os.environ.get("GIT_COMMIT")
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    name = gpu_name()
    return {
        "gpu": name, "gpu_short": gpu_short_name(name),
        "driver": driver.splitlines()[0].strip() if driver else None,
        "torch": torch.__version__, "triton": triton.__version__, "triton_ctx_tune": triton_ctx_tune_version(),
        "python": sys.version.split()[0], "world": ranks.world if ranks else 1,
        "backend": str(dist.get_backend()) if dist.is_initialized() else None,
        "interpreter": interpreting(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit, "git_dirty": bool(dirty) if commit and dirty is not None else None,
        "hostname": os.uname().nodename,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(jsonable(data), indent=1, allow_nan=False) + "\n")
    tmp.replace(path)


def jsonable(obj: Any) -> Any:
    """Plain JSON: non-finite floats become null, tuples lists, numpy scalars Python numbers, the rest repr()."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return repr(obj)
