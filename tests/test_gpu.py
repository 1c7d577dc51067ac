"""What only a GPU shows: CUDA-event timing, the L2 flush, and real out-of-resources failures."""
from __future__ import annotations

import contextlib
import json
import statistics
import types
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels import autotuner, busy_host, chosen
from triton_ctx_tune import contextual_autotune
from triton_ctx_tune.runtime import timing

pytestmark = pytest.mark.gpu


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=1), triton.Config({"BLOCK": 4096}, num_warps=8)],
                 key=["n"])
@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.autotune(configs=[
    # Needs about 1 MiB of shared memory: OutOfResources on every current GPU.
    triton.Config({"BM": 256, "BN": 256, "BK": 128}, num_stages=4, num_warps=8),
    triton.Config({"BM": 64, "BN": 64, "BK": 32}, num_stages=3, num_warps=4),
    triton.Config({"BM": 128, "BN": 128, "BK": 32}, num_stages=3, num_warps=8),
], key=["M", "N", "K"])
@triton.jit
def _matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
                    other=0.0)
        y = tl.load(b + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def test_cuda_events_time_real_kernels_and_flush_l2(tmp_path):
    n = 1 << 24

    @contextual_autotune(n_warmup=2, n_repeat=5, early_stop=False)  # every config gets all its slots
    def op(x: torch.Tensor):
        y = torch.empty_like(x)
        _copy[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
        return y

    x = torch.randn(n, device="cuda")
    torch.testing.assert_close(op(x), x)
    assert chosen(_copy) == {(n, "torch.float32", "torch.float32"): 4096}
    assert torch.cuda.current_device() in timing._flush_buffers
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    assert events[0]["timer"] == "cuda-events" and events[0]["device"] == torch.cuda.get_device_name()
    timed = [e["ms"] for e in events if e["event"] == "slot" and e["timed"]]
    assert len(timed) == 10 and all(0 < ms < 100 for ms in timed)
    autotuner(_copy).cache.clear()


@pytest.mark.parametrize("mode", ["step", True, False])
def test_flush_l2_clears_l2_before_each_timed_launch_or_once_per_re_execution(tmp_path, monkeypatch, mode):
    n = 1 << 20
    flushes: list[int] = []
    real = timing._flush_l2

    def counted() -> None:
        flushes.append(1)
        real()

    monkeypatch.setattr(timing, "_flush_l2", counted)
    executions = 0

    @contextual_autotune(n_warmup=1, n_repeat=2, early_stop=False, confirm=False, cache=False, flush_l2=mode)
    def op(x: torch.Tensor) -> torch.Tensor:
        nonlocal executions
        executions += 1
        y = torch.empty_like(x)
        _copy[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
        return y

    x = torch.randn(n, device="cuda")
    torch.testing.assert_close(op(x), x)
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    assert events[0]["flush_l2"] == mode
    timed = [e for e in events if e["event"] == "slot" and e["timed"]]
    assert len(timed) == 4  # 2 configs x 2 timed slots
    # True: before each timed launch. "step": each re-execution once (not the first execution, which met the key,
    # nor the final run).
    assert len(flushes) == {"step": executions - 2, True: 4, False: 0}[mode], (executions, len(flushes))
    assert executions >= 6
    autotuner(_copy).cache.clear()


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4, num_stages=s) for s in (1, 2, 3)]
                 + [triton.Config({"BLOCK": 256}, num_warps=2, num_stages=s) for s in (1, 2)], key=["n"])
@triton.jit
def _twice(src, dst, n, BLOCK: tl.constexpr):  # no loop: num_stages changes nothing it compiles to
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask) * 2, mask=mask)


