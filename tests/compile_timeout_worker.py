"""One rank of the compile-timeout test, started by torchrun (see test_compile_timeout.py).

With 2 local ranks, precompilation gives config i to local rank i % 2 and each rank then loads
(here: compiles) the other's configs. Rank 1's compile of BLOCK 64 never finishes: in scenario
`own` BLOCK 64 is rank 1's own share (config 1), in `other` it is rank 0's (config 2), so rank 1
meets it only when loading rank 0's binaries. Every rank must skip BLOCK 64 either way.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests.dist_worker import init_group  # noqa: E402
from tests.kernels import DEVICE, SLOW_MS, block_configs, chosen, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402


def _stall_on_rank1(args: dict[str, Any]) -> int:
    # heuristics() runs in the compile worker on the compile-only launch: a compiler that hangs.
    if args.get("warmup") and args["BLOCK"] == 64 and dist.get_rank() == 1:
        time.sleep(3600)  # never released: the process exit ends this thread
    return 0


def _add_one(x_ptr, n, BLOCK: tl.constexpr, STALL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _kernel(blocks: list[int]) -> Any:
    # BLOCK 64 has no sleep and would win; 32 is next.
    configs = block_configs(blocks, slow={16: 2 * SLOW_MS, 32: SLOW_MS})
    return triton.autotune(configs=configs, key=["n"])(triton.heuristics({"STALL": _stall_on_rank1})(
        triton.jit(_add_one)))


KERNELS = {"own": _kernel([16, 64, 32]), "other": _kernel([16, 32, 64])}


def run(name: str) -> dict[str, Any]:
    kernel = KERNELS[name]

    @contextual_autotune(is_dist=True, n_warmup=1, n_repeat=2, early_stop=False, cache=False, compile_timeout_s=1.0)
    def op(x: torch.Tensor):
        h = x.clone()
        kernel[grid(h.numel())](h, h.numel())
        return h

    x = torch.arange(64, dtype=torch.float32, device=DEVICE)
    start = time.monotonic()
    y = op(x)
    return {"ok": bool(torch.equal(y, x + 1)), "blocks": {repr(k): v for k, v in chosen(kernel).items()},
            "executions": op.last_call.executions, "elapsed": time.monotonic() - start}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("scenarios", nargs="+", choices=sorted(KERNELS))
    args = parser.parse_args()
    init_group()
    for name in args.scenarios:
        result = run(name)
        Path(args.out, f"{name}.rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
