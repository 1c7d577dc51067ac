"""Configs compiled per second by precompilation: threads only, then the compile worker processes.

Compiles every config of the example's matmul and GELU kernels (examples/mlp_kernels.py) for three
dtypes each, through the precompile path itself (precompile._compile: compile, then load onto the
GPU), each mode on its own cold TRITON_CACHE_DIR. The workers are started and waited for before
their timing starts; their start-up is reported apart (in a real job it overlaps the threads'
compiles). `cubins` counts the binaries in the workers' cold cache: equal to `configs` when every
compile of the parent found the worker's binary under its own key. Prints one JSON line.

    python benchmarks/compile_probe.py [--threads N] [--workers N]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))


def main() -> None:
    import torch
    import triton

    import mlp_kernels
    from triton_ctx_tune.compile.compile_workers import default_workers, get_pool
    from triton_ctx_tune.compile.precompile import _compile, default_threads
    from triton_ctx_tune.engine.state import KeyState
    from triton_ctx_tune.runtime import compat

    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--workers", type=int, default=default_workers())
    args = p.parse_args()

    M, N, K = 4096, 4096, 4096
    launches = []  # (autotuner, args, kwargs)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.empty(M, K, dtype=dtype, device="cuda")
        b = torch.empty(K, N, dtype=dtype, device="cuda")
        c = torch.empty(M, N, dtype=dtype, device="cuda")
        launches.append((mlp_kernels.matmul_kernel, (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                                     b.stride(1), c.stride(0), c.stride(1)), {"grid": (1,)}))
        launches.append((mlp_kernels.gelu_inplace_kernel, (c, c.numel()), {"grid": (1,)}))
    n_configs = sum(len(at.configs) for at, _, _ in launches)

    def cold_cache(mode: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"compile-probe-{mode}-"))
        os.environ["TRITON_CACHE_DIR"] = str(path)
        try:
            triton.knobs.cache.dir = str(path)
        except AttributeError:
            pass
        for at in (mlp_kernels.matmul_kernel, mlp_kernels.gelu_inplace_kernel):
            fn = compat.jit_function(at)
            for cache in getattr(fn, "device_caches", {}).values():
                cache[0].clear()  # this process's in-memory kernels: each mode starts cold
        return path

    def compile_all(pool) -> tuple[float, int, int]:
        start = time.perf_counter()
        failed = by_workers = 0
        for at, a, kw in launches:
            state = KeyState(autotuner=at, key=compat.tuning_key(at, a, kw), configs=list(at.configs), n_warmup=1,
                             n_repeat=1, kernel=compat.kernel_name(at))
            batch = _compile(state, list(range(len(at.configs))), a, kw, args.threads, math.inf, pool)
            failed += len(batch.failures) + len(batch.rejected)
            by_workers += len(batch.by_workers)
        return time.perf_counter() - start, failed, by_workers

    cold_cache("threads")
    threads_s, threads_failed, _ = compile_all(None)

    cache = cold_cache("workers")
    boot = time.perf_counter()
    pool = get_pool(args.workers)
    ready = pool.wait_ready(600)
    boot_s = time.perf_counter() - boot
    workers_s, workers_failed, by_workers = compile_all(pool)
    print(json.dumps({
        "gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "cpus": os.cpu_count(),
        "configs": n_configs, "threads": args.threads, "workers": args.workers, "workers_ready": ready,
        "threads_s": round(threads_s, 2), "threads_configs_per_s": round(n_configs / threads_s, 2),
        "workers_s": round(workers_s, 2), "workers_configs_per_s": round(n_configs / workers_s, 2),
        "worker_boot_s": round(boot_s, 2), "by_workers": by_workers,
        "failed": {"threads": threads_failed, "workers": workers_failed},
        "cubins": len(list(cache.glob("*/*.cubin"))), "unusable": pool.unusable}), flush=True)


if __name__ == "__main__":
    main()
