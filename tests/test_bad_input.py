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
           "max_executions", "cache", "cache_dir", "early_stop", "precompile", "compile_threads",
           "compile_workers", "compile_timeout_s",
           "cuda_graph", "quarantine",
           "slot_timeout_s", "objective", "e2e_runs", "validate", "reference", "compare", "atol", "rtol",
           "max_mismatch_ratio"]


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
    with pytest.raises(InvalidOptionError, match=r"e2e_runs=0 is not valid: expected an int >= 1, or None for the default"):
        contextual_autotune(e2e_runs=0)
    with pytest.raises(InvalidOptionError, match=r"compile_timeout_s=0 is not valid: expected a number of seconds "
                       r"greater than 0 \(math.inf: no limit\), or None for the default\."):
        contextual_autotune(compile_timeout_s=0)


FLAG = "1 or 0 (or true/false, yes/no, on/off); unset for the default"
# One bad value per variable the package reads, and what its message must say is accepted.
BAD_ENV = {
    "TRITON_CTX_TUNE_EARLY_STOP": ("abc", "a factor > 1 such as 1.5, 1/on for the default 1.5, or 0/off to turn it off"),
    "TRITON_CTX_TUNE_CACHE": ("ture", FLAG),
    "TRITON_CTX_TUNE_RETUNE": ("please", FLAG),
    "TRITON_CTX_TUNE_PRECOMPILE": ("2", FLAG),
    "TRITON_CTX_TUNE_QUIET": ("silent", FLAG),
    "TRITON_CTX_TUNE_TIMEOUT": ("5m", "a number of seconds, e.g. 120"),
    "TRITON_CTX_TUNE_COMPILE_TIMEOUT": ("-1", "a number of seconds greater than 0"),
    "TRITON_CTX_TUNE_SLOT_TIMEOUT": ("0", "a number of seconds greater than 0"),
    "TRITON_CTX_TUNE_COMPILE_WORKERS": ("-2", "a number of worker processes >= 0 (0: compile on threads only); "
                                        "unset: none unless start_compile_workers() started them"),
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
    table = ROOT.joinpath("docs/options.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(TRITON_CTX_TUNE_[A-Z_]+)` \|", table, re.M))
    assert documented == set(ENVIRONMENT)
    for name in BAD_ENV:
        assert name in ENVIRONMENT
    TuneOptions()  # the test environment itself is valid


# ---- python -m triton_ctx_tune ------------------------------------------------------------------


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    from triton_ctx_tune.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def tune_double(cache: Path) -> None:
    @contextual_autotune(n_warmup=1, n_repeat=1, early_stop=False, cache_dir=cache)
    def op(x: torch.Tensor):
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        return h

    for n in (96, 40):  # two keys, two entries
        x = torch.arange(n, dtype=torch.float32, device=DEVICE)
        torch.testing.assert_close(op(x), x * 2)


def test_cache_clear_in_a_shared_folder_removes_only_our_entries(tmp_path, capsys):
    from triton_ctx_tune import cache as C

    shared = tmp_path / "shared"
    tune_double(shared)
    ours = C.entry_paths(shared)
    assert len(ours) == 2
    damaged = shared / f"double_-{'0' * 64}.json"
    damaged.write_text(f'{{"format": "{C.FORMAT}", "identity": {{')  # ours, truncated
    old = shared / f"double_-{'1' * 64}.json"
    old.write_text('{"format": "triton_ctx_tune.cache/0"}')  # ours, from an older release
    temp = shared / f".{ours[0].name}.k3x_9q.tmp"  # a writer killed before its rename
    temp.write_text("{")
    # A user's own files, one of them even named like an entry.
    user_files = {"settings.json": '{"theme": "dark"}', "notes.txt": "mine",
                  f"mykernel-{'a' * 64}.json": '{"format": "someone-elses/1"}', ".hidden.tmp": "x"}
    for name, text in user_files.items():
        (shared / name).write_text(text)
    (shared / "sub").mkdir()
    (shared / "sub" / "inner.json").write_text("{}")

    code, out, _ = run_cli(capsys, "cache", "list", "--cache-dir", shared)
    assert code == 0 and out.startswith(f"{shared}: 2 entries, 3 invalid\n")
    assert "settings.json" not in out and "notes.txt" not in out
    foreign = shared / f"mykernel-{'a' * 64}.json"
    assert (f"NOT AN ENTRY {foreign}: format is 'someone-elses/1', expected "
            f"'{C.FORMAT}' (named like one, but not written by triton_ctx_tune; `cache clear` leaves it "
            "alone)") in out

    code, out, err = run_cli(capsys, "cache", "clear", "--cache-dir", shared)
    assert code == 0 and err == ""
    assert out.splitlines() == [
        f"removed 4 entries from {shared} and 1 leftover temporary files",
        f"left 5 other files alone, which are not tuning-cache entries: .hidden.tmp, mykernel-{'a' * 64}.json, "
        "notes.txt, settings.json, sub"]
    assert sorted(p.name for p in shared.iterdir()) == sorted([*user_files, "sub"])
    assert {name: (shared / name).read_text() for name in user_files} == user_files
    assert (shared / "sub" / "inner.json").read_text() == "{}"


