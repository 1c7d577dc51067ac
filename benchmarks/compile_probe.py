"""Does a thread pool speed up Triton compilation? Compile the example's configs from a cold cache
sequentially and with N threads, through the autotuner's own compile-only path (run(warmup=True)).

    python benchmarks/compile_probe.py --threads 16
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=16)
    args = p.parse_args()
    import torch
    import triton

    from mlp_kernels import gelu_inplace_kernel, matmul_kernel

    M, H, I = 4096, 4096, 7168
    a = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
    b = torch.empty(H, I, dtype=torch.bfloat16, device="cuda")
    c = torch.empty(M, I, dtype=torch.bfloat16, device="cuda")

    def jobs():
        for cfg in matmul_kernel.configs:
            yield lambda cfg=cfg: matmul_kernel.fn.run(a, b, c, M, I, H, a.stride(0), a.stride(1), b.stride(0),
                                                       b.stride(1), c.stride(0), c.stride(1), grid=(1,),
                                                       warmup=True, **cfg.all_kwargs())
        for cfg in gelu_inplace_kernel.configs:
            yield lambda cfg=cfg: gelu_inplace_kernel.fn.run(c, c.numel(), grid=(1,), warmup=True, **cfg.all_kwargs())

    for mode in ("sequential", f"threads{args.threads}", "sequential-warm"):
        if mode != "sequential-warm":
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"probe-{mode}-")
            try:
                triton.knobs.cache.dir = os.environ["TRITON_CACHE_DIR"]
            except AttributeError:
                pass
            for k in (matmul_kernel.fn, gelu_inplace_kernel.fn):
                for cache in getattr(k, "device_caches", {}).values():
                    cache[0].clear()
                getattr(k, "cache", {}).clear()
        fns = list(jobs())
        t = time.perf_counter()
        if mode.startswith("threads"):
            with ThreadPoolExecutor(args.threads) as pool:
                list(pool.map(lambda f: f(), fns))
        else:
            for f in fns:
                f()
        print(f"{mode:16s} {len(fns)} configs {time.perf_counter() - t:7.2f} s", flush=True)


if __name__ == "__main__":
    main()
