"""The benchmarked ops, on the kernels of examples/mlp_kernels.py.

  mlp    : h = x @ w1_shard; gelu_(h); y = h @ w2_shard; all_reduce(y)   (the TP MLP of examples/tp_mlp.py)
  single : h = x @ w1_shard; gelu_(h); all_reduce(h)                      (each kernel called once)

w1 is split by columns, w2 by rows: each rank holds I/world intermediate columns. In `single` every rank's
[M, I/world] activation is summed by the all-reduce, so its reference is sum over ranks of gelu(x @ w1_shard_r).

An op runs on a KernelSet: fresh copies of the examples' two @triton.autotune kernels (same Python source,
same configs and keys, new JITFunction and Autotuner objects, so their compile and tuning caches start empty).
Each op can be called three ways:
  op()              launches go through Autotuner.run: plain Triton (vanilla autotune, each rank alone), or,
                    inside a contextual_autotune-decorated function, the contextual tuner;
  op(fixed=picks)   bypasses autotuning: the Autotuner's inner kernel (`autotuner.fn`, a JITFunction or a
                    Heuristics) is launched with the explicit meta-parameters of picks[role].
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import triton
from triton.runtime.autotuner import Autotuner, Config, Heuristics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import benchlib  # noqa: E402
import mlp_kernels  # noqa: E402  (examples/ is not a package: its modules import each other by name)

VARIANTS = ("mlp", "single")
ROLES = {"mlp": ("gemm1", "gelu", "gemm2"), "single": ("gemm1", "gelu")}
_MATMUL_ARGS = ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn",
                "stride_cm", "stride_cn"]
_GELU_ARGS = ["x_ptr", "n_elements"]


def _fresh_kernel(fn: Any) -> Any:
    """A new jitted object for the same Python source (Heuristics layers rebuilt around it)."""
    if isinstance(fn, Heuristics):
        return triton.heuristics(fn.values)(_fresh_kernel(fn.fn))
    return triton.jit(fn.fn)


def fresh_autotuner(at: Autotuner, do_bench: Callable[..., Any] | None = None) -> Autotuner:
    kwargs: dict[str, Any] = {"do_bench": do_bench} if do_bench is not None else {}
    return triton.autotune(configs=list(at.configs), key=list(at.keys), **kwargs)(_fresh_kernel(at.fn))


@dataclass
class KernelSet:
    """One matmul and one GELU Autotuner, with their own caches."""
    label: str
    matmul: Autotuner
    gelu: Autotuner

    @classmethod
    def fresh(cls, label: str, do_bench: Callable[..., Any] | None = None) -> KernelSet:
        for at, names in ((mlp_kernels.matmul_kernel, _MATMUL_ARGS), (mlp_kernels.gelu_inplace_kernel, _GELU_ARGS)):
            if list(at.arg_names)[:len(names)] != names:
                raise RuntimeError(f"examples/mlp_kernels.py: {at.base_fn.__name__} now takes {at.arg_names}; "
                                   f"benchmarks/mlp_ops.py launches it with {names}. Update the launchers.")
        return cls(label, fresh_autotuner(mlp_kernels.matmul_kernel, do_bench),
                   fresh_autotuner(mlp_kernels.gelu_inplace_kernel, do_bench))

    def autotuners(self) -> dict[str, Autotuner]:
        return {"matmul": self.matmul, "gelu": self.gelu}

    def clear_caches(self) -> None:
        """Forget every tuning result (the compiled kernels stay): the next call tunes again."""
        for at in self.autotuners().values():
            at.cache.clear()

    def for_role(self, role: str) -> Autotuner:
        return self.gelu if role == "gelu" else self.matmul


def launch(at: Autotuner, grid: Callable[[dict], tuple], args: tuple, config: Config | None) -> None:
    if config is None:
        at[grid](*args)
        return
    meta = config.all_kwargs()
    if config.pre_hook:
        config.pre_hook({**dict(zip(at.arg_names, args)), **meta})
    # at.fn, not the innermost JITFunction: a Heuristics layer must still add its values.
    at.fn[grid](*args, **meta)


def matmul_args(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> tuple:
    M, K = a.shape
    N = b.shape[1]
    return (a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))


def matmul(ks: KernelSet, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Config | None = None) -> None:
    M, N = out.shape
    launch(ks.matmul, lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),),
           matmul_args(a, b, out), config)


def gelu_(ks: KernelSet, x: torch.Tensor, config: Config | None = None) -> None:
    n = x.numel()
    launch(ks.gelu, lambda m: (triton.cdiv(n, m["BLOCK"]),), (x, n), config)


def probe_parser(doc: str | None, configs: str) -> argparse.ArgumentParser:
    """The arguments regime_probe.py and tuner_regime.py share: the op's shapes, GELU's candidates (`configs`,
    indices into its config list) and the GEMMs' config."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--M", type=int, default=4096)
    p.add_argument("--H", type=int, default=4096)
    p.add_argument("--I", type=int, default=14336, help="intermediate size, split over ranks (default 14336)")
    p.add_argument("--configs", default=configs, help=f"GELU config indices (default {configs})")
    p.add_argument("--gemm", type=int, default=13, help="the GEMMs' config index (default 13, the tuner's pick)")
    return p


