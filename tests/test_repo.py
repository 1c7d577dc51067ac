"""The repository keeps its promises: CI runs the README's test command, and launch documents its knobs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from triton_ctx_tune.runtime.compat import OLDEST_TORCH, SUPPORTED

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    quickstart = ROOT.joinpath("README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", quickstart, re.S)
    assert block, "README's Quickstart has no code block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_quickstart_is_two_commands_and_ci_runs_the_test_one_verbatim():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert "launch examples/tp_mlp.py" in commands[0]
    ci = ROOT.joinpath(".ci/run").read_text()
    lines = [line.strip() for line in ci.splitlines()]
    assert lines.count(commands[1]) == 1
    # It runs first, then the suite again on the oldest Triton that compat.py supports...
    run_order = [line for line in lines if line in ("readme_test_command", '"$VENV/bin/python" -m pytest -q tests')]
    assert run_order == ["readme_test_command", '"$VENV/bin/python" -m pytest -q tests']
    oldest = ".".join(map(str, SUPPORTED[0]))
    assert f"OLDEST_TRITON={oldest}.0 " in ci and '"triton==$OLDEST_TRITON"' in ci
    # ... with the oldest torch that setup.py allows, which compat.py warns below.
    torch_floor = ".".join(map(str, OLDEST_TORCH))
    assert f"OLDEST_TORCH={torch_floor}.0 " in ci and '"torch==$OLDEST_TORCH"' in ci
    assert f'"torch>={torch_floor}"' in ROOT.joinpath("setup.py").read_text()
    assert "set -euo pipefail" in lines


def test_launch_help_names_every_knob_python_first():
    out = subprocess.run([str(ROOT / "launch"), "--help"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHON=sys.executable))
    assert out.returncode == 0
    knobs = [line.split()[0] for line in out.stdout.splitlines() if re.match(r"  [A-Z_]+ {2,}", line)]
    assert knobs == ["PYTHON", "NPROC", "TRITON_CTX_TUNE_DEVICE", "MASTER_PORT"]  # virtualenv users read PYTHON first
    assert "PYTHON=.venv/bin/python ./launch" in out.stdout


def test_readme_is_short_and_every_option_is_documented():
    import dataclasses

    from triton_ctx_tune.options import TuneOptions

    readme = ROOT.joinpath("README.md")
    assert readme.stat().st_size < 10_000, "the README is for a newcomer's first ten minutes: move depth into docs/"
    linked = set(re.findall(r"\]\((docs/[\w./-]+?\.md)(?:#[\w-]*)?\)", readme.read_text()))
    assert "docs/options.md" in linked
    missing = sorted(page for page in linked if not ROOT.joinpath(page).is_file())
    assert not missing, f"README links docs pages that do not exist: {missing}"
    options = ROOT.joinpath("docs/options.md").read_text()
    undocumented = [f.name for f in dataclasses.fields(TuneOptions) if f"`{f.name}`" not in options]
    assert not undocumented, f"TuneOptions fields not named in docs/options.md: {undocumented}"
