"""online=True: the function runs once per call; calls take the keys' slots until every key is decided."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests import kernels as K
from tests.kernels import DEVICE, grid
from triton_ctx_tune import contextual_autotune
from triton_ctx_tune.errors import InvalidOptionError
from triton_ctx_tune.tools.report import build, format_report

N = 128
# precompile=False: each config compiles at its first slot, so the number of calls is exact (with
# background compiles, a call that finds a key's compiles unfinished runs a ready config, untimed).
ONLINE = dict(online=True, n_warmup=1, n_repeat=2, early_stop=False, cache=False, precompile=False)
KEY = (N, "torch.float32")


def _decide(fn, *args, limit: int = 30) -> int:
    """Call `fn` until its session ends; the number of calls it took."""
    for calls in range(1, limit + 1):
        fn(*args)
        if fn._online is None:
            return calls
    raise AssertionError(f"not decided in {limit} calls")


def test_each_call_runs_once_and_in_place_kernels_apply_once_without_restore_value():
    runs = {"n": 0}

    @contextual_autotune(**ONLINE)
    def step(x):
        runs["n"] += 1
        K.double_[grid(N)](x, N)  # in place, no restore_value: each launch runs once
        K.add_one_[grid(N)](x, N)
        return x

    x = torch.zeros(N, device=DEVICE)
    calls = _decide(step, x)
    # 3 configs x 3 slots (1 warm-up, 2 timed) per key, one slot per launch.
    assert calls == runs["n"] == 9
    expected = torch.zeros(N, device=DEVICE)
    for _ in range(calls):
        expected = expected * 2 + 1
    assert torch.equal(x, expected)
    assert K.chosen(K.double_) == {KEY: 32} and K.chosen(K.add_one_) == {KEY: 64}
    assert [k.config.split(",")[0] for k in step.last_call.tuned] == ["BLOCK=32", "BLOCK=64"]
    step(x)  # warm: no session
    assert step._online is None and step.last_call.executions == 1 and runs["n"] == 10
    assert torch.equal(x, expected * 2 + 1)
    # The report tells the cost of tuning online: the calls each key took, and when it was decided.
    report = build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]))
    (online,) = report.online.values()
    assert online.calls == 9 and len(online.wall_s) == 9
    assert online.key_calls == {"double_ key=(128, 'torch.float32')": 9, "add_one_ key=(128, 'torch.float32')": 9}
    assert online.decided_at == {"double_ key=(128, 'torch.float32')": 9, "add_one_ key=(128, 'torch.float32')": 9}
    # Against the tuned call's time: the session's fastest call (the calls after it are not logged).
    walls = [e["wall_s"] for e in _online_events()]
    tuned = min(walls)
    assert online.sessions and [c.wall_s for c in online.sessions[0]] == walls
    text = format_report(report)
    assert (f"step: tuned online over 9 calls ({_secs(sum(walls))}), {_secs(sum(walls) - 9 * tuned)} above "
            "9 tuned calls\n") in text
    assert f"  tuned call {_secs(tuned)}: the session's fastest, call {walls.index(tuned) + 1} " in text
    for name in ("double_", "add_one_"):
        assert (f"  {name} key=(128, 'torch.float32'): 9 calls until decided at call 9 (9 slots), "
                f"{_secs(sum(w - tuned for w in walls))} above the tuned call") in text


def _online_events() -> list[dict]:
    log = Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"]) / "rank-0.jsonl"
    return [e for line in log.read_text().splitlines() if (e := json.loads(line))["event"] == "online-call"]


def _secs(s: float) -> str:
    return f"{s:.3f} s" if abs(s) >= 1 else f"{s * 1e3:.3f} ms"


def test_the_report_counts_each_key_until_its_own_decision_and_each_session_apart():
    """A key of 2 configs is decided at call 6 while one of 3 takes 9 calls: its cost stops at call 6. A new shape
    in a later call starts a second session, with calls numbered from 1 and a tuned call of its own."""
    @contextual_autotune(**ONLINE)
    def step(x):
        K.double_[grid(x.numel())](x, x.numel())
        K.early_pruned_add_one_[grid(x.numel())](x, x.numel())  # 16 and 32 (64 and 128 pruned): 6 slots
        return x

    big, small = torch.zeros(N, device=DEVICE), torch.zeros(40, device=DEVICE)
    assert _decide(step, big) == 9
    step(big)  # warm: not logged
    assert _decide(step, small) == 9
    events = _online_events()
    assert [e["call"] for e in events] == list(range(1, 10)) * 2
    (online,) = build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])).online.values()
    assert online.calls == 18 and [len(s) for s in online.sessions] == [9, 9]
    text = format_report(build(Path(os.environ["TRITON_CTX_TUNE_LOG_DIR"])))
    assert "step: tuned online over 18 calls in 2 sessions\n" in text
    for n, (session, size) in enumerate(((events[:9], N), (events[9:], 40)), 1):
        walls = [e["wall_s"] for e in session]
        tuned = min(walls)
        assert (f"  session {n}: 9 calls ({_secs(sum(walls))}), {_secs(sum(walls) - 9 * tuned)} above 9 tuned "
                "calls\n") in text
        assert (f"    double_ key=({size}, 'torch.float32'): 9 calls until decided at call 9 (9 slots), "
                f"{_secs(sum(w - tuned for w in walls))} above the tuned call") in text
        assert (f"    early_pruned_add_one_ key=({size}, 'torch.float32'): 6 calls until decided at call 6 (6 slots), "
                f"{_secs(sum(w - tuned for w in walls[:6]))} above the tuned call") in text


def test_with_background_compiles_no_call_waits_for_more_than_a_ready_config():
    @contextual_autotune(**{**ONLINE, "precompile": True})
    def step(x):
        K.double_[grid(N)](x, N)
        return x

    x = torch.ones(N, device=DEVICE)
    calls = _decide(step, x, limit=500)
    # The first call's launch stands in for config 0's warm-up; once every config is compiled and
    # loaded the other warm-ups are dropped: 3 configs x 2 timed slots. A call that found the compiles
    # unfinished ran a ready config, untimed, and took no slot (none under the interpreter, where compiling
    # is instant; on a GPU, as many as the compiles take).
    slots = [sum(k["slots"] for k in e["keys"]) for e in _online_events()]
    assert len(slots) == calls and slots == [1] + [0] * (calls - 7) + [1] * 6
    assert K.chosen(K.double_) == {KEY: 32} and torch.equal(x, torch.full((N,), 2.0 ** calls, device=DEVICE))


def test_a_new_key_in_a_later_call_starts_its_slots_there():
    @contextual_autotune(**ONLINE)
    def step(x):
        K.add_one_[grid(x.numel())](x, x.numel())
        return x

    big, small = torch.zeros(N, device=DEVICE), torch.zeros(40, device=DEVICE)
    assert _decide(step, big) == 9
    step(small)  # a new shape: its session starts in this call
    assert step._online is not None
    assert _decide(step, small) == 8
    assert K.chosen(K.add_one_) == {KEY: 64, (40, "torch.float32"): 16}
    assert torch.equal(small, torch.full((40,), 9.0, device=DEVICE))  # 9 calls, each added one


def test_an_online_training_step_equals_plain_steps():
    torch.manual_seed(0)
    tuned_model, plain_model = torch.nn.Linear(N, 4).to(DEVICE), torch.nn.Linear(N, 4).to(DEVICE)
    plain_model.load_state_dict(tuned_model.state_dict())
    tuned_opt = torch.optim.AdamW(tuned_model.parameters(), lr=0.1)
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=0.1)
    x = torch.linspace(-1, 1, N, device=DEVICE)

    def step(model, opt, x, plain=False):
        opt.zero_grad()
        h = x.clone()
        if plain:
            h = h * 2
        else:
            K.double_[grid(N)](h, N)
        loss = model(h).square().sum()
        loss.backward()
        opt.step()
        return loss.detach()

    tuned = contextual_autotune(**ONLINE)(step)
    losses = [tuned(tuned_model, tuned_opt, x) for _ in range(12)]
    plain = [step(plain_model, plain_opt, x, plain=True) for _ in range(12)]
    assert tuned._online is None and K.chosen(K.double_) == {KEY: 32}
    assert all(torch.equal(a, b) for a, b in zip(losses, plain))
    for p, q in zip(tuned_model.parameters(), plain_model.parameters()):
        assert torch.equal(p, q) and torch.equal(tuned_opt.state[p]["exp_avg"], plain_opt.state[q]["exp_avg"])
    assert float(tuned_opt.state[tuned_model.weight]["step"]) == 12.0


@pytest.mark.parametrize("options", [dict(validate=True), dict(objective="end_to_end")])
def test_online_refuses_what_needs_re_execution(options):
    with pytest.raises(InvalidOptionError, match=r"online=True is not valid: expected False with "):
        contextual_autotune(online=True, **options)


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_online_ranks_take_the_same_calls_and_a_rank_that_launches_more_is_named(world, tmp_path):
    from tests.test_dist import run_ranks

    results = run_ranks(world, ["online", "online_mismatch", "online_defaults"], tmp_path,
                        worker="exactly_once_worker.py")
    rows = results["online"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["calls"] == 9 and row["runs"] == 10 and row["x_ok"]
        assert row["chosen"] == {"(128, 'torch.float32')": 32}
    rows = results["online_mismatch"]
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["outcome"].startswith("RankMismatchError"), row["outcome"]
        assert row["runs"] == 3  # the third call, where rank 1 launched another key, raised on every rank
    rows = results["online_defaults"]  # issue 38: this hung at 2 ranks with split screening on
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["runs"] == 40 and row["x_ok"]  # one execution per call; each call's writes applied once
        assert row["decided_at"] is not None and row["decided_at"] <= 20, row
        assert set(row["chosen"]) == {"double_(128, 'torch.float32')", "add_one_(128, 'torch.float32')"}
    assert all(row["chosen"] == rows[0]["chosen"] and row["decided_at"] == rows[0]["decided_at"] for row in rows)


def test_online_a_config_that_cannot_compile_never_skips_the_programs_launch():
    """Online, every launch is the program's own: the first slot's config (BLOCK=128) cannot compile, and
    no config has run yet, so another one runs in its place (the soak found such launches skipped)."""
    @contextual_autotune(**ONLINE)
    def step(x):
        K.limited_add_one_[grid(N)](x, N, LIMIT=64)
        return x

    x = torch.zeros(N, device=DEVICE)
    calls = _decide(step, x)
    assert torch.equal(x, torch.full((N,), float(calls), device=DEVICE))  # every call added one
    assert K.chosen(K.limited_add_one_) == {KEY: 64}
