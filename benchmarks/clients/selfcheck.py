"""`run_clients.py --self-check`: the float32 references and the harness's bookkeeping, on CPU, in seconds.

The simple GLA reference is checked against a second, independent formulation (the recurrent state form)
and, where fla is installed, against FLA's own naive implementations; each client's sharding and gradient
bookkeeping against a plain single-process autograd of the same objective; the autotuner bookkeeping on the
toy client's kernels; the report on made-up records.
"""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import references as ref

_results: list[tuple[str, bool, str]] = []


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-300))


def check(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = _rel(got, want)
    ok = err <= tol and bool(torch.isfinite(got).all())
    _results.append((name, ok, f"rel err {err:.2e} (tol {tol:g})"))


def check_true(name: str, ok: bool, note: str = "") -> None:
    _results.append((name, bool(ok), note))


def skip(name: str, why: str) -> None:
    _results.append((name, True, f"skipped: {why}"))


def _grads(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], probe: torch.Tensor
           ) -> tuple[torch.Tensor, ...]:
    """(fn's output, the gradients of sum(output * probe) with respect to each input)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return (out.detach(), *torch.autograd.grad((out * probe).sum(), leaves))


# ---- simple GLA -------------------------------------------------------------------------------------

def _gla_inputs(dtype: torch.dtype, B: int = 2, T: int = 37, H: int = 3, K: int = 5, V: int = 4,
                g_gamma: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    qkv = [torch.randn(B, T, H, d, generator=gen, dtype=dtype) for d in (K, K, V)]
    g = ref.retnet_log_decays(H).to(dtype) if g_gamma is None else g_gamma.to(dtype)
    return qkv, g, torch.randn(B, T, H, V, generator=gen, dtype=dtype)


def check_simple_gla_forms() -> None:
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        for label, g in (("retnet decays", None), ("decays 0.99/0.6/0.007", torch.tensor([-0.01, -0.5, -5.0]))):
            qkv, g_gamma, probe = _gla_inputs(dtype, g_gamma=g)
            par = _grads(lambda q, k, v, g_gamma=g_gamma: ref.simple_gla_parallel(q, k, v, g_gamma), qkv, probe)
            rec = _grads(lambda q, k, v, g_gamma=g_gamma: ref.simple_gla_recurrent(q, k, v, g_gamma), qkv, probe)
            for what, a, b in zip(("o", "dq", "dk", "dv"), par, rec):
                check(f"simple GLA parallel vs recurrent, {str(dtype)[6:]}, {label}: {what}", a, b, tol)
    # A custom scale must reach both forms the same way.
    qkv, g_gamma, _ = _gla_inputs(torch.float64)
    check("simple GLA parallel vs recurrent, scale=0.3", ref.simple_gla_parallel(*qkv, g_gamma, scale=0.3),
          ref.simple_gla_recurrent(*qkv, g_gamma, scale=0.3), 1e-12)


def check_simple_gla_vs_fla_naive() -> None:
    try:
        from fla.ops.simple_gla.naive import naive_chunk_simple_gla, naive_recurrent_simple_gla
    except Exception as e:  # noqa: BLE001 - fla is optional here, and its import may fail on some CPUs
        skip("simple GLA vs FLA's naive implementations", f"fla does not import ({type(e).__name__}: {e})")
        return
    qkv, g_gamma, _ = _gla_inputs(torch.float32, T=100)
    B, T, H, _ = qkv[0].shape
    g = g_gamma[None, None, :].expand(B, T, H).contiguous()  # FLA's naive forms take a per-token gate
    mine = ref.simple_gla_parallel(*qkv, g_gamma)
    check("simple GLA vs FLA naive_recurrent_simple_gla", naive_recurrent_simple_gla(*qkv, g)[0], mine, 1e-5)
    check("simple GLA vs FLA naive_chunk_simple_gla", naive_chunk_simple_gla(*qkv, g)[0], mine, 1e-5)


def check_simple_gla_client_sharding(world: int = 2) -> None:
    """The client's reference (one autograd over all heads) vs its distributed objective rebuilt rank by rank."""
    from client_fla_simple_gla import head_shard, row_shard

    hr, T, K = 2, 16, 4
    H, V = hr * world, K
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, T, H, K, generator=gen) for _ in range(3))
    g_gamma = ref.retnet_log_decays(H)
    w = torch.randn(H * V, H * V, generator=gen) / H
    probe = torch.randn(T, H * V, generator=gen)
    y_ref, g_ref = ref.simple_gla_step_reference(q, k, v, g_gamma, w, probe)

    shards = []
    for r in range(world):  # each rank: its heads, its rows of w_o, the recurrent form
        heads, rows = head_shard(r, hr), row_shard(r, hr, V)
        leaves = {"q": q[:, :, heads].clone(), "k": k[:, :, heads].clone(), "v": v[:, :, heads].clone(),
                  "w_o": w[rows].clone()}
        for t in leaves.values():
            t.requires_grad_()
        o = ref.simple_gla_recurrent(leaves["q"], leaves["k"], leaves["v"], g_gamma[heads])
        shards.append((leaves, heads, rows, o.reshape(T, hr * V) @ leaves["w_o"]))
    y = sum(part for *_, part in shards)  # what the all_reduce sums
    (sum((y * probe).sum() / world for _ in range(world))).backward()  # every rank's loss, as autograd sums them
    check("simple GLA client: y vs rank-by-rank", y.detach(), y_ref, 1e-5)
    for leaves, heads, rows, _ in shards:
        for name, t in leaves.items():
            want = g_ref[name][rows] if name == "w_o" else g_ref[name][:, :, heads]
            check(f"simple GLA client: d{name} of heads {heads.start}..{heads.stop - 1}", t.grad, want, 1e-5)


