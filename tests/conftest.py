"""Test setup: real Triton kernels, interpreted on the CPU when there is no GPU."""
from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before any @triton.jit runs: the decorator picks the interpreter at definition time.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the device machine)")
    config.addinivalue_line("markers", "dist: starts several real processes with torch.distributed")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The versions under test, in every run's last lines: CI runs the suite on two Tritons."""
    import platform

    import numpy
    import triton

    where = "GPU" if HAS_CUDA else "CPU, Triton's interpreter"
    terminalreporter.write_line(f"versions: Python {platform.python_version()}, torch {torch.__version__}, "
                                f"triton {triton.__version__}, numpy {numpy.__version__} ({where})")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _session_cache_dir(tmp_path_factory):
    """Module-scoped fixtures (test_dist's ranks) start before _isolated: keep them off ~/.cache too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CTX_TUNE_CACHE_DIR", str(tmp_path_factory.mktemp("session-cache")))
        yield


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Each test logs into its own folder, tunes against an empty persistent cache of its own
    (tests count executions and expect tuning every time) and starts with empty autotuner caches."""
    from tests import kernels

    monkeypatch.setenv("TRITON_CTX_TUNE_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("TRITON_CTX_TUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_CTX_TUNE_QUIET", "1")
    kernels.reset_caches()
    yield
    kernels.reset_caches()
