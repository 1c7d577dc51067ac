"""What every client shares: its description, the workload it builds, and the bookkeeping of its autotuners.

A client is a real library's training step. It builds a Workload: the step (one function: forward,
backward, gradient all_reduce), the gradients it leaves behind, and their float32 reference. The arms in
run_clients.py call that step plainly or through contextual_autotune and compare what each arm did to the
library's Autotuners, found by module with gc.
"""
from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from triton.runtime.autotuner import Autotuner

from benchlib import Ranks, rel_fro
from triton_ctx_tune.runtime.compat import config_str, kernel_name


@dataclass(frozen=True)
class Context:
    """Where a workload runs: the ranks, one seed for every rank's data, and whether to use tiny shapes."""
    ranks: Ranks
    seed: int
    small: bool

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world(self) -> int:
        return self.ranks.world

    @property
    def device(self) -> torch.device:
        return self.ranks.device

    def generator(self) -> torch.Generator:
        """The same random stream on every rank: each rank draws every rank's data and keeps its shard."""
        return torch.Generator(self.device).manual_seed(self.seed)


@dataclass
class Workload:
    step: Callable[[], torch.Tensor]  # one training step; returns its checked output (detached)
    grads: Callable[[], dict[str, torch.Tensor | None]]  # this rank's gradients after a step
    ref_grads: dict[str, torch.Tensor]  # their float32 reference, same names and shapes
    ref_out: torch.Tensor  # float32 reference of the step's return value
    tolerance: float  # on every relative error
    shapes: dict[str, Any]
    # The tensors the step trains (those grads() names, in that order): an optimizer over them continues the
    # step into a training loop (train_loop.py). Empty for a client that does not say.
    params: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class ClientSpec:
    name: str
    requirement: str  # the pip requirement of its library (the `clients` extra)
    import_name: str  # imported up front, so a missing library fails before any rank starts work
    modules: tuple[str, ...]  # module prefixes of the library's kernels: their Autotuners are this client's
    needs_cuda: bool
    summary: str
    build: Callable[[Context], Workload]


# ---- autotuners and their keys --------------------------------------------------------------------

def _module(at: Autotuner) -> str:
    return getattr(at.base_fn, "__module__", None) or ""


def _in_modules(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def library_autotuners(prefixes: tuple[str, ...]) -> list[Autotuner]:
    """Every live Autotuner whose kernel is defined under one of the module prefixes, in a stable order.

    A library may wrap triton.autotune (FLA's CachedAutotuner subclasses Autotuner), so gc, not module
    attributes, is what finds them all, wrapped in triton.heuristics or not.
    """
    # type(), not isinstance(): isinstance reads obj.__class__, which some live objects turn into a warning.
    found = [obj for obj in gc.get_objects()
             if issubclass(type(obj), Autotuner) and _in_modules(_module(obj), prefixes)]
    return sorted(found, key=lambda at: (_module(at), kernel_name(at), id(at)))


def clear_caches(autotuners: list[Autotuner]) -> int:
    """Empty every Autotuner.cache (the tuned key -> config map) so the next call tunes from scratch."""
    cleared = sum(len(at.cache) for at in autotuners)
    for at in autotuners:
        at.cache.clear()
    return cleared


def key_id(kernel: str, key: tuple) -> str:
    """One key as text, the way TunedKey and the rank logs name it: kernel name and the key tuple."""
    return f"{kernel} {key!r}"


def seen_keys(autotuners: list[Autotuner]) -> dict[str, str]:
    """{key_id: chosen config} for every key present in the Autotuners' caches."""
    return {key_id(kernel_name(at), key): config_str(cfg) for at in autotuners for key, cfg in list(at.cache.items())}


def configs_per_kernel(autotuners: list[Autotuner]) -> dict[str, int]:
    """Size of each kernel's config space before any prune_configs_by."""
    return {kernel_name(at): len(at.configs) for at in autotuners}


def agreement(ranks: Ranks, mine: dict[str, str]) -> dict[str, Any]:
    """Which keys every rank tuned to the same config (a key missing on a rank counts as a disagreement)."""
    every: list[dict[str, str]] = ranks.gather(mine)
    keys = sorted(set().union(*every))
    per_key = {k: [e.get(k) for e in every] for k in keys}
    agreed = [k for k, picks in per_key.items() if None not in picks and len(set(picks)) == 1]
    return {"agree": len(agreed), "total": len(keys), "per_key": per_key,
            "differ": [k for k in keys if k not in agreed]}


# ---- checks -----------------------------------------------------------------------------------------

def errors(ranks: Ranks, work: Workload, out: torch.Tensor) -> dict[str, Any]:
    """Relative Frobenius errors of the output and each gradient, the worst over ranks (every rank gets them)."""
    got = work.grads()
    grads = {}
    for name in sorted(work.ref_grads):  # the same order on every rank: each max is a collective
        g = got.get(name)
        grads[name] = ranks.max(_nan_as_inf(math.inf if g is None else rel_fro(g, work.ref_grads[name])))
    out_err = ranks.max(_nan_as_inf(rel_fro(out, work.ref_out)))
    worst = max([out_err, *grads.values()])
    return {"out": out_err, "grads": grads, "worst": worst, "ok": worst <= work.tolerance,
            "tolerance": work.tolerance}


def _nan_as_inf(err: float) -> float:
    # A nan would compare false both ways and could vanish in a max over ranks.
    return math.inf if math.isnan(err) else err


def zero_grads(*tensors: torch.Tensor) -> None:
    """optimizer.zero_grad(set_to_none=True): every execution of a step starts from no gradient."""
    for t in tensors:
        t.grad = None
