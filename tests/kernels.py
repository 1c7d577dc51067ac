"""Small real Triton kernels for the tests, plus config hooks that decide which config wins.

A config that must lose carries a pre_hook that declares a cost in milliseconds; the pre_hook is
inside the timed span, exactly as in Triton's own _bench. On the host clock (the interpreter) the
cost is not slept but added to the clock the tuner reads, HOST_COST_SCALE times over: 15 ms measures
1.5 s more and takes no time. The interpreter's own run time and a busy machine's scheduling noise
(milliseconds, a few hundred at worst) can then never reorder configs whose order a test asserts.
With CUDA events the hook sleeps the cost instead: the GPU idles meanwhile, and its kernels vary by
microseconds.
"""
from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

from triton_ctx_tune.runtime.timing import HostTimer, _sleep_cycles_per_second, make_timer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SLOW_MS = 15.0
HOST_COST_SCALE = 100.0

# Per thread: two threads tuning at once must each measure only the costs their own slots declared.
_declared = threading.local()


def _host_clock() -> float:
    return time.perf_counter() + getattr(_declared, "s", 0.0)


# Every process that uses these kernels (pytest, the torchrun workers, subprocesses) measures with it.
HostTimer.clock = staticmethod(_host_clock)


@functools.cache
def _host_timed() -> bool:
    return make_timer(flush_l2=False).kind == "host"


def spend(ms: float) -> None:
    """Make the slot that is running measure `ms` more (HOST_COST_SCALE times that on the host clock).

    On a GPU the cost is GPU work on the current stream (torch.cuda._sleep), which CUDA events see
    wherever the host is: a host sleep would be hidden by an end-to-end step's head start."""
    if _host_timed():
        _declared.s = getattr(_declared, "s", 0.0) + ms * HOST_COST_SCALE / 1e3
    else:
        torch.cuda._sleep(int(ms / 1e3 * _sleep_cycles_per_second()))


def costly(cost_ms: Callable[[dict[str, Any]], float]) -> Callable[[dict[str, Any]], None]:
    """A config pre_hook that spends cost_ms(named arguments)."""
    def hook(nargs: dict[str, Any]) -> None:
        ms = cost_ms(nargs)
        if ms:
            spend(ms)
    return hook


def busy_host(seconds: float) -> Callable[[dict[str, Any]], None]:
    """A config pre_hook that keeps the host busy `seconds` inside the launch (a descriptor's build, argument
    packing), on every clock: unlike costly(), the GPU sees nothing of it unless it waits for the host."""
    def hook(nargs: dict[str, Any]) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    return hook


def block_configs(blocks: list[int], slow: dict[int, float] | None = None) -> list[triton.Config]:
    slow = slow or {}
    return [triton.Config({"BLOCK": b}, num_warps=4,
                          pre_hook=costly(lambda nargs, b=b: slow.get(b, 0.0)) if b in slow else None)
            for b in blocks]


def grid(n: int) -> Callable[[dict[str, Any]], tuple[int]]:
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


# Fastest config depends on n: BLOCK 64 for n >= 100, BLOCK 16 below (the others cost more).
def _by_size(nargs: dict[str, Any], block: int) -> float:
    best = 64 if nargs["n"] >= 100 else 16
    return 0.0 if block == best else SLOW_MS * (1 + (block != 32))


SIZED_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=4, pre_hook=costly(lambda nargs, b=b: _by_size(nargs, b)))
                 for b in (16, 32, 64)]


@triton.autotune(configs=SIZED_CONFIGS, key=["n"])
@triton.jit
def add_one_(x_ptr, n, BLOCK: tl.constexpr):
    """x += 1, in place."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 64: 2 * SLOW_MS}), key=["n"])
@triton.jit
def double_(x_ptr, n, BLOCK: tl.constexpr):
    """x *= 2, in place; BLOCK 32 wins, 16 is the runner-up."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 32: 2 * SLOW_MS}), key=["n"])
