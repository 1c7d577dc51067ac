"""One process of the quarantine tests (test_quarantine.py): tune a kernel whose fastest config kills the process.

With CRASH_BLOCK=32 set, config BLOCK=32 calls os._exit(3) from its pre_hook, inside its slot, as a
device-side assert or an illegal memory access ends a real job; with HANG_BLOCK=32 it never returns, as a
hung kernel (on rank CRASH_RANK only, when started
by torchrun). Prints one JSON line (and, with QUARANTINE_OUT, writes one file per rank) when it survives.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests.kernels import DEVICE, SLOW_MS, add_one_, costly, grid  # noqa: E402
from triton_ctx_tune import contextual_autotune  # noqa: E402


def _hook(block: int, cost_ms: float) -> Any:
    spend = costly(lambda nargs: cost_ms)

    def hook(nargs: dict[str, Any]) -> None:
        if os.environ.get("CRASH_BLOCK") == str(block) and os.environ.get("RANK", "0") == os.environ.get("CRASH_RANK",
                                                                                                         "0"):
            os._exit(3)
        if os.environ.get("HANG_BLOCK") == str(block) and os.environ.get("RANK", "0") == os.environ.get("CRASH_RANK",
                                                                                                        "0"):
            time.sleep(3600)  # a kernel that never finishes
        spend(nargs)
    return hook


# BLOCK 32 is the fastest; 16 and 64 declare costs.
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=4, pre_hook=_hook(b, c)) for b, c in ((16, SLOW_MS), (32, 0.0),
                                                                                         (64, 2 * SLOW_MS))]


# The kernel body of tests/kernels.add_one_ (x += 1), with these configs.
add_one = triton.autotune(configs=CONFIGS, key=["n"])(triton.jit(add_one_.fn.fn))


@triton.jit(debug=True)
def _asserting_add_one(x_ptr, n, BLOCK: tl.constexpr):
    tl.device_assert(BLOCK != 32, "BLOCK=32 trips a device-side assert")
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


# DEVICE_ASSERT=1 (GPU only): BLOCK 32, the fastest, fails a real tl.device_assert, which ends the CUDA context.
asserting_add_one = triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=4, pre_hook=costly(lambda nargs, c=c: c))
             for b, c in ((16, SLOW_MS), (32, 0.0), (64, 2 * SLOW_MS))], key=["n"])(_asserting_add_one)


def main() -> None:
    distributed = "RANK" in os.environ
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        dist.barrier()

    kernel = asserting_add_one if os.environ.get("DEVICE_ASSERT") == "1" else add_one

    @contextual_autotune(is_dist=distributed, n_warmup=1, n_repeat=2, early_stop=False, cache=False)
    def op(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        kernel[grid(h.numel())](h, h.numel())
        return h

    x = torch.arange(64, dtype=torch.float32, device=DEVICE)
    y = op(x)
    rank = int(os.environ.get("RANK", "0"))
    row = json.dumps({"rank": rank, "ok": bool(torch.equal(y, x + 1)), "executions": op.last_call.executions,
                      "chosen": {repr(k): c.kwargs["BLOCK"] for k, c in kernel.cache.items()}})
    print(row, flush=True)
    if os.environ.get("QUARANTINE_OUT"):  # ranks share stdout: one file each
        Path(os.environ["QUARANTINE_OUT"], f"rank{rank}.json").write_text(row)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
