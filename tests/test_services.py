"""Session hands its executor and its deciding and validating halves services, not itself, and the
services are built lazily."""
from __future__ import annotations

from triton_ctx_tune.engine.session import Session
from triton_ctx_tune.options import TuneOptions

LAZY = ("comm", "timer", "log", "cache", "quarantine", "progress", "early_stop")


def test_services_build_nothing_until_used() -> None:
    session = Session("f", TuneOptions(validate=True, log_dir=False, cache=False))
    assert session.checks is not None and session.checks.services is session.decisions.services
    assert not [name for name in LAZY if name in session.services.__dict__]  # nothing tuned: none built
    assert session.executor.services is session.services  # the executor gets the services, not the session
    services = session.decisions.services
    assert services.comm is session.comm and services.log is session.log and services.cache is None
    assert services.new_states is session.new_states
    before = session.new_states
    session.begin_step()  # the executor starts a new list each step: the services see the new one
    assert services.new_states is session.executor.new_states and services.new_states is not before
    assert services.misses is session.executor.misses
    session.close()


def test_point_decided_reaches_the_hook_with_the_session() -> None:
    session = Session("f", TuneOptions(log_dir=False, cache=False))
    seen = []
    session.decisions.services.point_decided({"winner": 0})  # no hook set: nothing happens
    session.on_point_decided = lambda s, decided: seen.append((s, decided))
    session.decisions.services.point_decided({"winner": 1})
    assert seen == [(session, {"winner": 1})]
