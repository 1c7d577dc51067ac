"""The zoo's cases, in one table: real libraries' @triton.autotune kernels, each with inputs like its own tests.

A case names its library, the pip requirement (the `zoo` extra; FLA and CCE: the `clients` extra), the module
prefixes its Autotuners are defined under, and a builder. The builder makes this rank's inputs and the reference
before anything is timed, and returns the call (the op on those inputs) and the rule of the library's own tests
(checks.Tolerance). Every rank builds the same inputs (one seed), so every rank's output is the same op's.

Shapes are modest, so that both arms at 1 and 2 ranks fit in a few minutes on H100s. `default=False` cases run
only when named (`--cases`): a large config space or a long step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from checks import Tolerance

from common import Context

FLAG_GEMS = "flag-gems==5.0.2"
GEMLITE = "gemlite==0.6.0.post2"
TORCHAO = "torchao==0.18.0"
FLA = "fla-core==0.6.0"
CCE = "cut-cross-entropy==25.1.1"

# flag_gems.testing.RESOLUTION: its tests' rtol per dtype; atol is 1e-4 times the reduced length (reduce_dim).
_GEMS_RTOL = {torch.float16: 1e-3, torch.float32: 1.3e-6, torch.bfloat16: 0.016}


@dataclass
class Built:
    call: Callable[[], Any]  # the op on this rank's inputs; returns a tensor or a tuple of tensors
    reference: Any  # the output the library's tests compare against (float64 where they upcast), same structure
    tolerance: Tolerance
    shapes: dict[str, Any]
    # This rank's error ratio of an output (<= 1 passes). Default: tolerance.ratio(out, reference). Clients also
    # check their gradients; theirs is a collective (the worst over ranks), called by every rank alike.
    check: Callable[[Any], float] | None = None


@dataclass(frozen=True)
class Case:
    name: str  # "<library>.<op>"
    library: str  # import name; a case whose library is missing is skipped by name
    requirement: str
    modules: tuple[str, ...]  # module prefixes of its Autotuners (the per-key record reads their .cache)
    build: Callable[[Context], Built]
    summary: str
    needs_cuda: bool = True
    default: bool = True


def _gems_tol(dtype: torch.dtype, reduce_dim: int = 1, exact: bool = False) -> Tolerance:
    if exact:
        return Tolerance("allclose", 0.0, 0.0, "flag_gems.testing.assert_equal")
    return Tolerance("allclose", 1e-4 * reduce_dim, _GEMS_RTOL[dtype],
                     f"flag_gems.testing.assert_close({dtype}, reduce_dim={reduce_dim})")


def _randn(ctx: Context, *shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape, generator=ctx.generator(), device=ctx.device).to(dtype)


def _f64(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.double() for t in ts]


# ---- flag_gems (FlagGems 5.0.2): tests compare against torch on float64-upcast inputs -------------------------

def _gems_mm(M: int, N: int, K: int) -> Callable[[Context], Built]:
    def build(ctx: Context) -> Built:
        import flag_gems

        a, b = _randn(ctx, M, K), _randn(ctx, K, N)
        ra, rb = _f64(a, b)
        return Built(lambda: flag_gems.mm(a, b), ra @ rb, _gems_tol(torch.float16, K), {"M": M, "N": N, "K": K})
    return build


def _gems_bmm(ctx: Context) -> Built:
    import flag_gems

    B, M, N, K = 4, 256, 384, 192
    a, b = _randn(ctx, B, M, K), _randn(ctx, B, K, N)
    ra, rb = _f64(a, b)
    return Built(lambda: flag_gems.bmm(a, b), torch.bmm(ra, rb), _gems_tol(torch.float16, K),
                 {"B": B, "M": M, "N": N, "K": K})


def _gems_addmm(ctx: Context) -> Built:
    import flag_gems

    M, N, K = 512, 384, 256
    bias, a, b = _randn(ctx, N), _randn(ctx, M, K), _randn(ctx, K, N)
    rbias, ra, rb = _f64(bias, a, b)
    return Built(lambda: flag_gems.addmm(bias, a, b), torch.addmm(rbias, ra, rb), _gems_tol(torch.float16, K),
                 {"M": M, "N": N, "K": K})


def _gems_softmax(ctx: Context) -> Built:
    # The forward kernels are heuristics-only; the backward ones (inner: reduction over the last dim) autotune.
    import flag_gems

    M, N = 1024, 1000
    x, dy = _randn(ctx, M, N, dtype=torch.float32), _randn(ctx, M, N, dtype=torch.float32)
    rx, rdy = _f64(x, dy)
    y_ref = torch.softmax(rx, -1)
    dx_ref = y_ref * (rdy - (rdy * y_ref).sum(-1, keepdim=True))

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        y = flag_gems.softmax(x, -1, False)
        return y, flag_gems.softmax_backward(dy, y, -1, x.dtype)
    return Built(call, (y_ref, dx_ref), _gems_tol(torch.float32), {"M": M, "N": N, "dtype": "float32"})


def _gems_layer_norm(ctx: Context) -> Built:
    # N > 4096: layer_norm_loop_kernel (TILE_N x warps autotuned).
    import flag_gems

    M, N = 1024, 5120
    x, w, b = _randn(ctx, M, N), _randn(ctx, N), _randn(ctx, N)
    rx, rw, rb = _f64(x, w, b)
    ref = torch.layer_norm(rx, [N], rw, rb, 1e-5)
    return Built(lambda: flag_gems.layer_norm(x, [N], w, b, 1e-5)[0], ref, _gems_tol(torch.float16),
                 {"M": M, "N": N})


def _gems_rms_norm(ctx: Context) -> Built:
    # N > 4096: rms_norm_loop_kernel (autotuned, key N).
    import flag_gems

    M, N = 1024, 8192
    x, w = _randn(ctx, M, N), _randn(ctx, N)
    rx, rw = _f64(x, w)
    ref = rx * torch.rsqrt(rx.pow(2).mean(-1, keepdim=True) + 1e-5) * rw
    return Built(lambda: flag_gems.rms_norm(x, [N], w, 1e-5), ref, _gems_tol(torch.float16), {"M": M, "N": N})


def _gems_reduce(op: str) -> Callable[[Context], Built]:
    """sum/mean over two dims (one dim takes a heuristics-only kernel) and amax over one: LibTuner kernels."""
    def build(ctx: Context) -> Built:
        import flag_gems

        if op == "amax":
            x = _randn(ctx, 4096, 256, dtype=torch.float32)
            return Built(lambda: flag_gems.amax(x, [1]), torch.amax(x.double(), [1]), _gems_tol(torch.float32),
                         {"shape": [4096, 256], "dim": [1]})
        x = _randn(ctx, 200, 64, 96, dtype=torch.float32)
        # Its tests scale atol by the reduced length for sum, not for mean.
        fn, ref, reduce_dim = {"sum": (flag_gems.sum_dim, torch.sum, 64 * 96),
                               "mean": (flag_gems.mean_dim, torch.mean, 1)}[op]
        return Built(lambda: fn(x, [1, 2]), ref(x.double(), [1, 2]), _gems_tol(torch.float32, reduce_dim),
                     {"shape": [200, 64, 96], "dim": [1, 2]})
    return build


def _gems_argmin(ctx: Context) -> Built:
    # M % 8 == 0, N % 64 == 0, K % 32 == 0: argmin_split_K_kernel_merged (autotuned over the split-K space).
    import flag_gems

    x = _randn(ctx, 64, 128, 64, dtype=torch.float32)
    return Built(lambda: flag_gems.argmin(x, 1), torch.argmin(x, 1), _gems_tol(torch.float32, exact=True),
                 {"shape": [64, 128, 64], "dim": 1})


def _gems_var_mean(ctx: Context) -> Built:
    import flag_gems

    x = _randn(ctx, 1024, 2048, dtype=torch.float32)
    var, mean = torch.var_mean(x.double(), [1], correction=1)
    return Built(lambda: flag_gems.var_mean(x, [1], correction=1), (var, mean), _gems_tol(torch.float32),
                 {"shape": [1024, 2048], "dim": [1]})


def _gems_vector_norm(ctx: Context) -> Built:
    import flag_gems

    x = _randn(ctx, 1024, 2048, dtype=torch.float32)
    ref = torch.linalg.vector_norm(x.double(), 2, [1])
    return Built(lambda: flag_gems.vector_norm(x, 2, [1]), ref, _gems_tol(torch.float32),
                 {"shape": [1024, 2048], "ord": 2, "dim": [1]})


def _gems_cross_entropy(ctx: Context) -> Built:
    import flag_gems

    N, C = 1024, 4096
    x = _randn(ctx, N, C, dtype=torch.float32)
    target = torch.randint(0, C, (N,), generator=ctx.generator(), device=ctx.device)
    ref = torch.nn.functional.cross_entropy(x.double(), target)
    return Built(lambda: flag_gems.cross_entropy_loss(x, target), ref, _gems_tol(torch.float32, C),
                 {"N": N, "C": C, "reduction": "mean"})


# ---- gemlite 0.6.0.post2: A16W4 asymmetric, group 128, as tests/test_gemlitelineartriton.py -------------------

def _gemlite(matmul_type: str, batch: int) -> Callable[[Context], Built]:
    def build(ctx: Context) -> Built:
        from gemlite.core import DType, GemLiteLinearTriton

        # gemlite loads its shipped per-GPU tuned configs at import (configs/h100.json...), and its pruner then
        # returns that one config per key: dropped, so that both arms tune, as FLA_CACHE_MODE=disabled does for FLA.
        GemLiteLinearTriton.reset_config()
        in_features, out_features, nbits, group = 4096, 2048, 4, 128
        gen, dev = ctx.generator(), ctx.device
        w_q = torch.randint(0, 2 ** nbits - 1, (out_features, in_features), generator=gen, device=dev).to(torch.uint8)
        groups = w_q.numel() // group
        scales = torch.full((groups, 1), 1e-3, dtype=torch.float16, device=dev)
        zeros = torch.full((groups, 1), 7.0, dtype=torch.float16, device=dev)
        w = ((w_q.reshape(-1, group).double() - zeros.double()) * scales.double()).reshape(out_features, in_features)
        layer = GemLiteLinearTriton(nbits, group_size=group, in_features=in_features, out_features=out_features,
                                    input_dtype=DType.FP16, output_dtype=DType.FP16)
        layer.pack(w_q, scales, zeros, None)
        x = torch.randn(batch, in_features, generator=gen, device=dev).half() / 10
        return Built(lambda: layer.forward_manual(x, matmul_type=matmul_type), x.double() @ w.T,
                     Tolerance("mean_abs", atol=1e-3, source="gemlite tests: mean |y - y_ref| < 1e-3"),
                     {"batch": batch, "in": in_features, "out": out_features, "W_nbits": nbits, "group_size": group,
                      "matmul_type": matmul_type})
    return build


# ---- torchao 0.18.0: the INT8 training matmul (prototype/quantized_training/int8_mm.py) ------------------------

def _torchao_int8_mm(ctx: Context) -> Built:
    from torchao.prototype.quantized_training.int8_mm import scaled_int8_mm

    M, N, K = 512, 1024, 768
    gen, dev = ctx.generator(), ctx.device
    a = torch.randint(-128, 127, (M, K), generator=gen, device=dev, dtype=torch.int8)
    b = torch.randint(-128, 127, (N, K), generator=gen, device=dev, dtype=torch.int8).T  # column-major, as Linear
    row = torch.rand(M, generator=gen, device=dev).bfloat16()
    col = torch.rand(N, generator=gen, device=dev).bfloat16()
    ref = (a.double() @ b.double()) * row.double()[:, None] * col.double()[None, :]
    # torch.testing.assert_close's defaults for a bfloat16 result (rtol 1.6e-2, atol 1e-5)
    return Built(lambda: scaled_int8_mm(a, b, row, col), ref,
                 Tolerance("allclose", 1e-5, 1.6e-2, "torch.testing.assert_close defaults (bfloat16)"),
                 {"M": M, "N": N, "K": K})


# ---- this repository's kernel: a persistent TMA-descriptor matmul (kernels/tma_matmul.py) ---------------------

def tma_shapes(interpreted: bool) -> tuple[int, int, int]:
    return (96, 80, 64) if interpreted else (2048, 2048, 1024)


def _tma(accumulate: bool) -> Callable[[Context], Built]:
    def build(ctx: Context) -> Built:
        from kernels.tma_matmul import tma_matmul, tma_matmul_acc_

        from benchlib import interpreting

        M, N, K = tma_shapes(interpreting())
        a, b, c0 = _randn(ctx, M, K), _randn(ctx, N, K), _randn(ctx, M, N)
        ref = a.double() @ b.double().T
        tol = Tolerance("allclose", 1e-4 * K, 1e-3, "this repository: float16 output, atol 1e-4 x K, rtol 1e-3")
        shapes = {"M": M, "N": N, "K": K, "in_place": accumulate}
        if accumulate:
            c = c0.clone()
            # C is older than the call: exactly-once undoes the tuning executions' C += A @ B^T, so the call's
            # result is c0 + A @ B^T; a second call adds once more (checked against the first call's output).
            return Built(lambda: tma_matmul_acc_(c, a, b).clone(), c0.double() + ref, tol, shapes)
        return Built(lambda: tma_matmul(a, b), ref, tol, shapes)
    return build


# ---- FLA and CCE: the real-client suite's training steps (benchmarks/clients), reused as they are -------------

def _client(module: str) -> Callable[[Context], Built]:
    def build(ctx: Context) -> Built:
        import importlib

        from common import errors

        work = importlib.import_module(module).SPEC.build(ctx)
        return Built(work.step, work.ref_out,
                     Tolerance("rel_fro", rtol=work.tolerance, source="benchmarks/clients: float32 autograd reference"),
                     work.shapes, check=lambda out: errors(ctx.ranks, work, out)["worst"] / work.tolerance)
    return build


_GEMS = ("flag_gems",)
CASES: list[Case] = [
    Case("flag_gems.mm", "flag_gems", FLAG_GEMS, _GEMS, _gems_mm(495, 5333, 71),
         "mm fp16 (495x71 @ 71x5333, a shape of its tests; N % 8 != 0: the non-TMA kernel), LibTuner"),
    Case("flag_gems.mm_tma", "flag_gems", FLAG_GEMS, _GEMS, _gems_mm(512, 1024, 1024),
         "mm fp16 on Hopper: host-TMA kernel, config pre_hook sets descriptor block shapes, ~200 configs",
         default=False),
    Case("flag_gems.bmm", "flag_gems", FLAG_GEMS, _GEMS, _gems_bmm, "bmm fp16, LibTuner + heuristics"),
    Case("flag_gems.addmm", "flag_gems", FLAG_GEMS, _GEMS, _gems_addmm, "addmm fp16, LibTuner"),
    Case("flag_gems.softmax", "flag_gems", FLAG_GEMS, _GEMS, _gems_softmax,
         "softmax forward + backward fp32 (backward autotuned, triton.autotune + heuristics)"),
    Case("flag_gems.layer_norm", "flag_gems", FLAG_GEMS, _GEMS, _gems_layer_norm,
         "layer_norm fp16, N=5120 (loop kernel), triton.autotune"),
    Case("flag_gems.rms_norm", "flag_gems", FLAG_GEMS, _GEMS, _gems_rms_norm,
         "rms_norm fp16, N=8192 (loop kernel), triton.autotune"),
    Case("flag_gems.sum_dim", "flag_gems", FLAG_GEMS, _GEMS, _gems_reduce("sum"), "sum over dims [1, 2], LibTuner"),
    Case("flag_gems.mean_dim", "flag_gems", FLAG_GEMS, _GEMS, _gems_reduce("mean"),
         "mean over dims [1, 2], LibTuner"),
    Case("flag_gems.amax", "flag_gems", FLAG_GEMS, _GEMS, _gems_reduce("amax"), "amax over dim [1], LibTuner"),
    Case("flag_gems.argmin", "flag_gems", FLAG_GEMS, _GEMS, _gems_argmin,
         "argmin dim 1 (split-K kernel), triton.autotune + heuristics"),
    Case("flag_gems.var_mean", "flag_gems", FLAG_GEMS, _GEMS, _gems_var_mean, "var_mean dim [1], triton.autotune"),
    Case("flag_gems.vector_norm", "flag_gems", FLAG_GEMS, _GEMS, _gems_vector_norm,
         "vector_norm ord 2 dim [1], triton.autotune"),
    Case("flag_gems.cross_entropy", "flag_gems", FLAG_GEMS, _GEMS, _gems_cross_entropy,
         "cross_entropy_loss forward (class indices, mean), triton.autotune"),
    Case("gemlite.gemm", "gemlite", GEMLITE, ("gemlite",), _gemlite("GEMM", 4),
         "A16W4 GEMM, batch 4, early_config_prune"),
    Case("gemlite.gemm_splitk", "gemlite", GEMLITE, ("gemlite",), _gemlite("GEMM_SPLITK", 4),
         "A16W4 split-K GEMM, batch 4, early_config_prune, config pre_hook zeroes C when SPLIT_K > 1"),
    Case("gemlite.gemv_revsplitk", "gemlite", GEMLITE, ("gemlite",), _gemlite("GEMV_REVSPLITK", 1),
         "A16W4 reversed split-K GEMV, batch 1, early_config_prune"),
    Case("torchao.scaled_int8_mm", "torchao", TORCHAO, ("torchao",), _torchao_int8_mm,
         "INT8 x INT8 -> bf16 with row and column scales (27 configs, triton.autotune + heuristics)"),
    Case("zoo.tma_matmul", "triton", "triton (this repository's kernel)", ("kernels.tma_matmul",), _tma(False),
         "persistent matmul on host TensorDescriptors, config pre_hook sets block_shape", needs_cuda=False),
    Case("zoo.tma_matmul_acc", "triton", "triton (this repository's kernel)", ("kernels.tma_matmul",), _tma(True),
         "in-place C += A @ B^T on TensorDescriptors, restore_value=['C']", needs_cuda=False),
    Case("fla.norms", "fla", FLA, ("fla",), _client("client_fla_norms"),
         "FLA layer_norm + rms_norm step with backward (benchmarks/clients fla_norms)"),
    Case("cce.linear_cross_entropy", "cut_cross_entropy", CCE, ("cut_cross_entropy",), _client("client_cce"),
         "CCE loss step with backward, CCE_AUTOTUNE=1 (benchmarks/clients cce)"),
    Case("fla.simple_gla", "fla", FLA, ("fla",), _client("client_fla_simple_gla"),
         "FLA chunk_simple_gla step with backward (benchmarks/clients fla_simple_gla)", default=False),
]
BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "case names are unique"


def select(names: str) -> list[Case]:
    """'default', 'all', or comma-separated case names or library prefixes ('flag_gems', 'zoo.tma_matmul')."""
    if names == "default":
        return [c for c in CASES if c.default]
    if names == "all":
        return list(CASES)
    chosen: list[Case] = []
    for name in (n for n in names.split(",") if n):
        found = [c for c in CASES if c.name == name or c.name.startswith(name + ".")]
        if not found:
            raise ValueError(f"unknown case {name!r}; cases: {', '.join(BY_NAME)}")
        chosen += [c for c in found if c not in chosen]
    return chosen