# ---- norms and cross-entropy ------------------------------------------------------------------------

def check_norms() -> None:
    gen = torch.Generator().manual_seed(3)
    N, D, eps = 7, 33, 1e-5
    x, res, w1, b1, w2 = (torch.randn(*size, generator=gen, dtype=torch.float64)
                          for size in ((N, D), (N, D), (D,), (D,), (D,)))
    h = x + res
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + eps) * w1 + b1
    manual = h / torch.sqrt(h.square().mean(-1, keepdim=True) + eps) * w2
    check("layer_norm + rms_norm reference vs the formulas", ref.norms_reference(x, res, w1, b1, w2, eps), manual,
          1e-12)
    if hasattr(F, "rms_norm"):
        check("rms_norm part vs torch's F.rms_norm", ref.norms_reference(x, res, w1, b1, w2, eps),
              F.rms_norm(F.layer_norm(x + res, (D,), w1, b1, eps), (D,), w2, eps), 1e-12)


def check_cross_entropy(world: int = 2) -> None:
    gen = torch.Generator().manual_seed(4)
    N, D, V = 5, 8, 11
    es = [torch.randn(N, D, generator=gen) for _ in range(world)]
    c = torch.randn(V, D, generator=gen)
    ts = [torch.randint(0, V, (N,), generator=gen) for _ in range(world)]
    losses, de, dc = ref.cross_entropy_step_reference(es, c, ts)
    # By hand: loss_r = mean(logsumexp(logits) - target logit); J = sum_r loss_r; dC averaged over ranks.
    leaves = [e.clone().requires_grad_() for e in es]
    c_leaf = c.clone().requires_grad_()
    manual = []
    for e, t in zip(leaves, ts):
        logits = e @ c_leaf.T
        manual.append((logits.logsumexp(-1) - logits.gather(1, t[:, None]).squeeze(1)).mean())
    sum(manual).backward()
    for r in range(world):
        check(f"cross-entropy reference: loss of rank {r}", losses[r], manual[r].detach(), 1e-6)
        check(f"cross-entropy reference: dE of rank {r}", de[r], leaves[r].grad, 1e-5)
    check("cross-entropy reference: dC (mean over ranks)", dc, c_leaf.grad / world, 1e-5)


# ---- harness bookkeeping ----------------------------------------------------------------------------

class _FakeRanks:
    def __init__(self, others: list[Any]) -> None:
        self.others = others

    def gather(self, obj: Any) -> list[Any]:
        return [obj, *self.others]