@triton.jit
def scale_copy(src_ptr, dst_ptr, n, scale, BLOCK: tl.constexpr):
    """dst = src * scale; BLOCK 64 wins."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask) * scale, mask=mask)


def _limited(x_ptr, n, LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK <= LIMIT, "BLOCK over LIMIT")  # a real compile-time failure of some configs
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


# BLOCK 128 cannot compile when LIMIT=64; 16 is slow, 32 slower; 64 wins.
limited_add_one_ = triton.autotune(
    configs=[triton.Config({"BLOCK": 128})] + block_configs([16, 32, 64], slow={16: SLOW_MS, 32: 2 * SLOW_MS}),
    key=["n"])(triton.jit(_limited))

# Same kernel with the failing config in the middle: 16 works first and becomes the fallback.
limited_mid_add_one_ = triton.autotune(
    configs=block_configs([16], slow={16: SLOW_MS}) + [triton.Config({"BLOCK": 128})] + block_configs([64]),
    key=["n"])(triton.jit(_limited))


@triton.autotune(configs=[triton.Config({"BLOCK": 32})], key=["n"])
@triton.jit
def single_config_add_one_(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 64: 2 * SLOW_MS}), key=["n"],
                 reset_to_zero=["acc_ptr"])
@triton.jit
def accumulate(src_ptr, acc_ptr, n, BLOCK: tl.constexpr):
    """acc += src: correct only if acc starts from zero, which reset_to_zero guarantees."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(acc_ptr + offs, tl.load(acc_ptr + offs, mask=mask) + tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 64: 2 * SLOW_MS}), key=["n"],
                 restore_value=["x_ptr"])
@triton.jit
def restored_add_one_(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _even(args: dict[str, Any]) -> bool:
    return args["n"] % args["BLOCK"] == 0


@triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 64: 2 * SLOW_MS}), key=["n"])
@triton.heuristics({"EVEN": _even})
@triton.jit
def heur_inner_add_one_(x_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)
    else:
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.heuristics({"SHIFT": lambda args: 1.0})
@triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 64: 2 * SLOW_MS}), key=["n"])
@triton.jit
def heur_outer_add_(x_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + SHIFT, mask=mask)


def _drop_big(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    return [c for c in configs if c.kwargs["BLOCK"] <= 32]


@triton.autotune(configs=block_configs([16, 32, 64, 128], slow={16: SLOW_MS}), key=["n"],
                 prune_configs_by={"early_config_prune": _drop_big})
@triton.jit
def early_pruned_add_one_(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _one_if_small(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    return [c for c in configs if c.kwargs["BLOCK"] <= (16 if named_args["n"] <= 32 else 64)]


@triton.autotune(configs=block_configs([16, 32, 64]), key=["n"], prune_configs_by={"early_config_prune": _one_if_small})
@triton.jit
def small_pruned_add_one_(x_ptr, n, BLOCK: tl.constexpr):
    """Pruned to BLOCK 16 alone for n <= 32: even Triton's own run then needs no benchmark."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _model(x_ptr, n, BLOCK, **kwargs: Any) -> float:
    return -BLOCK  # predicts that bigger blocks are faster: top_k=2 keeps 128 and 64


@triton.autotune(configs=block_configs([16, 32, 64, 128], slow={128: SLOW_MS}), key=["n"],
                 prune_configs_by={"perf_model": _model, "top_k": 2})
@triton.jit
def modelled_add_one_(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


ALL = [add_one_, double_, scale_copy, limited_add_one_, limited_mid_add_one_, single_config_add_one_, accumulate,
       restored_add_one_, heur_inner_add_one_, heur_outer_add_, early_pruned_add_one_, modelled_add_one_,
       small_pruned_add_one_]


def autotuner(k: Any) -> Autotuner:
    while not isinstance(k, Autotuner):
        k = k.fn
    return k


def reset_caches() -> None:
    for k in ALL:
        autotuner(k).cache.clear()


def chosen(k: Any) -> dict[tuple, int]:
    """{key: BLOCK} of what the kernel's autotuner has cached."""
    return {key: cfg.kwargs["BLOCK"] for key, cfg in autotuner(k).cache.items()}


# For early stopping: 16 and 32 are within 1.5x of each other, 64 is 2x slower and gets screened out.
screened_add_one_ = triton.autotune(
    configs=block_configs([16, 32, 64], slow={16: 2 * SLOW_MS, 32: 2.4 * SLOW_MS, 64: 4 * SLOW_MS}),
    key=["n"])(triton.jit(add_one_.fn.fn))
ALL.append(screened_add_one_)