def triton_key(at: Autotuner, args: tuple) -> tuple:
    """The key Autotuner.run files a launch of args under: the key arguments, then every tensor's dtype."""
    named = dict(zip(at.arg_names, args))
    key = [named[k] for k in at.keys if k in named]
    return tuple(key + [str(v.dtype) for v in named.values() if hasattr(v, "dtype")])


class Op:
    """One variant on one rank's shards; scratch buffers for per-kernel benchmarks are made on demand."""

    def __init__(self, variant: str, ks: KernelSet, x: torch.Tensor, w1s: torch.Tensor, w2s: torch.Tensor) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r}: expected one of {VARIANTS}")
        self.variant, self.ks, self.x, self.w1s, self.w2s = variant, ks, x, w1s, w2s
        self.roles = ROLES[variant]
        self._scratch: dict[str, torch.Tensor] | None = None

    def __call__(self, fixed: dict[str, Config] | None = None,
                 probe: Callable[[str, bool], None] | None = None) -> torch.Tensor:
        """probe(role, before), when given, is called just before and just after each role's launch (the in-op
        oracle records its events there)."""
        f = fixed or {}
        mark = probe or (lambda role, before: None)
        x = self.x
        h = torch.empty(x.shape[0], self.w1s.shape[1], dtype=x.dtype, device=x.device)
        mark("gemm1", True)
        matmul(self.ks, x, self.w1s, h, f.get("gemm1"))
        mark("gemm1", False)
        mark("gelu", True)
        gelu_(self.ks, h, f.get("gelu"))
        mark("gelu", False)
        if self.variant == "single":
            dist.all_reduce(h)
            return h
        y = torch.empty(x.shape[0], self.w2s.shape[1], dtype=x.dtype, device=x.device)
        mark("gemm2", True)
        matmul(self.ks, h, self.w2s, y, f.get("gemm2"))
        mark("gemm2", False)
        dist.all_reduce(y)
        return y

    def role_ms(self, ranks: Any, role: str, fixed: dict[str, Config], iters: int,
                before: Callable[[], None] | None = None, before_call: Callable[[], None] | None = None,
                after: Callable[[], None] | None = None) -> float:
        """Median ms of `role`'s launch inside the op, over `iters` whole-op calls with L2 flushed before each (the
        same number on every rank: the op holds collectives). `before()` runs just ahead of the role's start event,
        `after()` just after its end event, `before_call()` ahead of each op call (regime_probe.py's sleeps,
        flushes, idle host time and clock readings). CUDA events on a GPU, the host clock under the interpreter."""
        self(fixed=fixed)  # warm-up: this config's first launch in the op
        ranks.barrier()
        spans: list[Any] = []

        def probe(at_role: str, starting: bool) -> None:
            if at_role != role:
                return
            if starting and before is not None:
                before()
            if ranks.cuda:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                spans.append(e)
            else:
                spans.append(time.perf_counter())
            if not starting and after is not None:
                after()

        for _ in range(iters):
            if before_call is not None:
                before_call()
            if ranks.cuda:
                benchlib.flush_l2()
            self(fixed=fixed, probe=probe)
        if ranks.cuda:
            torch.cuda.synchronize()
            return benchlib.median([a.elapsed_time(b) for a, b in zip(spans[::2], spans[1::2])])
        return benchlib.median([(b - a) * 1e3 for a, b in zip(spans[::2], spans[1::2])])

    # ---- per-kernel views (for the exhaustive benchmark and for reading the tuned picks) --------

    def scratch(self) -> dict[str, torch.Tensor]:
        if self._scratch is None:
            x = self.x
            h = torch.empty(x.shape[0], self.w1s.shape[1], dtype=x.dtype, device=x.device)
            matmul(self.ks, x, self.w1s, h, self.ks.matmul.configs[0])
            act = h.clone()
            gelu_(self.ks, act, self.ks.gelu.configs[0])
            self._scratch = {"h": h, "gelu_in": h.clone(), "act": act,
                             "y": torch.empty(x.shape[0], self.w2s.shape[1], dtype=x.dtype, device=x.device)}
        return self._scratch

    def role_args(self, role: str) -> tuple:
        s = self.scratch()
        if role == "gemm1":
            return matmul_args(self.x, self.w1s, s["h"])
        if role == "gemm2":
            return matmul_args(s["act"], self.w2s, s["y"])
        return (s["gelu_in"], s["gelu_in"].numel())

    def role_call(self, role: str, config: Config) -> Callable[[], None]:
        """One fixed-config launch of a role's kernel on scratch buffers (GELU works in place on its own copy)."""
        s = self.scratch()
        if role == "gemm1":
            return lambda: matmul(self.ks, self.x, self.w1s, s["h"], config)
        if role == "gemm2":
            return lambda: matmul(self.ks, s["act"], self.w2s, s["y"], config)
        return lambda: gelu_(self.ks, s["gelu_in"], config)

    def role_key(self, role: str) -> tuple:
        return triton_key(self.ks.for_role(role), self.role_args(role))

    def picks(self) -> dict[str, Config]:
        """The config each role's key is cached with (after tuning); missing roles are left out."""
        out = {}
        for role in self.roles:
            at = self.ks.for_role(role)
            cfg = at.cache.get(self.role_key(role))
            if cfg is not None:
                out[role] = cfg
        return out


