"""How an output is judged: the tolerance rule of the library's own tests, as data both the arms and merge.py use.

A rule turns (got, want) into one number, the error as a multiple of what the rule allows: at most 1 passes.
Outputs are a tensor or a tuple of tensors (an op with several results); the ratio is the worst part's.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Tolerance:
    # "allclose": |got - want| <= atol + rtol |want| per element, want first cast to got's dtype (torch.testing,
    #   and flag_gems.testing.assert_close, which scales atol by the reduced length beforehand); atol = rtol = 0
    #   is exact equality (indices).
    # "mean_abs": mean |got - want| <= atol (gemlite's tests).
    # "rel_fro": ||got - want|| / ||want|| <= rtol (benchmarks/clients' float32 references).
    rule: str
    atol: float = 0.0
    rtol: float = 0.0
    source: str = ""  # whose rule this is, in words

    def ratio(self, got: Any, want: Any) -> float:
        pairs = list(zip(parts(got), parts(want), strict=True))
        return max((self._ratio(g, w) for g, w in pairs), default=0.0)

    def _ratio(self, got: torch.Tensor, want: torch.Tensor) -> float:
        if got.shape != want.shape:
            return math.inf
        if self.rule == "allclose":
            want = want.to(got.dtype)
        g, w = got.detach().double().cpu(), want.detach().double().cpu()
        if not torch.isfinite(g).all():  # a nan would pass every comparison below as False, i.e. silently
            return math.inf
        diff = (g - w).abs()
        if self.rule == "allclose":
            if self.atol == 0 and self.rtol == 0:
                return 0.0 if torch.equal(g, w) else math.inf
            return float((diff / (self.atol + self.rtol * w.abs())).max()) if diff.numel() else 0.0
        if self.rule == "mean_abs":
            return float(diff.mean()) / self.atol
        if self.rule == "rel_fro":
            return float(diff.norm() / w.norm().clamp_min(1e-30)) / self.rtol
        raise ValueError(f"unknown tolerance rule {self.rule!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parts(out: Any) -> list[torch.Tensor]:
    """The tensors of an output: itself, or a tuple's or list's members in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out]


def to_cpu(out: Any) -> Any:
    """An output detached on the CPU, same structure (what each arm saves for merge.py)."""
    if isinstance(out, torch.Tensor):
        return out.detach().cpu()
    return tuple(t.detach().cpu() for t in out)
