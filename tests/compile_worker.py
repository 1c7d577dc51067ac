"""A fresh process for the torch.compile tests (test_gpu_steady.py): cold Inductor and Triton caches.

Prints one JSON line: our tuned function inside a compiled model (errors of the first and second
call, graph breaks, what our tuner decided), then a control in which Inductor owns the same kind
of in-place autotuned launch.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch._dynamo
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_ctx_tune import contextual_autotune  # noqa: E402

N = 1 << 16
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=4) for b in (128, 256, 512, 1024)]


def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


# In place and without restore_value: legal for a contextual tuner, whose function allocates the buffer.
ours_kernel = triton.autotune(configs=CONFIGS, key=["n"])(triton.jit(_add_one))
inductor_kernel = triton.autotune(configs=list(CONFIGS), key=["n"])(triton.jit(_add_one))


@contextual_autotune(cache=False, log_dir=False, quiet=True)
def tuned_add_one(x: torch.Tensor) -> torch.Tensor:
    h = x.clone()
    ours_kernel[lambda m: (triton.cdiv(N, m["BLOCK"]),)](h, N)
    return h


def model(x: torch.Tensor) -> torch.Tensor:
    return tuned_add_one(x * 2) + 1


def control(x: torch.Tensor) -> torch.Tensor:
    h = x * 2
    inductor_kernel[lambda m: (triton.cdiv(N, m["BLOCK"]),)](h, N)
    return h + 1


def main() -> None:
    x = torch.randn(N, device="cuda")
    want = x * 2 + 2
    compiled = torch.compile(model)
    first = compiled(x)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    tuned = [f"{t.kernel} {t.key!r}" for t in tuned_add_one.last_call.tuned]
    executions = tuned_add_one.last_call.executions
    second = compiled(x)
    # Dynamo's counter also counts restarts of one analysis; explain() counts the breaks of the graph.
    explained = torch._dynamo.explain(model)(x)
    result = {"first_err": float((first - want).abs().max()), "second_err": float((second - want).abs().max()),
              "graph_breaks": explained.graph_break_count, "break_counter": breaks,
              "break_reasons": [str(r.reason)[:200] for r in explained.break_reasons],
              "tuned": tuned, "executions": executions,
              "triton_cache": {repr(k): str(v) for k, v in ours_kernel.cache.items()}}
    torch._dynamo.utils.counters.clear()
    got = torch.compile(control)(x)
    result["control_err"] = float((got - want).abs().max())
    result["control_inductor_owned"] = not inductor_kernel.cache  # Triton's Autotuner never ran
    print(json.dumps(result))


if __name__ == "__main__":
    main()
