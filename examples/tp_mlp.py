"""A tensor-parallel MLP block, y = gelu_tanh(x @ w1) @ w2, tuned as one unit with contextual_autotune.

Run it with ./launch examples/tp_mlp.py (2 gloo ranks on CPU through the Triton interpreter, or one
rank per GPU with NCCL). w1 is split by columns and w2 by rows, so each rank computes a partial y and
an all-reduce sums them: the Megatron-style MLP. The two GEMMs use the same Triton kernel with
different (M, N, K) keys, and the in-place GELU runs between them; every rank tunes every key on the
function's real data, and the ranks agree on one winner per key.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from mlp_kernels import EXAMPLE_SIZE, gelu_, matmul, rel_err, torch_reference
from triton_ctx_tune import CallStats, contextual_autotune

# (M tokens, H hidden, I intermediate) per device. On CPU, I=96 rather than 128 so that I/world never
# equals H: with 2 ranks and I=128 both GEMMs would be 32x64x64 and share one key.
DEFAULT_SHAPES = {"cpu": (32, 64, 96), "cuda": (4096, 4096, 14336)}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@contextual_autotune(is_dist=True)
def tp_mlp(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    # Buffers are made inside the function: each tuning execution starts from fresh ones, so the
    # in-place GELU never sees its own output.
    h = torch.empty(x.shape[0], w1_shard.shape[1], dtype=x.dtype, device=x.device)
    matmul(x, w1_shard, h)
    gelu_(h)
    y = torch.empty(x.shape[0], w2_shard.shape[1], dtype=x.dtype, device=x.device)
    matmul(h, w2_shard, y)
    dist.all_reduce(y)
    return y


def pick_device() -> torch.device:
    wanted = os.environ.get("TRITON_CTX_TUNE_DEVICE", "auto")
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available() and not interpreting):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def parse_args(device: torch.device) -> argparse.Namespace:
    m, h, i = DEFAULT_SHAPES[device.type]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--M", type=int, default=m, help=f"tokens (default {m})")
    p.add_argument("--H", type=int, default=h, help=f"hidden size (default {h})")
    p.add_argument("--I", type=int, default=i, help=f"intermediate size, split over ranks (default {i})")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def make_weights(args: argparse.Namespace, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The full x, w1, w2, identical on every rank (one seed), scaled so activations stay O(1)."""
    gen = torch.Generator(device).manual_seed(args.seed)
    x = torch.randn(args.M, args.H, generator=gen, device=device)
    w1 = torch.randn(args.H, args.I, generator=gen, device=device) / args.H ** 0.5
    w2 = torch.randn(args.I, args.H, generator=gen, device=device) / args.I ** 0.5
    return x.to(dtype), w1.to(dtype), w2.to(dtype)


def describe(stats: CallStats) -> list[str]:
    return [f"  {t.kernel} key={t.key!r} -> {{{t.config}}}  {t.ms:.4f} ms ({t.configs} configs, {t.failed} failed)"
            for t in stats.tuned]


def main() -> int:
    device = pick_device()
    args = parse_args(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = os.environ.get("TRITON_CTX_TUNE_BACKEND") or ("nccl" if device.type == "cuda" else "gloo")
    # device_id: NCCL sets up its communicator here, in the program's set-up, not in the first all-reduce
    # (inside the first, tuning, call).
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    try:
        return run(args, device, backend)
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace, device: torch.device, backend: str) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.I % world:
        raise SystemExit(f"--I {args.I} does not split over {world} ranks; pick a multiple of {world}")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x, w1, w2 = make_weights(args, dtype, device)
    cols = slice(rank * args.I // world, (rank + 1) * args.I // world)
    w1_shard, w2_shard = w1[:, cols].contiguous(), w2[cols, :].contiguous()

    y1 = tp_mlp(x, w1_shard, w2_shard)
    first = tp_mlp.last_call
    y2 = tp_mlp(x, w1_shard, w2_shard)
    second = tp_mlp.last_call
    assert first is not None and second is not None

    # Every rank checks its own copy of y; the worst numbers across ranks decide, so all ranks agree.
    worst = torch.tensor([rel_err(y1, torch_reference(x, w1, w2)), rel_err(y2, y1),
                          float(not torch.equal(y1, y2)), float(second.executions != 1)], device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    err, drift, differs, reexecuted = worst.tolist()
    tol = TOLERANCE[dtype]
    ok = [err < tol, drift < tol, not reexecuted]

    if rank == 0:
        dt = str(dtype).removeprefix("torch.")
        log_dir = os.environ.get("TRITON_CTX_TUNE_LOG_DIR") or ".autotune_logs"
        verdict = ["FAIL", "ok"]
        print(f"tp_mlp: world={world} backend={backend} device={device.type} dtype={dt} configs={EXAMPLE_SIZE} "
              f"M={args.M} H={args.H} I={args.I} (I/rank={args.I // world})")
        print(f"first call : {first.executions} executions ({len(first.tuned)} keys tuned in {first.wall_s:.2f} s, "
              f"{first.cache_hits} from the tuning cache)")
        print("\n".join(describe(first)))
        print(f"check      : rel err vs torch_reference (float32, full weights) = {err:.2e} "
              f"(< {tol:g}) {verdict[ok[0]]}")
        print(f"second call: {second.executions} execution(s) {verdict[ok[2]]}; rel diff to first call = "
              f"{drift:.2e} ({'bitwise different' if differs else 'bitwise identical'}) {verdict[ok[1]]}")
        print("logs       : " + ", ".join(f"{log_dir}/rank-{r}.log" for r in range(world)))
        print("PASS" if all(ok) else "FAIL")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
