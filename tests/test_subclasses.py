"""Autotuner subclasses that override run, and launchers that cache kernels above an autotuner (issue 34).

flag-gems' LibTuner and LibEntry are the real cases (benchmarks/zoo runs them on a GPU); here stand-ins
with the same shape run on the CPU: a subclass whose run benchmarks and caches under its own key, an
unknown one, and a launcher that keeps the kernel of each argument signature. Each stand-in counts its
own run, so the tests see that a tuning call never lets one benchmark, or cache, behind its back.
"""
from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

from tests.kernels import DEVICE, SLOW_MS, block_configs
from triton_ctx_tune import UnsupportedAutotunerWarning, contextual_autotune, tune_like_triton
from triton_ctx_tune.runtime import libraries, patch


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


class OwnRunTuner(Autotuner):
    """Like flag-gems' LibTuner: keys by a rounding 'strategy', benchmarks on a miss, caches the winner."""
    runs = 0

    def get_key(self, named: dict[str, Any]) -> tuple:
        return (-(-named["n"] // 32) * 32,) + tuple(str(v.dtype) for v in named.values() if hasattr(v, "dtype"))

    def run(self, *args: Any, **kwargs: Any) -> Any:
        type(self).runs += 1
        key = self.get_key(dict(zip(self.arg_names, args)))
        if key not in self.cache:
            self.cache[key] = self.configs[-1]  # "benchmarks" (a stand-in: it just keeps the last config)
        config = self.cache[key]
        return self.fn.run(*args, **kwargs, **config.all_kwargs())


class Declared(OwnRunTuner):
    pass


class Unknown(OwnRunTuner):
    pass


def _tuner(cls: type) -> Any:
    # BLOCK 32 wins (16 and 64 declare a cost), so a tuned key differs from what the subclass's own run keeps (64).
    return cls(_add_one, _add_one.arg_names, block_configs([16, 32, 64], slow={16: SLOW_MS, 64: 2 * SLOW_MS}),
               ["n"], reset_to_zero=None, restore_value=None)


def _op(kernel: Any, log_dir: Any) -> Any:
    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, cache=False, log_dir=log_dir)
    def op(x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        kernel[lambda meta: (triton.cdiv(h.numel(), meta["BLOCK"]),)](h, h.numel())
        return h
    return op


def test_a_subclass_declared_like_triton_is_tuned_under_its_own_key(tmp_path):
    tune_like_triton(Declared, key=lambda at, named: at.get_key(named))
    kernel = _tuner(Declared)
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    Declared.runs = 0
    torch.testing.assert_close(_op(kernel, tmp_path)(x), x + 1)
    assert Declared.runs == 0  # its own run never ran inside the tuning call: it would have benchmarked
    assert {k: c.kwargs["BLOCK"] for k, c in kernel.cache.items()} == {(128, "torch.float32"): 32}  # its key
    # Outside tuning calls its own run finds the winner under its key (n=120 rounds to 128 too).
    y = torch.zeros(120, device=DEVICE)
    kernel[lambda meta: (triton.cdiv(120, meta["BLOCK"]),)](y, 120)
    torch.testing.assert_close(y, torch.ones(120, device=DEVICE))
    assert Declared.runs == 1 and {k: c.kwargs["BLOCK"] for k, c in kernel.cache.items()} == {
        (128, "torch.float32"): 32}  # found there, not "benchmarked" again


def test_an_unknown_subclass_is_refused_by_name_and_runs_its_first_config(tmp_path):
    kernel = _tuner(Unknown)
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    Unknown.runs = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _op(kernel, tmp_path)(x)
        out2 = _op(kernel, tmp_path)(x)
    torch.testing.assert_close(out, x + 1)
    torch.testing.assert_close(out2, x + 1)
    refusals = [w.message for w in caught if isinstance(w.message, UnsupportedAutotunerWarning)]
    assert len(refusals) == 1  # once per class
    text = str(refusals[0])
    assert "test_subclasses.Unknown" in text and "overrides Autotuner.run" in text
    assert "tune_like_triton(Unknown, key=...)" in text
    assert Unknown.runs == 0  # never its own run (it would benchmark on the call's buffers, per rank)
    assert kernel.best_config.kwargs == {"BLOCK": 16}  # its first config, untuned
    assert dict(kernel.cache) == {}


class Delegating(Autotuner):
    """Like FLA's CachedAutotuner: puts a shipped config of the key into `cache`, then calls Triton's run."""
    runs = 0
    shipped: dict[tuple, Any] = {}

    def run(self, *args: Any, **kwargs: Any) -> Any:
        type(self).runs += 1
        key = (args[1], str(args[0].dtype))
        if key in self.shipped:
            self.cache[key] = self.shipped[key]
        return super().run(*args, **kwargs)


def test_a_subclass_whose_run_calls_tritons_keeps_its_run(tmp_path):
    kernel = _tuner(Delegating)
    assert libraries.rule(kernel).delegates and libraries.rule(kernel).tuned
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    Delegating.runs = 0
    torch.testing.assert_close(_op(kernel, tmp_path)(x), x + 1)  # no shipped config: tuned through its run
    assert Delegating.runs > 1 and kernel.cache[(100, "torch.float32")].kwargs == {"BLOCK": 32}
    Delegating.shipped = {(64, "torch.float32"): kernel.configs[2]}
    runs = Delegating.runs
    y = torch.arange(64, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(_op(kernel, tmp_path)(y), y + 1)  # its shipped config: a cache hit, run once
    assert Delegating.runs == runs + 1 and kernel.cache[(64, "torch.float32")].kwargs == {"BLOCK": 64}


class CachingLauncher(triton.KernelInterface):
    """Like flag-gems' LibEntry: the first launch of an argument signature goes through the autotuner; later ones
    reuse the config it ran, never reaching Autotuner.run."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.arg_names, self.kept = fn, fn.arg_names, {}

    def run(self, *args: Any, **kwargs: Any) -> Any:
        signature = tuple(str(a.dtype) if hasattr(a, "dtype") else a for a in args)
        if signature not in self.kept:
            out = self.fn.run(*args, **kwargs)
            self.kept[signature] = self.fn.best_config
            return out
        return self.fn.fn.run(*args, **kwargs, **self.kept[signature].all_kwargs())


def test_a_caching_launcher_passes_launches_down_inside_a_tuning_call(tmp_path, monkeypatch):
    monkeypatch.setitem(libraries.CACHING_LAUNCHERS, f"{__name__}.CachingLauncher", "keeps kernels (a stand-in)")
    plain = triton.autotune(configs=block_configs([16, 32, 64], slow={16: SLOW_MS, 64: 2 * SLOW_MS}),
                            key=["n"])(_add_one)
    kernel = CachingLauncher(plain)
    patch.cover()  # (a resident patch from earlier tests: the next tuned call would cover it too)
    x = torch.arange(100, dtype=torch.float32, device=DEVICE)
    torch.testing.assert_close(_op(kernel, tmp_path)(x), x + 1)
    assert kernel.kept == {}  # it kept nothing of the tuning call's trial configs
    assert {k: c.kwargs["BLOCK"] for k, c in plain.cache.items()} == {(100, "torch.float32"): 32}


def test_rules_are_per_class_and_the_known_table_names_flag_gems():
    assert libraries.rule(_tuner(Unknown)).tuned is False
    assert libraries.rule(triton.autotune(configs=block_configs([16, 32]), key=["n"])(_add_one)) is None
    assert libraries.KNOWN["flag_gems.utils.libentry.LibTuner"].tuned
    with pytest.raises(TypeError, match="subclass of triton.runtime.Autotuner"):
        tune_like_triton(dict)