def test_configs_that_compile_to_one_binary_are_timed_once(tmp_path):
    """Five configs, two binaries: configs 1 and 2 are config 0's binary, config 4 is config 3's. From the step end
    that gathers the key's compiles on, only 0 and 3 get slots (a launch before it runs what is ready); the others
    are out of the timing as the same binary, not failed, and never win (precompile.same_binaries)."""
    n = 1 << 22

    @contextual_autotune(n_warmup=2, n_repeat=5, early_stop=False)
    def op(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        _twice[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
        return y

    x = torch.randn(n, device="cuda")
    torch.testing.assert_close(op(x), x * 2)
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    gathered = next(k for k, e in enumerate(events) if e["event"] == "precompile")
    assert sorted(events[gathered]["same_binary"]) == ["1", "2", "4"], events[gathered]
    (decision,) = [e for e in events if e["event"] == "decision"]
    assert {int(j): r.split(":")[0] for j, r in decision["local_failures"].items()} == {
        1: "the same binary as config 0", 2: "the same binary as config 0", 4: "the same binary as config 3"}
    # A step's slots are logged at its end, after the gather that ends it: the gathering step's own slot ran before
    # it (and may have timed config 4 early, its group leading as the config the first execution ran).
    at = min(e["step"] for e in events[gathered:] if e["event"] == "slot")
    later = {e["config_index"] for e in events[gathered:] if e["event"] == "slot" and e["timed"] and e["step"] > at}
    assert later == {0, 3}
    assert decision["winner"] in (0, 3)
    assert chosen(_twice) == {(n, "torch.float32", "torch.float32"): 1024 if decision["winner"] == 0 else 256}
    autotuner(_twice).cache.clear()


@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})],
                 key=["n"])
@triton.jit
def _limited(x, n, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK <= 64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)


def _events(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]


def test_precompile_finds_compile_errors_before_any_slot(tmp_path):
    @contextual_autotune(n_warmup=1, n_repeat=2)
    def op(x: torch.Tensor):
        h = x.clone()
        _limited[lambda m: (triton.cdiv(h.numel(), m["BLOCK"]),)](h, h.numel())
        return h

    x = torch.randn(4096, device="cuda")
    torch.testing.assert_close(op(x), x + 1)
    events = _events(tmp_path)
    (pre,) = [e for e in events if e["event"] == "precompile"]
    # Precompile rejects it; only its launch, with the real arguments, excludes it (on every rank).
    assert pre["failures"] == {} and list(pre["rejected"]) == ["0"]
    assert pre["rejected"]["0"].startswith("CompileTimeAssertionFailure: at ")  # no message: the excerpt
    assert "tl.static_assert(BLOCK <= 64)" in pre["rejected"]["0"]
    # The execution that met the key ran a config that had compiled, in its own warm-up slot (its group leads the
    # plan: one rank times compiled configs early), never a timed one; config 0's first slot compiled it again and
    # failed, and no later slot tried it.
    first = next(e for e in events if e["event"] == "slot")
    assert first["step"] == 1 and not first["timed"] and first["ran"] == first["config_index"] not in (None, 0)
    assert pre["ran_meanwhile"] == [first["ran"]]
    rest = [e for e in events if e["event"] == "slot" and e["config_index"] == 0]
    assert rest and rest[0]["failure"].startswith("CompileTimeAssertionFailure")
    assert rest[0]["failure"].endswith("(precompile rejected it too)")
    assert all(e["failure"].startswith("skipped") for e in rest[1:])
    assert not [e for e in events if e["event"] == "precompile-disagreed"]
    autotuner(_limited).cache.clear()


