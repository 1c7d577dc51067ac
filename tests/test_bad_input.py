"""Bad input, tried as a new user would: each case fails before any work with an error that names the fix."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests import kernels as K
from tests.kernels import DEVICE, grid
from triton_ctx_tune import InvalidOptionError, contextual_autotune
from triton_ctx_tune.errors import UnknownOptionError
from triton_ctx_tune.options import ENVIRONMENT, TuneOptions

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = ["is_dist", "n_repeat", "n_warmup", "group", "reduce", "stat", "flush_l2", "log_dir", "quiet", "timeout_s",
           "max_executions", "cache", "cache_dir", "early_stop", "precompile", "compile_threads"]


def test_misspelt_keyword_names_the_closest_option_and_lists_them_all():
    with pytest.raises(UnknownOptionError) as info:
        contextual_autotune(n_repet=5)
    msg = str(info.value)
    assert msg.startswith("n_repet=5 is not valid: expected one of the known options: ")
    assert msg.endswith(". Did you mean n_repeat=5?")
    listed = msg.split("known options: ", 1)[1].split(". Did you mean", 1)[0].split(", ")
    assert listed == OPTIONS  # all of them, is_dist, n_repeat and n_warmup included
    assert info.value.closest == "n_repeat" and isinstance(info.value, InvalidOptionError)
    with pytest.raises(UnknownOptionError, match=r"isdist=True is not valid: .* Did you mean is_dist=True\?"):
        contextual_autotune(isdist=True)
    with pytest.raises(UnknownOptionError) as info:
        contextual_autotune(frobnicate=1)
    assert "Did you mean" not in str(info.value) and info.value.closest is None


FLAG = "1 or 0 (or true/false, yes/no, on/off); unset for the default"
# One bad value per variable the package reads, and what its message must say is accepted.
BAD_ENV = {
    "TRITON_CTX_TUNE_EARLY_STOP": ("abc", "a factor > 1 such as 1.5, 1/on for the default 1.5, or 0/off to turn it off"),
    "TRITON_CTX_TUNE_CACHE": ("ture", FLAG),
    "TRITON_CTX_TUNE_RETUNE": ("please", FLAG),
    "TRITON_CTX_TUNE_PRECOMPILE": ("2", FLAG),
    "TRITON_CTX_TUNE_QUIET": ("silent", FLAG),
    "TRITON_CTX_TUNE_TIMEOUT": ("5m", "a number of seconds, e.g. 120"),
}


@pytest.mark.parametrize("name", list(BAD_ENV))
def test_bad_environment_variable_fails_where_the_decorator_is_built(tmp_path, monkeypatch, name):
    value, accepted = BAD_ENV[name]
    cache = tmp_path / "c"
    runs = {"n": 0}

    def op(x: torch.Tensor):
        runs["n"] += 1
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        return h

    # Tuned once with a clean environment: a later call has every key cached and reads few variables.
    contextual_autotune(n_warmup=1, n_repeat=1, early_stop=False, cache_dir=cache)(op)(
        torch.arange(96, dtype=torch.float32, device=DEVICE))
    assert runs["n"] == 3 * 2 + 1
    K.reset_caches()
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidOptionError) as info:
        contextual_autotune(n_warmup=1, n_repeat=1, early_stop=False, cache_dir=cache)
    assert str(info.value) == f"{name}={value!r} is not valid: expected {accepted}."
    with pytest.raises(InvalidOptionError, match=re.escape(f"{name}={value!r} is not valid")):
        contextual_autotune(op)  # the bare decorator too
    assert runs["n"] == 3 * 2 + 1


def test_every_environment_variable_the_package_reads_is_checked_and_documented():
    read = set()
    for path in (ROOT / "triton_ctx_tune").glob("*.py"):
        read |= set(re.findall(r"TRITON_CTX_TUNE_[A-Z_]+[A-Z]", path.read_text()))
    assert read == set(ENVIRONMENT), "a variable is read but not checked when the decorator is built, or vice versa"
    table = ROOT.joinpath("README.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(TRITON_CTX_TUNE_[A-Z_]+)` \|", table, re.M))
    assert documented == set(ENVIRONMENT)
    for name in BAD_ENV:
        assert name in ENVIRONMENT
    TuneOptions()  # the test environment itself is valid