@pytest.fixture
def logs(tmp_path):
    """The logs of one real tuning call (conftest points the log directory at tmp_path/logs)."""
    tune_double(tmp_path / "c")
    return tmp_path / "logs"


def _nothing_written(directory: Path) -> None:
    assert [p.name for p in directory.iterdir() if p.name != "logs" and p.name != "c"] == []


def test_plot_with_an_unknown_extension_lists_the_supported_ones(logs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code, out, err = run_cli(capsys, "report", logs, "--plot", tmp_path / "x.xyz")
    assert code == 1 and out == ""  # refused before the report
    assert err == (f"triton_ctx_tune: error: cannot write the plot {tmp_path / 'x.xyz'}: matplotlib cannot write .xyz "
                   "files. Fix: end the name with one of .avif, .eps, .gif, .jpeg, .jpg, .pdf, .pgf, .png, .ps, .raw, "
                   ".rgba, .svg, .svgz, .tif, .tiff, .webp (.png if unsure).\n")
    _nothing_written(tmp_path)


def test_plot_without_an_extension_writes_png_and_reports_the_real_name(logs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code, out, err = run_cli(capsys, "report", logs, "--plot", tmp_path / "latency")
    assert code == 0 and err == ""
    assert out.endswith(f"plot written to {tmp_path / 'latency.png'} (no extension was given: PNG)\n")
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "latency").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "latency.png", "logs"]  # no temporary file left


def test_plot_into_a_missing_directory_creates_nothing(logs, tmp_path, capsys):
    for target in (tmp_path / "no" / "such" / "x.png", Path("/nonexistent-triton-ctx-tune-test/dir/x.png")):
        code, out, err = run_cli(capsys, "report", logs, "--plot", target)
        assert code == 1 and out == ""
        assert err == (f"triton_ctx_tune: error: cannot write the plot {target}: the directory {target.parent} does "
                       f"not exist. Fix: create it (mkdir -p {target.parent}) or pass a path in an existing "
                       "directory.\n")
    assert not (tmp_path / "no").exists() and not Path("/nonexistent-triton-ctx-tune-test").exists()
    _nothing_written(tmp_path)


def test_a_plot_that_fails_midway_leaves_the_previous_file_whole(logs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import shutil

    if shutil.which("xelatex"):
        pytest.skip("needs a machine without xelatex, where matplotlib's pgf output fails after it starts writing")
    target = tmp_path / "latency.pgf"
    target.write_text("the previous plot")
    code, out, err = run_cli(capsys, "report", logs, "--plot", target)
    assert code == 1 and "double_" in out  # the text report was printed
    assert err.startswith(f"triton_ctx_tune: error: matplotlib could not write the plot {target} (RuntimeError: "
                          "'xelatex' not found")
    assert err.endswith("Fix: choose .png, .svg or .pdf.\n") and "Traceback" not in err
    assert target.read_text() == "the previous plot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "latency.pgf", "logs"]