def test_config_out_of_shared_memory_is_excluded(tmp_path):
    M = N = K = 512

    @contextual_autotune(n_warmup=1, n_repeat=3)
    def op(a: torch.Tensor, b: torch.Tensor):
        c = torch.empty(M, N, device="cuda")
        _matmul[lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))](a, b, c, M, N, K)
        return c

    a = torch.randn(M, K, device="cuda")
    b = torch.randn(K, N, device="cuda")
    c = op(a, b)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2  # tf32 dot
    timings = {c.kwargs["BM"]: t[0] for c, t in autotuner(_matmul).configs_timings.items()}
    assert timings[256] == float("inf") and timings[64] < float("inf") and timings[128] < float("inf")
    (best,) = autotuner(_matmul).cache.values()
    assert best.kwargs["BM"] in (64, 128)
    (pre,) = [e for e in _events(tmp_path) if e["event"] == "precompile"]
    assert "OutOfResources" in pre["rejected"]["0"]  # found when loading, before its first slot
    (decision,) = [e for e in _events(tmp_path) if e["event"] == "decision"]
    assert "OutOfResources" in decision["local_failures"]["0"]  # and confirmed by its launch
    autotuner(_matmul).cache.clear()


def test_a_head_start_keeps_the_hosts_launch_latency_out_of_an_end_to_end_sample():
    """What run_step's head start does for an end-to-end sample: the host's time between launches (here
    a 3 ms pause) is inside the span when the GPU starts idle, and hidden when the GPU first sleeps."""
    import time

    timer = timing.CudaEventTimer(flush_l2=False)
    x = torch.ones(1 << 16, device="cuda")

    def sample(head_start_s: float) -> float:
        torch.cuda.synchronize()
        token = timer.start("step", head_start_s=head_start_s)
        x.add_(1)
        time.sleep(0.003)  # the host preparing the next launch
        x.add_(1)
        done = timer.stop(token)
        torch.cuda.synchronize()
        return done()

    idle, ahead = sample(0.0), sample(0.010)
    assert idle >= 2.5 and ahead < 1.0, (idle, ahead)
    assert torch.equal(x, torch.full_like(x, 5.0))


@pytest.mark.parametrize("lead", [True, False])
def test_a_timed_slots_sample_leaves_out_the_hosts_launch_time(tmp_path, monkeypatch, lead):
    """A config hook that keeps the host 0.5 ms (a TMA descriptor's build, a node busy compiling) lands inside
    a timed slot's span when the GPU waits for the launch; the executor's lead (timing.HostLead) hides it."""
    if not lead:
        monkeypatch.setattr(timing.HostLead, "take", lambda self, now: 0.0)
    kernel = triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=4, pre_hook=busy_host(5e-4))
                                      for b in (1024, 2048)], key=["n"])(triton.jit(_scale))
    n = 1 << 16

    @contextual_autotune(n_warmup=2, n_repeat=5, early_stop=False)
    def op(x: torch.Tensor):
        y = torch.empty_like(x)
        kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
        return y

    x = torch.randn(n, device="cuda")
    torch.testing.assert_close(op(x), 2 * x)
    # 2 configs x 5 timed slots, and more if their near-tie is confirmed
    timed = [e["ms"] for e in _events(tmp_path) if e["event"] == "slot" and e["timed"] and e["ms"] is not None]
    assert len(timed) >= 10, timed
    later = timed[1:]  # the first timed slot comes before any span is known: the default lead
    if lead:  # a 256 KB scale takes microseconds
        assert statistics.median(later) < 0.1 and sum(t > 0.25 for t in later) <= len(later) // 10, timed
    else:
        assert statistics.median(later) > 0.4, timed


def _scale(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask) * 2, mask=mask)


def _scale_kernel() -> Any:
    """A fresh Autotuner (its own cache) over _scale: memory-bound configs close to each other."""
    return triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((1024, 4), (2048, 4),
                                                                                         (4096, 8))],
                           key=["n"])(triton.jit(_scale))


def _side_stream_op(kernel: Any, overlap: bool) -> Any:
    """y = 2x; with `overlap`, a 512 MB copy is queued on a side stream just before the launch (a stand-in
    for an all-gather the kernel overlaps), and the call waits for it at the end."""
    n = 1 << 26
    side = torch.cuda.Stream()
    src, dst = torch.randn(1 << 27, device="cuda"), torch.empty(1 << 27, device="cuda")

    @contextual_autotune(n_warmup=2, n_repeat=5)  # the default objective, "auto"
    def op(x: torch.Tensor):
        y = torch.empty_like(x)
        if overlap:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                dst.copy_(src)
        kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
        torch.cuda.current_stream().wait_stream(side)
        return y

    x = torch.randn(n, device="cuda")
    torch.testing.assert_close(op(x), 2 * x)
    return op


