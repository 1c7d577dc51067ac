"""How long Triton's per-signature C launcher (Triton 3.4 to 3.6) takes to build on this host: with the cores
idle, then beside 32 busy processes at nice 5 (as the compile workers run). RESULTS.md section 36.

    python benchmarks/launcher_probe.py      # a GPU host; prints one line per build
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

TYPES = ("*fp32", "*fp16", "*bf16", "i32", "i64", "fp32", "*i32", "*i64")


def signature(n: int) -> dict[str, str]:
    """A signature of its own for each n (so that no build finds another's launcher in the cache)."""
    return {f"a{i}": TYPES[(n >> (3 * i)) % len(TYPES)] if i < 4 else "i32" for i in range(6 + n % 5)}


def main() -> int:
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    import triton

    from triton_ctx_tune.runtime.compat import _launcher_builder, prime_compiler_hash

    print(f"triton {triton.__version__}, {os.cpu_count()} cores", flush=True)
    began = time.perf_counter()
    prime_compiler_hash()
    print(f"prime_compiler_hash {time.perf_counter() - began:.3f} s", flush=True)
    build = _launcher_builder()
    if build is None:
        print("this Triton builds no launcher per signature")
        return 0
    for label, load in (("idle", 0), ("loaded", 32)):
        busy = [subprocess.Popen(["nice", "-n", "5", sys.executable, "-c", "while True: pass"]) for _ in range(load)]
        try:
            time.sleep(0.5)
            for n in range(4):
                began = time.perf_counter()
                build(signature(n * 7 + (100 if load else 1)))
                print(f"{label}: launcher {n} built in {time.perf_counter() - began:.3f} s", flush=True)
        finally:
            for p in busy:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
