"""Can per-launch timings tell a kernel that overlaps another stream's work from one alone? A memory-bound
kernel tuned alone, then while a side stream runs a copy of varying length that overlaps it (a stand-in for
an all-gather on another stream), under objective="auto" (the default: per launch, and end to end for a key
that overlapped another stream's work), "per_launch" and "end_to_end".

    python3 benchmarks/contention_probe.py     (one GPU; prints one JSON line per case)

Per case: the decision's winner, the spread of the fastest config's samples ((q80 - q20) / median), the
reduced times and the executions. RESULTS.md section 16 has what it showed.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from triton_ctx_tune import contextual_autotune  # noqa: E402

N = 1 << 26
CONFIGS = [(1024, 4), (2048, 4), (4096, 8), (8192, 8)]


def _scale(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask) * 2, mask=mask)


def case(name: str, objective: str, contended: bool) -> dict[str, Any]:
    kernel = triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in CONFIGS],
                             key=["n"])(triton.jit(_scale))
    side = torch.cuda.Stream()
    x = torch.randn(N, device="cuda")
    hog_src = torch.randn(1 << 27, device="cuda")
    hog_dst = torch.empty_like(hog_src)
    step = [0]

    def op(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        if contended:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # a copy of 1/8 to all of 512 MB, different each call
                step[0] += 1
                k = (1 << 24) * (1 + (step[0] * 5) % 8)
                hog_dst[:k].copy_(hog_src[:k])
        kernel[lambda m: (triton.cdiv(N, m["BLOCK"]),)](x, y, N)
        torch.cuda.current_stream().wait_stream(side)
        return y

    op.__name__ = op.__qualname__ = f"probe_{name}_{objective}"
    logs = tempfile.mkdtemp(prefix="probe-")
    tuned = contextual_autotune(n_warmup=2, n_repeat=5, objective=objective, log_dir=logs, cache=False, quiet=True)(op)
    tuned(x)
    events = [json.loads(line) for line in (Path(logs) / "rank-0.jsonl").read_text().splitlines()]
    (d,) = [e for e in events if e["event"] == "decision"]
    confirms = [e for e in events if e["event"] == "confirm"]
    return {"case": name, "objective": objective, "winner": CONFIGS[d["winner"]], "spread": d.get("spread"),
            "end_to_end": d["end_to_end"], "confirmed": [c["candidates"] for c in confirms],
            "confirmed_end_to_end": [c["end_to_end"] for c in confirms], "reduced": d["reduced"],
            "executions": tuned.last_call.executions}


def main() -> None:
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "triton": triton.__version__}))
    for name, contended in (("alone", False), ("overlapped", True)):
        for objective in ("auto", "per_launch", "end_to_end"):
            print(json.dumps(case(name, objective, contended)), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_CTX_TUNE_QUIET", "1")
    main()