def config_index(at: Autotuner, config: Config) -> int:
    for i, c in enumerate(at.configs):
        if c is config:
            return i
    s = config_text(config)
    for i, c in enumerate(at.configs):
        if config_text(c) == s:
            return i
    return -1


def config_text(config: Config) -> str:
    parts = [f"{k}={v}" for k, v in config.kwargs.items()]
    parts += [f"{k}={v}" for k, v in config.all_kwargs().items() if k not in config.kwargs and v is not None
              and not (k == "num_ctas" and v == 1)]
    return ", ".join(parts)


def named_default(at: Autotuner, kind: str) -> tuple[int, Config]:
    """A sensible hand-picked default: a 128x128x64 GEMM tile with 4 warps (3 stages in the example's space),
    GELU BLOCK=1024 with 4 warps; config 0 where the space has no such config."""
    want = ({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64} if kind == "matmul" else {"BLOCK": 1024})
    warps = 4
    for i, c in enumerate(at.configs):
        if all(c.kwargs.get(k) == v for k, v in want.items()) and c.num_warps == warps:
            return i, c
    return 0, at.configs[0]


def make_inputs(M: int, H: int, I: int, seed: int, dtype: torch.dtype, device: torch.device, rank: int, world: int,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The full x, w1, w2 (the same on every rank: one seed, as examples/tp_mlp.py makes them), and this rank's
    shards of w1 (columns) and w2 (rows)."""
    from types import SimpleNamespace

    import tp_mlp  # examples/tp_mlp.py

    x, w1, w2 = tp_mlp.make_weights(SimpleNamespace(M=M, H=H, I=I, seed=seed), dtype, device)
    cols = slice(rank * I // world, (rank + 1) * I // world)
    return x, w1, w2, w1[:, cols].contiguous(), w2[cols, :].contiguous()


def reference(variant: str, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, world: int) -> torch.Tensor:
    """The float32 torch result of the whole op (every rank's shard), computed on this rank."""
    if variant == "mlp":
        return mlp_kernels.torch_reference(x, w1, w2)
    I = w1.shape[1]
    xf = x.float()
    out = None
    for r in range(world):
        part = torch.nn.functional.gelu(xf @ w1[:, r * I // world:(r + 1) * I // world].float(), approximate="tanh")
        out = part if out is None else out + part
    return out


def tolerance(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}.get(dtype, 2e-2)


def example_size() -> str:
    return mlp_kernels.EXAMPLE_SIZE


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off", "no")