@pytest.mark.parametrize("overlap", [True, False])
def test_a_key_that_overlaps_a_side_streams_work_is_confirmed_end_to_end(tmp_path, overlap):
    _side_stream_op(_scale_kernel(), overlap)
    events = _events(tmp_path)
    (decision,) = [e for e in events if e["event"] == "decision"]
    confirms = [e for e in events if e["event"] == "confirm"]
    assert decision["end_to_end"] is overlap
    assert all(c["end_to_end"] is overlap for c in confirms)
    if overlap:  # memory-bound configs within 15% of each other per launch: at least two are confirmed
        assert len(confirms) == 1 and len(confirms[0]["candidates"]) >= 2
    # The patch on torch.cuda.set_stream is gone after the call.
    from triton_ctx_tune.runtime import streams
    assert streams._patch.installs == 0 and torch.cuda.set_stream.__module__ == "torch.cuda"


def _space() -> list[triton.Config]:
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_stages=s, num_warps=4)
            for bm in (32, 64, 128) for bn in (32, 64, 128) for bk in (32, 64) for s in (2, 3)]


_budgeted_matmul = triton.autotune(configs=_space(), key=["M", "N", "K"])(triton.jit(_matmul.fn.fn))


def test_budgeted_keys_compile_their_new_rungs_together_in_a_step_of_their_own(tmp_path):
    """Two budgeted keys in one function: each new rung's configs compile while the step's launches run a config
    that works, and the rung's first slots come a step later (waited for at each key's launch, their compiles ran
    one after another)."""
    @contextual_autotune(n_warmup=1, n_repeat=2, budget="12 compiles", cache=False)
    def op(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = []
        for x, y in ((a, b), (a, d)):
            M, K = x.shape
            N = y.shape[1]
            c = torch.empty(M, N, device="cuda", dtype=torch.float32)
            _budgeted_matmul[lambda m, M=M, N=N: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))](x, y, c, M, N, K)
            outs.append(c)
        return outs[0], outs[1]

    a = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 384, device="cuda", dtype=torch.float16)
    d = torch.randn(256, 192, device="cuda", dtype=torch.float16)
    c1, c2 = op(a, b, d)
    torch.testing.assert_close(c1, (a.float() @ b.float()), rtol=1e-2, atol=1e-1)
    torch.testing.assert_close(c2, (a.float() @ d.float()), rtol=1e-2, atol=1e-1)
    events = _events(tmp_path)
    decisions = [e for e in events if e["event"] == "decision"]
    assert len(decisions) == 2 and all(e["winner"] is not None for e in decisions)
    later = [(i, e) for i, e in enumerate(events) if e["event"] == "rung" and e["rung"] >= 1 and e["new"]]
    assert later, "no rung after the first explored new configs"
    for i, rung in later:
        key = rung["key"]
        before = [e["step"] for e in events[:i] if e["event"] == "slot" and e["key"] == key]
        after = [e for e in events[i:] if e["event"] == "slot" and e["key"] == key]
        # Planned at step before[-1]'s end; the next step compiles it (no slot of this key); its slots follow.
        assert after and after[0]["step"] == before[-1] + 2
        assert {e["config_index"] for e in after if e["step"] == after[0]["step"]} <= set(rung["configs"])
    autotuner(_budgeted_matmul).cache.clear()


