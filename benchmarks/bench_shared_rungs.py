"""Three keys of one GEMM kernel whose binaries are the same, compiled side by side on each of a node's ranks, on
the CPU (no GPU needed).

    python benchmarks/bench_shared_rungs.py --rounds 3 --ranks 2

As a budgeted search's rungs of three shapes compile in one step (precompile.prefetch): on every rank, each key
hands out every config of its rung. Three arms, in turn, each round fresh processes (one per rank, started
together) and a cold Triton cache shared by them:
  before : a config waiting for another key's compile of its binary keeps its compile-gate place meanwhile (the
           places it holds leave workers idle), and each rank compiles every binary itself;
  gate   : it gives its place back while it waits (precompile.Place.stepped_out, b7beba9);
  node   : and each binary is compiled once on the node: a rank waits for another rank's compile of it
           (precompile.NodeClaims).
Triton really compiles, for an H100 target, in the real compile workers (as tests/workers_parent.py does); only
the load onto a GPU is skipped. Prints each round's wall time (the slowest rank's) and the arms' medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ((512, 512, 512), (1024, 256, 512), (256, 1024, 512))  # multiples of 16: one specialization


ARMS = ("before", "gate", "node")


def child(arm: str, workers: int, barrier: Path, ranks: int) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "examples"))
    from contextlib import nullcontext

    from triton.backends.compiler import GPUTarget

    from triton_ctx_tune.runtime import compat

    compat.use_compile_only_driver(GPUTarget("cuda", 90, 32))
    import torch
    import triton

    import mlp_kernels  # noqa: E402  (examples/ is not a package)
    from triton_ctx_tune.compile import precompile as P
    from triton_ctx_tune.compile.compile_workers import get_pool, start_compile_workers
    from triton_ctx_tune.engine.state import KeyState

    P.load_binary = lambda kernel: None
    if arm == "before":
        P.Place.stepped_out = lambda self: nullcontext()  # type: ignore[method-assign]
    if arm != "node":
        P.NODE_CLAIMS.take = lambda key, cache_dir: None  # type: ignore[method-assign]
    start_compile_workers(workers)
    assert get_pool(workers).wait_ready(240), "workers did not start"
    (barrier / str(os.getpid())).touch()
    while len(list(barrier.iterdir())) < ranks:  # every rank's workers are ready: they start together
        time.sleep(0.01)
    base = mlp_kernels.matmul_kernel
    at = triton.autotune(configs=list(base.configs), key=list(base.keys))(triton.jit(base.fn.fn))
    started, threads = time.monotonic(), []
    for m, n, k in SHAPES:
        a, b, c = (torch.zeros(m, k, dtype=torch.bfloat16), torch.zeros(k, n, dtype=torch.bfloat16),
                   torch.zeros(m, n, dtype=torch.bfloat16))
        args = (a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
        kwargs = {"grid": (1,), "warmup": False}
        state = KeyState(autotuner=at, key=compat.tuning_key(at, args, kwargs), configs=list(at.configs),
                         n_warmup=1, n_repeat=1, kernel=compat.kernel_name(at))
        thread = P.prefetch(state, list(range(len(at.configs))), args, kwargs, workers, 120.0, workers)
        assert thread is not None
        threads.append(thread)
    for thread in threads:
        thread.join()
    return {"seconds": time.monotonic() - started, "configs": len(at.configs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2, help="processes of the node, each with its compile workers")
    p.add_argument("--workers", type=int, default=0, help="compile workers per rank (default: cores / ranks)")
    p.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--barrier", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    workers = a.workers or max(1, (os.cpu_count() or 2) // a.ranks)
    if a.child:
        print(json.dumps(child(a.child, workers, Path(a.barrier), a.ranks)))
        return 0
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for r in range(a.rounds):
        for arm in ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]:
            with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as barrier:
                procs = [subprocess.Popen([sys.executable, __file__, "--child", arm, "--workers", str(workers),
                                           "--barrier", barrier, "--ranks", str(a.ranks)],
                                          env={**env, "TRITON_CACHE_DIR": cache, "TRITON_CTX_TUNE_QUIET": "1"},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                         for _ in range(a.ranks)]
                rows = []
                for proc in procs:
                    out, err = proc.communicate(timeout=600)
                    if proc.returncode != 0:
                        raise SystemExit(err[-4000:])
                    rows.append(json.loads(out.strip().splitlines()[-1]))
            seconds = max(row["seconds"] for row in rows)
            times[arm].append(seconds)
            print(f"round {r + 1} {arm:6s}: {rows[0]['configs']} configs x {len(SHAPES)} keys x {a.ranks} ranks "
                  f"({workers} workers each) in {seconds:.2f} s", flush=True)
    for arm, seconds_list in times.items():
        print(f"{arm:6s}: median {statistics.median(seconds_list):.2f} s over {len(seconds_list)} rounds "
              f"({', '.join(f'{s:.2f}' for s in seconds_list)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
