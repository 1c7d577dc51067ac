"""Output validation: a config is valid only if the function's result with it matches a reference.

The reference is the function's result when every kernel runs its first config (or what a
user-given reference function returns). In a contextual call several kernels could change at
once, so a mismatch could not be pinned on one of them; instead every config is validated in a
step of its own, in which that key runs the config and every other key runs its known-good first
config (search.py plans these steps). A result differs when more than `max_mismatch_ratio` of
any tensor's elements are outside `atol + rtol * |reference|` (NaN where the reference is not,
included), or when a user-given `compare(result, reference)` returns False. StepChecks is the
session's side: what each step checked, the verdict shared by every rank, and the checks still to plan.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..errors import NothingToValidateError, call_hook
from ..runtime.compat import config_str
from .decisions import plain_point

if TYPE_CHECKING:
    from .search import Assignment
    from .services import StepServices


@dataclass
class Check:
    ok: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatch_ratio: float = 0.0
    detail: str = ""

    def describe(self) -> str:
        if self.detail:
            return self.detail
        return (f"{self.mismatch_ratio:.2%} of elements differ from the reference (max abs err {self.max_abs:.3g}, "
                f"max rel err {self.max_rel:.3g})")


def tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors of a result, in a fixed order: nested tuples, lists and dicts (sorted keys)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in tensors(o)]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in tensors(obj[k])]
    return []


def snapshot(obj: Any) -> Any:
    """A copy of a result that later executions cannot overwrite (functions often reuse buffers)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, tuple):
        return tuple(snapshot(o) for o in obj)
    if isinstance(obj, list):
        return [snapshot(o) for o in obj]
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    return obj


class Validator:
    def __init__(self, atol: float, rtol: float, max_mismatch_ratio: float,
                 compare: Callable[[Any, Any], bool] | None) -> None:
        self.atol, self.rtol, self.max_mismatch_ratio, self.compare = atol, rtol, max_mismatch_ratio, compare
        self.reference: Any = None

    def set_reference(self, result: Any, function: str, what: str) -> None:
        self.require_comparable(result, function, what)
        self.reference = snapshot(result)

    def require_comparable(self, result: Any, function: str, what: str) -> None:
        """Without compare=, only tensors are compared: a result holding none would pass every check."""
        if self.compare is None and not tensors(result):
            raise NothingToValidateError(function, what, result)

    def check(self, result: Any) -> Check:
        if self.compare is not None:
            ok = bool(call_hook("compare", "make compare(result, reference) return True when the result is right, "
                                "False when it is not", self.compare, result, self.reference))
            return Check(ok, detail="" if ok else "the user's compare(result, reference) returned False")
        got, want = tensors(result), tensors(self.reference)
        if len(got) != len(want):
            return Check(False, detail=f"the result holds {len(got)} tensors, the reference {len(want)}")
        worst = Check(True)
        for g, w in zip(got, want):
            if g.shape != w.shape:
                return Check(False,
                             detail=f"a result tensor has shape {tuple(g.shape)}, the reference {tuple(w.shape)}")
            c = self._compare(g, w)
            if not c.ok:
                return c
            worst = Check(True, max(worst.max_abs, c.max_abs), max(worst.max_rel, c.max_rel),
                          max(worst.mismatch_ratio, c.mismatch_ratio))
        return worst

    def _compare(self, got: torch.Tensor, want: torch.Tensor) -> Check:
        g, w = got.detach().double(), want.detach().to(got.device).double()
        close = torch.isclose(g, w, rtol=self.rtol, atol=self.atol, equal_nan=True)
        n = max(close.numel(), 1)
        ratio = float((~close).sum()) / n
        diff = (g - w).abs()
        finite = torch.isfinite(diff)
        max_abs = float(diff[finite].max()) if bool(finite.any()) else (0.0 if bool(close.all()) else math.inf)
        rel = diff / w.abs().clamp_min(1e-30)
        max_rel = float(rel[finite].max()) if bool(finite.any()) else max_abs
        return Check(ratio <= self.max_mismatch_ratio, max_abs, max_rel, ratio)


class StepChecks:
    """Session's validating half: it takes the reference from its step, judges the (key, config) or
    the point a step checked, shares every rank's verdict, and plans checks for keys met in the step."""

    def __init__(self, services: StepServices, validator: Validator) -> None:
        self.services, self.validator = services, validator
        self.output_checked = False

    def after_step(self, a: Assignment, output: Any) -> None:
        """Take the reference, or judge the config this step checked; plan checks for keys met in it."""
        svc, v = self.services, self.validator
        if a.reference:
            v.set_reference(output, svc.function, "its result")
            svc.search.reference_pending = False
        elif a.validating is not None:
            svc.search.validation.pop(0)
            state, index = a.validating
            check = v.check(output) if index not in state.failures else None
            mine = {} if check is None or check.ok else {index: f"validation: {check.describe()}"}
            shared = svc.comm.share_failures(mine, len(state.configs), "share validation results")
            for i, reason in shared.items():
                state.fail(i, reason)
            svc.ensure_header()
            ok = index not in shared
            stats = {} if check is None else {"max_abs": check.max_abs, "max_rel": check.max_rel,
                                              "mismatch_ratio": check.mismatch_ratio}
            svc.log.write("validation", f"validation kernel={state.kernel} key={state.key!r} config#{index} "
                          f"{{{config_str(state.configs[index])}}} " + ("ok" if ok else f"INVALID {shared[index]}"),
                          kernel=state.kernel, key=list(state.key), config_index=index,
                          config=config_str(state.configs[index]), ok=ok, reason=shared.get(index),
                          mine=None if check is None else check.ok, **stats)
            if not ok:
                svc.progress.clear()
                svc.log.summary(f"{svc.function}: {state.kernel} key={state.key!r}: config "
                                f"{{{config_str(state.configs[index])}}} is invalid ({shared[index]})")
        if svc.new_states:
            svc.search.plan_validation(svc.new_states, user_reference=svc.opts.reference is not None)

    def point_invalid(self, a: Assignment, output: Any) -> bool:
        """Validate a point by its first execution, in which every kernel runs its first config, as in
        the reference: a point whose result differs fails on every rank, like one that raises."""
        svc, v = self.services, self.validator
        if not self.output_checked:
            # Every step that did not fail passes here first: the first one decides, before a second execution.
            v.require_comparable(output, svc.function, "its result")
            self.output_checked = True
        pts = svc.search.points
        if pts is None or a.point is None or a.point in pts.seen or a.fixed or v.reference is None:
            return False  # (point 0's first execution is, or precedes, the reference when none is given)
        check = v.check(output)
        mine = {} if check.ok else {a.point: f"validation: {check.describe()}"}
        shared = svc.comm.share_failures(mine, len(pts.configs), "share point validation results")
        svc.ensure_header()
        ok = a.point not in shared
        svc.log.write("validation",
                      f"validation point#{a.point} {a.kwargs} " + ("ok" if ok else f"INVALID {shared[a.point]}"),
                      kind="point", point=a.point, kwargs=plain_point(a.kwargs), ok=ok, reason=shared.get(a.point),
                      mine=check.ok, max_abs=check.max_abs, max_rel=check.max_rel, mismatch_ratio=check.mismatch_ratio)
        if not ok:
            svc.point_failed(a, shared[a.point], {str(svc.comm.rank): mine[a.point]} if mine else {})
        return not ok