@pytest.fixture
def launcher_builds(tmp_path, monkeypatch) -> list[str]:
    """A fresh Triton cache, and the C compiler's builds of kernel launchers in it, listed as they run (Triton 3.4
    to 3.6 build one per kernel signature at the first load of a binary)."""
    from triton.runtime import build

    from triton_ctx_tune.runtime import compat

    if compat._launcher_builder() is None:
        pytest.skip("this Triton has one launcher for every signature")
    cache = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    with contextlib.suppress(AttributeError):
        monkeypatch.setattr(triton.knobs.cache, "dir", str(cache))
    builds: list[str] = []
    real = build._build

    def counted(name: str, *a: Any, **k: Any) -> Any:
        if name == "__triton_launcher":  # (not the driver's helper module, which a fresh cache dir builds too)
            builds.append(name)
        return real(name, *a, **k)
    monkeypatch.setattr(build, "_build", counted)
    return builds


def test_a_described_configs_launcher_is_built_while_it_compiles_not_at_its_first_load(launcher_builds):
    """Describing a config (precompile does, before a worker compiles it) builds its launcher on a thread, so the
    load runs no C compiler."""
    from triton_ctx_tune.runtime import compat

    builds = launcher_builds
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    out = torch.empty_like(x)
    at = autotuner(_multiply)
    config = at.configs[0]
    described = compat.describe_compile(at, config, (x, out, 1000, 2.5), {"grid": (1,)})
    assert described.spec is not None and not described.cached
    compat.await_launcher(types.SimpleNamespace(src=types.SimpleNamespace(signature=described.spec.signature)))
    assert builds == ["__triton_launcher"]  # built on the thread, before the kernel is compiled
    kernel = compat.compile_only(at, [config], (x, out, 1000, 2.5), {"grid": (1,)})[0]
    compat.load_binary(kernel)
    assert builds == ["__triton_launcher"]  # the load found it in Triton's cache
    _multiply[(1,)](x, out, 1000, 2.5)
    torch.testing.assert_close(out, x * 2.5)

    # Without the description (a kernel of another signature): the load builds its launcher, as Triton does.
    y = torch.zeros(1000, device="cuda", dtype=torch.int32)
    kernel = compat.compile_only(autotuner(_fill), [autotuner(_fill).configs[0]], (y, 1000, 7), {"grid": (1,)})[0]
    compat.load_binary(kernel)
    assert builds == ["__triton_launcher", "__triton_launcher"]


def test_a_first_call_builds_each_kernel_signatures_launcher_once(tmp_path, launcher_builds):
    """The first execution launches whichever of a key's configs compiled first. It waited for the launcher being
    built (compat.prebuild_launcher) only when that was the config it had asked for first; otherwise Triton's load
    ran the C compiler for the same launcher again, on the execution's path (RESULTS.md, section 39)."""
    builds = launcher_builds
    @contextual_autotune(n_warmup=1, n_repeat=2)
    def op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, y = torch.empty_like(x), torch.empty(x.numel(), dtype=torch.int32, device=x.device)
        _scale_many[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](x, out, x.numel(), 3.0)
        _fill_many[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](y, x.numel(), 7)
        return out, y

    x = torch.randn(1 << 16, device="cuda")
    out, y = op(x)
    torch.testing.assert_close(out, x * 3.0)
    assert bool((y == 7).all())
    assert builds == ["__triton_launcher", "__triton_launcher"]  # one per signature, never one more at a launch
    assert len([e for e in _events(tmp_path) if e["event"] == "precompile"]) == 2


_MANY = [triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 512, 1024, 2048) for w in (2, 4, 8)]


@triton.autotune(configs=_MANY, key=["n"])
@triton.jit
def _scale_many(x, out, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * factor, mask=mask)


@triton.autotune(configs=_MANY, key=["n"])
@triton.jit
def _fill_many(y, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.full((BLOCK,), value, tl.int32), mask=offs < n)


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4)], key=["n"])
@triton.jit
def _multiply(x, out, n, factor, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * factor, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4)], key=["n"])
@triton.jit
def _fill(y, n, value, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y + offs, tl.full((BLOCK,), value, tl.int32), mask=offs < n)