def check_bookkeeping() -> None:
    import client_toy
    from common import agreement, clear_caches, configs_per_kernel, library_autotuners, seen_keys

    ats = library_autotuners((client_toy.__name__,))
    names = sorted(at.base_fn.__name__ for at in ats)
    check_true("library_autotuners finds the toy's two kernels by module", names == ["toy_mul_bwd_kernel",
                                                                                     "toy_mul_fwd_kernel"], str(names))
    clear_caches(ats)
    fwd = next(at for at in ats if at.base_fn.__name__ == "toy_mul_fwd_kernel")
    fwd.cache[(1000, "torch.float32")] = fwd.configs[1]
    seen = seen_keys(ats)
    want = {"toy_mul_fwd_kernel (1000, 'torch.float32')": "BLOCK=256, num_warps=4, num_stages=3"}
    check_true("seen_keys names a cached key as TunedKey does", seen == want, repr(seen))
    check_true("configs_per_kernel", configs_per_kernel(ats) == {"toy_mul_bwd_kernel": 4, "toy_mul_fwd_kernel": 4})
    other = {**seen, "toy_mul_bwd_kernel (1000, 'torch.float32')": "BLOCK=256, num_warps=2, num_stages=3"}
    agree = agreement(_FakeRanks([other]), seen)  # type: ignore[arg-type]
    check_true("agreement: a key missing on one rank is a disagreement", (agree["agree"], agree["total"]) == (1, 2),
               repr(agree))
    check_true("clear_caches empties the caches", clear_caches(ats) == 1 and not fwd.cache)


def _fake_record(arm: str) -> dict[str, Any]:
    seen = ["k_fwd (1, 'torch.bfloat16')", "k_bwd (1, 'torch.bfloat16')"]
    errs = {"out": 1e-3, "grads": {"q": 2e-3, "w": None}, "worst": 2e-3, "ok": True, "tolerance": 1e-2}
    return {"client": "fake", "arm": arm, "first_call": {"wall_s": 12.5, "executions": 1 if arm == "plain" else 40,
                                                         "errors": errs},
            "keys": {"seen": seen, "tuned_of_seen": 0 if arm == "plain" else 1, "seen_not_tuned": seen[1:]},
            "agreement": {"agree": 1, "total": 2, "differ": seen[1:], "per_key": {seen[1]: ["a", "b"]}},
            "warm_call": {"wall_s": 0.01, "executions": 1}, "step_ms": None}


def check_report() -> None:
    import summary

    records = [_fake_record("ours"), _fake_record("plain"), {"client": "broken", "arm": "ours", "error": "X: y"}]
    lines = summary.table_lines(records) + summary.detail_lines(records)
    fake_rows = [line.split()[1] for line in lines[1:4] if line.startswith("fake ")]
    ok = fake_rows == ["plain", "ours"] and any("FAILED: X: y" in line for line in lines)
    check_true("report: a row per record, plain before ours", ok, "" if ok else "\n" + "\n".join(lines))
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for arm in ("plain", "ours"):
            p = Path(tmp) / f"{arm}.json"
            p.write_text(json.dumps({"arm": arm, "meta": {"gpu": "fake"}, "results": [_fake_record(arm)]}))
            paths.append(str(p))
        with contextlib.redirect_stdout(io.StringIO()):  # merge prints the report; the check only wants its result
            status = summary.merge(paths, str(Path(tmp) / "merged.json"))
        merged = json.loads((Path(tmp) / "merged.json").read_text())
    check_true("report: --merge reads both arms and writes one file", status == 0 and len(merged["results"]) == 2)


def main() -> int:
    torch.manual_seed(0)
    for fn in (check_simple_gla_forms, check_simple_gla_vs_fla_naive, check_simple_gla_client_sharding, check_norms,
               check_cross_entropy, check_bookkeeping, check_report):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report every check, not just the first crash
            _results.append((fn.__name__, False, f"raised {type(e).__name__}: {e}"))
    width = max(len(name) for name, _, _ in _results)
    for name, ok, note in _results:
        print(f"{'ok  ' if ok else 'FAIL'}  {name:<{width}}  {note}")
    failed = [name for name, ok, _ in _results if not ok]
    print(f"self-check: {len(_results) - len(failed)}/{len(_results)} passed"
          + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0
