"""Session hands its deciding and validating halves services, not itself, and still builds them lazily."""
from __future__ import annotations

from triton_ctx_tune.options import TuneOptions
from triton_ctx_tune.engine.session import Session

LAZY = ("comm", "log", "cache", "progress", "early_stop")


def test_services_build_nothing_until_used() -> None:
    session = Session("f", TuneOptions(validate=True, log_dir=False, cache=False))
    assert session.checks is not None and session.checks.services is session.decisions.services
    assert not [name for name in LAZY if name in session.__dict__]  # a session that tunes nothing builds none
    services = session.decisions.services
    assert services.comm is session.comm and services.log is session.log and services.cache is None
    assert services.new_states is session.new_states
    session.new_states = []  # rebound at each step's end: the services see the new list
    assert services.new_states is session.new_states
    session.close()


def test_point_decided_reaches_the_hook_with_the_session() -> None:
    session = Session("f", TuneOptions(log_dir=False, cache=False))
    seen = []
    session.decisions.services.point_decided({"winner": 0})  # no hook set: nothing happens
    session.on_point_decided = lambda s, decided: seen.append((s, decided))
    session.decisions.services.point_decided({"winner": 1})
    assert seen == [(session, {"winner": 1})]
