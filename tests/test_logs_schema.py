"""The log event schema has one home (logs.EVENTS): every event the package writes is declared there,
and report.py reads or, with a reason, ignores every declared kind."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from triton_ctx_tune.tools import report
from triton_ctx_tune.tools.logs import EVENTS, RankLog, UnknownEventError

PACKAGE = Path(__file__).resolve().parents[1] / "triton_ctx_tune"


def _log_writes() -> list[tuple[str, int, ast.Call]]:
    """Every call that writes a log event: `<...>.log.write(...)` or `log.write(...)` anywhere, and RankLog's own
    `self.write(...)`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "write"):
                continue
            owner = node.func.value
            on_log = (isinstance(owner, ast.Attribute) and owner.attr == "log") or (
                isinstance(owner, ast.Name) and owner.id == "log")
            on_self_in_logs = path.name == "logs.py" and isinstance(owner, ast.Name) and owner.id == "self"
            if on_log or on_self_in_logs:
                found.append((path.name, node.lineno, node))
    return found


def test_every_written_kind_is_declared() -> None:
    writes = _log_writes()
    assert len(writes) >= len(EVENTS)  # the scan sees the writers at all
    written = set()
    for where, line, call in writes:
        first = call.args[0] if call.args else None
        assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
            f"{where}:{line}: a log event's kind must be a literal, so that this test can check it")
        kind = first.value
        assert kind in EVENTS, f"{where}:{line} writes the event kind {kind!r}, which logs.EVENTS does not declare"
        written.add(kind)
        if not any(k.arg is None for k in call.keywords):  # no **fields: every field is named here
            missing = EVENTS[kind].fields - {k.arg for k in call.keywords}
            assert not missing, f"{where}:{line}: a {kind!r} event without its declared fields {sorted(missing)}"
    assert written == set(EVENTS), f"declared but never written: {sorted(set(EVENTS) - written)}"


def test_report_reads_or_ignores_every_declared_kind() -> None:
    assert report.schema_gaps() == []
    assert all(reason.strip() for reason in report.IGNORED.values())


def test_spec_names_its_kind() -> None:
    assert all(spec.kind == kind and spec.about for kind, spec in EVENTS.items())


@pytest.mark.parametrize("log_dir", [None, "dir"])
def test_write_refuses_an_undeclared_kind(tmp_path: Path, log_dir: str | None) -> None:
    log = RankLog(None if log_dir is None else tmp_path / log_dir, 0, quiet=True)
    with pytest.raises(UnknownEventError, match="'decison' is not declared"):
        log.write("decison", "a typo")
    with pytest.raises(UnknownEventError, match=r"lacks the fields \['path'\]"):
        log.write("cache-store", "cache-store without its path")
    log.write("cache-store", "cache-store -> somewhere", path="somewhere")
    log.close()
    if log_dir is not None:
        (record,) = [json.loads(s) for s in (tmp_path / log_dir / "rank-0.jsonl").read_text().splitlines()]
        assert (record["event"], record["path"]) == ("cache-store", "somewhere")
