"""Bad input, tried as a new user would: each case fails before any work with an error that names the fix."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import kernels as K
from tests.kernels import DEVICE, grid
from triton_ctx_tune import (
    InvalidOptionError,
    NoValidConfigError,
    autotune,
    carry,
    contextual_autotune,
    start_compile_workers,
)
from triton_ctx_tune.errors import (
    CacheError,
    CtxTuneError,
    NoProcessGroupError,
    NothingToValidateError,
    NoValidPointError,
    UnknownOptionError,
    UserHookError,
)
from triton_ctx_tune.options import ENVIRONMENT, TuneOptions
from triton_ctx_tune.runtime.compat import Autotuner

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = ["is_dist", "n_repeat", "n_warmup", "group", "reduce", "stat", "flush_l2", "log_dir", "quiet", "timeout_s",
           "max_executions", "cache", "cache_dir", "config_path", "early_stop", "precompile", "compile_threads",
           "compile_workers", "compile_timeout_s",
           "cuda_graph", "quarantine",
           "slot_timeout_s", "objective", "confirm", "split_screening", "e2e_runs", "validate", "reference", "compare",
           "atol", "rtol",
           "max_mismatch_ratio", "exactly_once", "snapshot_limit_mb", "online", "buckets", "freeze", "flops", "bytes",
           "budget"]


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
    with pytest.raises(InvalidOptionError,
                       match=r"e2e_runs=0 is not valid: expected an int >= 1, or None for the default"):
        contextual_autotune(e2e_runs=0)
    with pytest.raises(InvalidOptionError, match=r"compile_timeout_s=0 is not valid: expected a number of seconds "
                       r"greater than 0 \(math.inf: no limit\), or None for the default\."):
        contextual_autotune(compile_timeout_s=0)


FLAG = "1 or 0 (or true/false, yes/no, on/off); unset for the default"
# One bad value per variable the package reads, and what its message must say is accepted.
BAD_ENV = {
    "TRITON_CTX_TUNE_EARLY_STOP": ("abc",
                                   "a factor > 1 such as 1.5, 1/on for the default 1.5, or 0/off to turn it off"),
    "TRITON_CTX_TUNE_CACHE": ("ture", FLAG),
    "TRITON_CTX_TUNE_RETUNE": ("please", FLAG),
    "TRITON_CTX_TUNE_PRECOMPILE": ("2", FLAG),
    "TRITON_CTX_TUNE_QUIET": ("silent", FLAG),
    "TRITON_CTX_TUNE_QUARANTINE": ("maybe", FLAG),
    "TRITON_CTX_TUNE_TIMEOUT": ("5m", "a number of seconds, e.g. 120"),
    "TRITON_CTX_TUNE_COMPILE_TIMEOUT": ("-1", "a number of seconds greater than 0"),
    "TRITON_CTX_TUNE_SLOT_TIMEOUT": ("0", "a number of seconds greater than 0"),
    "TRITON_CTX_TUNE_COMPILE_WORKERS": ("-2", "a number of worker processes >= 0 (0: compile on threads only); "
                                        "unset: none unless start_compile_workers() started them"),
    "TRITON_CTX_TUNE_SNAPSHOT_LIMIT_MB": ("lots", "a number of MiB >= 0 (inf: no limit); unset for 4096"),
    "TRITON_CTX_TUNE_FREEZE": ("always", FLAG),
    "TRITON_CTX_TUNE_CONFIRM": ("twice", FLAG),
    "TRITON_CTX_TUNE_SPLIT_SCREENING": ("halves", FLAG),
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
    for path in (ROOT / "triton_ctx_tune").rglob("*.py"):
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
    from triton_ctx_tune.tools.cli import main

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
    from triton_ctx_tune.store import cache as C

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


# ---- the table: every public entry point, misused as users do ---------------------------------------
#
# Each row is one misuse. The test calls it and checks the error's class (CtxTuneError or one of its
# subclasses; InvalidOptionError for an argument), that the message names what was wrong and the fix
# (`says`), that the user's own exception is chained (`cause`), and that nothing changed: no file
# written or removed in the test's folder (the tuning cache and its quarantine folder included; the
# logs of a call that ran are the one exception), Autotuner.run patched exactly as before, no call
# left open, no kernel's tuned config installed. docs/reliability.md states len(MISUSES).


class LaunchRefused(Exception):
    """./launch is a shell script: its error is exit status 2 with one line on stderr, before any rank starts."""


@dataclass(frozen=True)
class Ctx:
    tmp: Path
    env: pytest.MonkeyPatch


@dataclass(frozen=True)
class Misuse:
    name: str
    act: Callable[[Ctx], object]
    error: type[Exception]
    says: tuple[str, ...]  # the argument (or hook, or file) named, and the fix
    cause: type[BaseException] | None = None  # the user's own exception, chained with `raise ... from`
    runs: bool = False  # the error comes after the function's first execution (it needs the result)
    setup: Callable[[Ctx], None] | None = None  # files the misuse reads, made before the state is taken
    argv: tuple[str, ...] | None = None  # a CLI row: main() must also exit 1 with the message


FAST = dict(n_warmup=1, n_repeat=1, early_stop=False)


def _double(x: torch.Tensor) -> torch.Tensor:
    h = x.clone()
    K.double_[grid(h.numel())](h, h.numel())
    return h


def _x() -> torch.Tensor:
    return torch.arange(64, dtype=torch.float32, device=DEVICE)


def _ctx_call(fn: Callable[..., Any] = _double, **options: Any) -> Callable[[Ctx], object]:
    return lambda c: contextual_autotune(**{**FAST, **options})(fn)(_x())


def _op(x: torch.Tensor, chunks: int = 1) -> torch.Tensor:
    return _double(x)


def _fn_call(config_space: Any = ({"chunks": 1}, {"chunks": 2}), fn: Callable[..., Any] = _op, *,
             switches: dict[str, Any] | None = None, kwargs: dict[str, Any] | None = None,
             **options: Any) -> Callable[[Ctx], object]:
    space = list(config_space) if isinstance(config_space, tuple) else config_space
    return lambda c: autotune(space, **{**FAST, **options})(fn)(_x(), **(switches or {}), **(kwargs or {}))


def _decorate(**options: Any) -> Callable[[Ctx], object]:
    return lambda c: contextual_autotune(**options)


def _raise(e: BaseException) -> Callable[..., Any]:
    def hook(*args: Any, **kwargs: Any) -> Any:
        raise e
    return hook


def _env_then_decorate(name: str, value: str) -> Callable[[Ctx], object]:
    def act(c: Ctx) -> object:
        c.env.setenv(name, value)
        return contextual_autotune(**FAST)
    return act


def _cli(*argv: str) -> Callable[[Ctx], object]:
    """Run a command as main() does, but let its error out, so that its class can be checked."""
    from triton_ctx_tune.tools.cli import build_parser

    def act(c: Ctx) -> object:
        args = build_parser().parse_args([a.format(tmp=c.tmp) for a in argv])
        return args.run(args)
    return act


def _cli_row(name: str, argv: tuple[str, ...], error: type[Exception], says: tuple[str, ...],
             setup: Callable[[Ctx], None] | None = None, env: dict[str, str] | None = None) -> Misuse:
    act = _cli(*argv)
    if env:
        inner = act

        def act(c: Ctx) -> object:
            for k, v in env.items():
                c.env.setenv(k, v.format(tmp=c.tmp))
            return inner(c)
    return Misuse(name, act, error, says, setup=setup, argv=argv)


def _write(name: str, text: str) -> Callable[[Ctx], None]:
    return lambda c: (c.tmp / name).write_text(text)


def _launch(**env: str) -> Callable[[Ctx], object]:
    def act(c: Ctx) -> object:
        script = c.tmp / "touch.py"
        script.write_text(f"open({str(c.tmp / 'ran')!r}, 'w').close()\n")
        base = {k: v for k, v in os.environ.items() if k not in ("NPROC", "TRITON_CTX_TUNE_DEVICE", "PYTHON")}
        proc = subprocess.run([str(ROOT / "launch"), str(script)], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env={**base, "PYTHON": sys.executable, **env})
        script.unlink()
        if proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1:
            raise LaunchRefused(proc.stderr.strip())
        return proc
    return act


def _ahead(sizes: Any, inputs_for: Any = None, spread: bool = False, **options: Any) -> Callable[[Ctx], object]:
    return lambda c: contextual_autotune(**{**FAST, **options})(_double).tune_ahead(sizes, inputs_for, spread=spread,
                                                                                   timed_runs=1)


def _none(x: torch.Tensor) -> None:
    _double(x)  # writes into a copy it never returns: validation would have nothing to compare


def _export_with_a_bad_entry(c: Ctx) -> None:
    from triton_ctx_tune.store import cache as C

    (c.tmp / "export.json").write_text(json.dumps({"format": C.EXPORT_FORMAT, "entries": [{"format": C.FORMAT}]}))


MISUSES: list[Misuse] = [
    # contextual_autotune's arguments: refused where the decorator is built
    Misuse("n_repeat=0", _decorate(n_repeat=0), InvalidOptionError, ("n_repeat=0", "expected an int >= 1")),
    Misuse("n_warmup=-1", _decorate(n_warmup=-1), InvalidOptionError, ("n_warmup=-1", "expected an int >= 0")),
    Misuse("n_repeat='5'", _decorate(n_repeat="5"), InvalidOptionError, ("n_repeat='5'", "expected an int >= 1")),
    Misuse("misspelt option", _decorate(n_repet=5), UnknownOptionError, ("n_repet=5", "Did you mean n_repeat=5?")),
    Misuse("is_dist='yes'", _decorate(is_dist="yes"), InvalidOptionError, ("is_dist='yes'", "True or False")),
    Misuse("reduce", _decorate(reduce="sum"), InvalidOptionError, ("reduce='sum'", "'max' or 'mean'")),
    Misuse("stat", _decorate(stat="avg"), InvalidOptionError, ("stat='avg'", "'median'")),
    Misuse("objective", _decorate(objective="e2e"), InvalidOptionError, ("objective='e2e'", "'end_to_end'")),
    Misuse("timeout_s=0", _decorate(timeout_s=0), InvalidOptionError, ("timeout_s=0", "greater than 0")),
    Misuse("early_stop=0.5", _decorate(early_stop=0.5), InvalidOptionError, ("early_stop=0.5", "a factor > 1")),
    Misuse("cache='yes'", _decorate(cache="yes"), InvalidOptionError, ("cache='yes'", "True, False or None")),
    Misuse("cache_dir=42", _decorate(cache_dir=42), InvalidOptionError, ("cache_dir=42", "a directory path")),
    Misuse("config_path=3", _decorate(config_path=3), InvalidOptionError,
           ("config_path=3", "a directory path or a list of them", "`cache export --ship`")),
    Misuse("precompile=1", _decorate(precompile=1), InvalidOptionError, ("precompile=1", "True, False or None")),
    Misuse("compile_threads=0", _decorate(compile_threads=0), InvalidOptionError, ("compile_threads=0", "an int >= 1")),
    Misuse("compile_workers=-1", _decorate(compile_workers=-1), InvalidOptionError,
           ("compile_workers=-1", "an int >= 0")),
    Misuse("compile_timeout_s=0", _decorate(compile_timeout_s=0), InvalidOptionError,
           ("compile_timeout_s=0", "greater than 0")),
    Misuse("slot_timeout_s=0", _decorate(slot_timeout_s=0), InvalidOptionError, ("slot_timeout_s=0", "greater than 0")),
    Misuse("quarantine='on'", _decorate(quarantine="on"), InvalidOptionError, ("quarantine='on'",
                                                                               "True, False or None")),
    Misuse("e2e_runs=0", _decorate(e2e_runs=0), InvalidOptionError, ("e2e_runs=0", "an int >= 1")),
    Misuse("exactly_once='yes'", _decorate(exactly_once="yes"), InvalidOptionError,
           ("exactly_once='yes'", "True or False")),
    Misuse("snapshot_limit_mb=-1", _decorate(snapshot_limit_mb=-1), InvalidOptionError,
           ("snapshot_limit_mb=-1", "a number of MiB >= 0")),
    Misuse("online=1", _decorate(online=1), InvalidOptionError, ("online=1", "True or False")),
    Misuse("online with validate", _decorate(online=True, validate=True), InvalidOptionError,
           ("online=True", "False with validate=True", "re-execute (online=False)")),
    Misuse("online with end_to_end", _decorate(online=True, objective="end_to_end"), InvalidOptionError,
           ("online=True", "False with objective='end_to_end'", "re-execute (online=False)")),
    Misuse("online under autotune()", lambda c: autotune([{"chunks": 1}], online=True)(_op), InvalidOptionError,
           ("online=True", "False under autotune(config_space=...)", "contextual_autotune(online=True)")),
    Misuse("max_executions=0", _decorate(max_executions=0), InvalidOptionError, ("max_executions=0", "an int >= 1")),
    Misuse("validate='yes'", _decorate(validate="yes"), InvalidOptionError, ("validate='yes'", "True or False")),
    Misuse("reference without validate", _decorate(reference=_double), InvalidOptionError,
           ("validate=False", "True when reference= or compare= is given")),
    Misuse("reference=42", _decorate(validate=True, reference=42), InvalidOptionError, ("reference=42", "a callable")),
    Misuse("atol=-1", _decorate(validate=True, atol=-1), InvalidOptionError, ("atol=-1", "a number >= 0")),
    Misuse("max_mismatch_ratio=2", _decorate(validate=True, max_mismatch_ratio=2.0), InvalidOptionError,
           ("max_mismatch_ratio=2.0", "a fraction between 0 and 1")),
    # environment variables: refused where the decorator is built
    *[Misuse(f"env {name}", _env_then_decorate(name, value), InvalidOptionError, (f"{name}={value!r}", accepted))
      for name, (value, accepted) in BAD_ENV.items()],
    # contextual_autotune at call time
    Misuse("is_dist=True without a process group", _ctx_call(is_dist=True), NoProcessGroupError,
           ("is_dist=True", "torch.distributed.init_process_group", "pass is_dist=False")),
    Misuse("validate=True, result None", _ctx_call(_none, validate=True), NothingToValidateError,
           ("validate=True", "its result holds no tensor", "return the output tensors", "compare="), runs=True),
    Misuse("validate=True, reference returns None", _ctx_call(validate=True, reference=lambda x: None),
           NothingToValidateError, ("validate=True", "the result of reference= holds no tensor", "compare="),
           runs=True),
    Misuse("reference raises", _ctx_call(validate=True, reference=_raise(ZeroDivisionError("in the user's code"))),
           UserHookError, ("reference raised ZeroDivisionError: in the user's code", "Fix: make reference("),
           cause=ZeroDivisionError, runs=True),
    Misuse("compare raises", _ctx_call(validate=True, compare=_raise(KeyError("out"))), UserHookError,
           ("compare raised KeyError", "Fix: make compare(result, reference) return True"), cause=KeyError, runs=True),
    # autotune: its arguments
    Misuse("config_space=42", lambda c: autotune(config_space=42)(_op), InvalidOptionError,
           ("config_space=42", "a list of dicts mapping keyword-argument names to values")),
    Misuse("config_space=[]", lambda c: autotune(config_space=[])(_op), InvalidOptionError,
           ("config_space=[]", "a non-empty list of dicts")),
    Misuse("config_space a dict", lambda c: autotune(config_space={"chunks": 1})(_op), InvalidOptionError,
           ("config_space={'chunks': 1}", "a list of dicts")),
    Misuse("config_space with a non-dict", lambda c: autotune(config_space=[{"chunks": 1}, 2])(_op),
           InvalidOptionError, ("config_space=[{'chunks': 1}, 2]", "a list of dicts")),
    Misuse("point names an unknown keyword", lambda c: autotune(config_space=[{"zz": 1}])(_op), InvalidOptionError,
           ("config_space={'zz': 1}", "keyword arguments of _op, which takes chunks, x (not zz)",
            "rename the point's keys")),
    Misuse("key_fn=42", lambda c: autotune([{"chunks": 1}], key_fn=42)(_op), InvalidOptionError,
           ("key_fn=42", "a callable")),
    Misuse("prune_fn='all'", lambda c: autotune([{"chunks": 1}], prune_fn="all")(_op), InvalidOptionError,
           ("prune_fn='all'", "a callable")),
    Misuse("autotune(n_repeat=0)", lambda c: autotune([{"chunks": 1}], n_repeat=0), InvalidOptionError,
           ("n_repeat=0", "an int >= 1")),
    # autotune: the user's hooks, and its calls
    Misuse("key_fn returns a list", _fn_call(key_fn=lambda x: [x.numel()]), UserHookError,
           ("key_fn returned [64]", "not hashable (list)", "Fix: make key_fn(*args, **kwargs) return a hashable")),
    Misuse("key_fn raises", _fn_call(key_fn=_raise(KeyError("dtype"))), UserHookError,
           ("key_fn raised KeyError: 'dtype'", "Fix: make key_fn"), cause=KeyError),
    Misuse("key_fn takes the wrong arguments", _fn_call(key_fn=lambda: 0), UserHookError,
           ("key_fn raised TypeError", "Fix: make key_fn(*args, **kwargs)"), cause=TypeError),
    Misuse("prune_fn raises", _fn_call(prune_fn=_raise(ValueError("bad point"))), UserHookError,
           ("prune_fn raised ValueError: bad point", "Fix: make prune_fn(point, *args, **kwargs) return True"),
           cause=ValueError),
    Misuse("prune_fn keeps nothing", _fn_call(prune_fn=lambda p, x: False), InvalidOptionError,
           ("config_space='[] after prune_fn'", "check prune_fn")),
    Misuse("callable space raises", _fn_call(_raise(RuntimeError("no GPU info"))), UserHookError,
           ("config_space() raised RuntimeError: no GPU info", "Fix: make config_space(*args, **kwargs) return"),
           cause=RuntimeError),
    Misuse("callable space returns a number", _fn_call(lambda x: 7), InvalidOptionError,
           ("config_space()=7", "a list of dicts")),
    Misuse("callable space names an unknown keyword", _fn_call(lambda x: [{"zz": 1}]), InvalidOptionError,
           ("config_space()={'zz': 1}", "(not zz)", "add those parameters to the function")),
    Misuse("autotune='no'", _fn_call(switches=dict(autotune="no")), InvalidOptionError,
           ("autotune='no'", "True or False (a per-call switch")),
    Misuse("autotune_verbose=1", _fn_call(switches=dict(autotune_verbose=1)), InvalidOptionError,
           ("autotune_verbose=1", "True or False")),
    Misuse("autotune_pg a string", _fn_call(switches=dict(autotune_pg="world")), InvalidOptionError,
           ("autotune_pg='world'", "a torch.distributed process group")),
    Misuse("keyword clash", _fn_call(kwargs=dict(chunks=4)), InvalidOptionError,
           ("keyword arguments=['chunks']", "autotune_allow_arg_overwrite=True")),
    Misuse("autotune is_dist=True without a process group", _fn_call(is_dist=True), NoProcessGroupError,
           ("is_dist=True", "init_process_group", "is_dist=False")),
    Misuse("autotune validate=True, result None", _fn_call(fn=lambda x, chunks: _none(x), validate=True),
           NothingToValidateError, ("validate=True", "holds no tensor", "compare="), runs=True),
    # serving: buckets, freeze, throughput, tune_ahead
    Misuse("buckets with an unknown rule", _decorate(buckets={"M": "log2"}), InvalidOptionError,
           ("buckets={'M': 'log2'}", "one of 'pow2', a sorted list of ints, or a callable")),
    Misuse("buckets with unsorted edges", _decorate(buckets={"M": [64, 16]}), InvalidOptionError,
           ("buckets={'M': [64, 16]}", "strictly increasing")),
    Misuse("buckets='pow2'", _decorate(buckets="pow2"), InvalidOptionError,
           ("buckets='pow2'", "a dict mapping a key dimension's name", 'buckets={"M": "pow2"}')),
    Misuse("a bucket rule returning a float", _ctx_call(buckets={"n": lambda n: n / 2}), InvalidOptionError,
           ("buckets=", "a rule for 'n' that returns an int (it returned 32.0 for 64)"), runs=True),
    Misuse("freeze='yes'", _decorate(freeze="yes"), InvalidOptionError, ("freeze='yes'", "True, False or None")),
    Misuse("confirm=2", _decorate(confirm=2), InvalidOptionError, ("confirm=2", "True, False or None")),
    Misuse("split_screening='on'", _decorate(split_screening="on"), InvalidOptionError,
           ("split_screening='on'", "True, False or None")),
    Misuse("flops=3", _decorate(flops=3), InvalidOptionError, ("flops=3", "a callable flops(*args, **kwargs)")),
    Misuse("tune_ahead(sizes=[])", _ahead([], lambda n: (_x(),)), InvalidOptionError,
           ("tune_ahead(sizes=...)=[]", "a non-empty list of ints >= 0")),
    Misuse("tune_ahead without inputs", _ahead([64]), InvalidOptionError,
           ("tune_ahead(inputs_for=..., example=...)", "exactly one of them")),
    Misuse("tune_ahead with a factory that ignores its size", _ahead([32], lambda n: (_x(),)), UserHookError,
           ("inputs_for", "size 32 with no tensor dimension", "make inputs_for(size) build the call's inputs")),
    Misuse("tune_ahead with a factory that raises", _ahead([32], _raise(MemoryError("too big"))), UserHookError,
           ("inputs_for raised MemoryError: too big", "Fix: make inputs_for(size) return"), cause=MemoryError),
    Misuse("tune_ahead every bucket without buckets", lambda c: contextual_autotune(**FAST)(_double).tune_ahead(
        dim="n", up_to=64, inputs_for=lambda n: (_x(),)), InvalidOptionError,
        ("tune_ahead(sizes=None)", "dim= and up_to= with buckets= declared")),
    Misuse("tune_ahead spread for a function with collectives", _ahead([64], lambda n: (_x(),), spread=True,
                                                                         is_dist=True), InvalidOptionError,
           ("tune_ahead(spread=True)", "collectives need every rank")),
    Misuse("tune_ahead with flops returning text", _ahead([64], lambda n: (torch.ones(n, device=DEVICE),),
                                                          flops=lambda x: "many"), UserHookError,
           ("flops returned 'many', not a finite number", "Fix: make flops(*args, **kwargs) return")),
    # carry, start_compile_workers
    Misuse("carry(42)", lambda c: carry(42), InvalidOptionError, ("carry(fn)=42", "the callable a thread will run")),
    Misuse("start_compile_workers(-1)", lambda c: start_compile_workers(-1), InvalidOptionError,
           ("size=-1", "a number of worker processes >= 0")),
    Misuse("start_compile_workers('4')", lambda c: start_compile_workers("4"), InvalidOptionError,
           ("size='4'", "a number of worker processes")),
    Misuse("start_compile_workers(preload=str)", lambda c: start_compile_workers(preload="fla.ops"),
           InvalidOptionError, ("preload='fla.ops'", "a tuple of module names")),
    # python -m triton_ctx_tune
    _cli_row("report: no such log dir", ("report", "{tmp}/nowhere"), CtxTuneError,
             ("no log directory", "Fix: pass the log_dir the job used")),
    _cli_row("report: a dir without logs", ("report", "{tmp}"), CtxTuneError,
             ("no rank-*.jsonl files", "Fix: pass the log_dir")),
    _cli_row("report --plot into a missing dir", ("report", "{tmp}/nowhere", "--plot", "{tmp}/no/x.png"), CtxTuneError,
             ("the directory", "does not exist", "Fix: create it")),
    _cli_row("cache list: no such --cache-dir", ("cache", "list", "--cache-dir", "{tmp}/typo"), CacheError,
             ("typo (--cache-dir) does not exist", "Fix: pass the cache_dir the jobs used")),
    _cli_row("cache list: no such TRITON_CTX_TUNE_CACHE_DIR", ("cache", "list"), CacheError,
             ("(TRITON_CTX_TUNE_CACHE_DIR) does not exist", "Fix:"), env={"TRITON_CTX_TUNE_CACHE_DIR": "{tmp}/typo"}),
    _cli_row("cache list: --cache-dir is a file", ("cache", "list", "--cache-dir", "{tmp}/f"), CacheError,
             ("does not exist (it is a file)", "Fix:"), setup=_write("f", "x")),
    _cli_row("cache show: no such --cache-dir", ("cache", "show", "--cache-dir", "{tmp}/typo"), CacheError,
             ("does not exist", "Fix:")),
    _cli_row("cache clear: no such --cache-dir", ("cache", "clear", "--cache-dir", "{tmp}/typo"), CacheError,
             ("does not exist", "Fix:")),
    _cli_row("cache export: no such --cache-dir", ("cache", "export", "--cache-dir", "{tmp}/typo", "{tmp}/out.json"),
             CacheError, ("does not exist", "Fix:")),
    _cli_row("cache export --ship onto a file", ("cache", "export", "--cache-dir", "{tmp}", "--ship", "{tmp}/f"),
             CacheError, ("--ship", "it is a file", "Fix: pass a directory"), setup=_write("f", "x")),
    _cli_row("cache show: no entry matches", ("cache", "show", "--cache-dir", "{tmp}", "no_such_kernel"), CacheError,
             ("no entry in", "matches no_such_kernel", "Fix: run `python -m triton_ctx_tune cache list`")),
    # cache files
    _cli_row("cache import: no such file", ("cache", "import", "--cache-dir", "{tmp}/c", "{tmp}/missing.json"),
             CacheError, ("missing.json does not exist", "Fix: pass the file that `cache export FILE` wrote")),
    _cli_row("cache import: not JSON", ("cache", "import", "--cache-dir", "{tmp}/c", "{tmp}/bad.json"), CacheError,
             ("is not a readable JSON file", "Fix: export it again"), setup=_write("bad.json", "{not json")),
    _cli_row("cache import: someone else's JSON", ("cache", "import", "--cache-dir", "{tmp}/c", "{tmp}/other.json"),
             CacheError, ("is neither a cache export", "Fix: pass a file written by"),
             setup=_write("other.json", '{"theme": "dark"}')),
    _cli_row("cache import: an invalid entry", ("cache", "import", "--cache-dir", "{tmp}/c", "{tmp}/export.json"),
             CacheError, ("1 of 1 entries are invalid, so nothing was imported", "Fix:"),
             setup=_export_with_a_bad_entry),
    # ./launch
    Misuse("launch NPROC=0", _launch(NPROC="0"), LaunchRefused, ("NPROC=0", "expected a positive integer")),
    Misuse("launch NPROC=abc", _launch(NPROC="abc"), LaunchRefused, ("NPROC=abc", "expected a positive integer")),
    Misuse("launch TRITON_CTX_TUNE_DEVICE=gpu", _launch(TRITON_CTX_TUNE_DEVICE="gpu"), LaunchRefused,
           ("TRITON_CTX_TUNE_DEVICE=gpu", "expected auto, cuda or cpu")),
    Misuse("launch PYTHON missing", _launch(PYTHON="/nonexistent/python3"), LaunchRefused,
           ("PYTHON=/nonexistent/python3", "set PYTHON to the Python that has torch and triton")),
]


def _files(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under root (None for a folder), the logs of a call that ran aside."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*")) if p.relative_to(root).parts[0] != "logs"}


def _process_state() -> tuple:
    from triton_ctx_tune.compile.compile_workers import started_workers
    from triton_ctx_tune.runtime import patch, resolver

    return (Autotuner.__dict__["run"], patch.resident, patch.installs(), resolver.current(), set(resolver.open_calls),
            {name: K.chosen(k) for name, k in (("double_", K.double_), ("add_one_", K.add_one_))}, started_workers())


@pytest.mark.parametrize("case", MISUSES, ids=[c.name for c in MISUSES])
def test_misuse_gets_a_named_error_that_says_the_fix_and_changes_nothing(case, tmp_path, monkeypatch):
    from triton_ctx_tune.runtime import patch

    assert len(case.says) >= 2, "a row names what was wrong and the fix"
    assert issubclass(case.error, CtxTuneError) or case.error is LaunchRefused
    c = Ctx(tmp_path, monkeypatch)
    if case.setup is not None:
        case.setup(c)
    # A call that ran keeps the patch resident (as every tuned call does): make it so before, so that
    # "as before" is exact; every other row must leave Triton's own Autotuner.run in place.
    patch.make_resident() if case.runs else patch.release()
    files, state = _files(tmp_path), _process_state()
    assert state[0] is (patch._dispatching_run if case.runs else patch.original_run())
    with pytest.raises(case.error) as info:
        case.act(c)
    message = str(info.value)
    for text in case.says:
        assert text in message
    if case.cause is not None:
        assert type(info.value.__cause__) is case.cause
    assert _files(tmp_path) == files  # no cache entry, quarantine note or other file written
    assert _process_state() == state
    assert not (tmp_path / "ran").exists()


CLI_ROWS = [c for c in MISUSES if c.argv is not None]


@pytest.mark.parametrize("case", CLI_ROWS, ids=[c.name for c in CLI_ROWS])
def test_cli_misuse_exits_1_with_the_message_on_stderr(case, tmp_path, monkeypatch, capsys):
    from triton_ctx_tune.tools.cli import main

    c = Ctx(tmp_path, monkeypatch)
    if case.setup is not None:
        case.setup(c)
    with pytest.raises(case.error) as info:
        case.act(c)
    capsys.readouterr()
    assert case.argv is not None
    code = main([a.format(tmp=tmp_path) for a in case.argv])
    out, err = capsys.readouterr()
    assert (code, out, err) == (1, "", f"triton_ctx_tune: error: {info.value}\n")


def test_the_reliability_page_counts_the_table():
    page = ROOT.joinpath("docs", "reliability.md").read_text()
    assert f"tries {len(MISUSES)} misuses" in page, "update docs/reliability.md when the table grows"


def test_no_valid_point_speaks_of_points_and_stays_a_no_valid_config_error():
    def op(x: torch.Tensor, **point: Any) -> torch.Tensor:
        raise TypeError(f"op() got an unexpected keyword argument {next(iter(point))!r}")

    with pytest.raises(NoValidPointError) as info:
        autotune([{"zz": 1}, {"zz": 2}], cache=False, **FAST)(op)(_x())
    assert isinstance(info.value, NoValidConfigError)
    assert str(info.value).splitlines() == [
        "function test_no_valid_point_speaks_of_points_and_stays_a_no_valid_config_error.<locals>.op: every point "
        "of config_space failed, so there is nothing to choose.",
        "  point {'zz': 1}: rank 0: TypeError: op() got an unexpected keyword argument 'zz'",
        "  point {'zz': 2}: rank 0: TypeError: op() got an unexpected keyword argument 'zz'",
        "Fix: make every point a set of keyword arguments the function takes and can run with (remove or correct "
        "the failing points in config_space, or drop them with prune_fn)."]
    assert "kernel" not in str(info.value) and "{{" not in str(info.value)


@pytest.mark.dist
def test_misuse_in_a_group_raises_on_every_rank_and_leaves_none_waiting(tmp_path):
    from tests.test_dist import run_ranks

    rows = run_ranks(2, ["misuse_on_every_rank"], tmp_path, worker="function_worker.py")["misuse_on_every_rank"]
    for row in rows:
        assert "traceback" not in row, row.get("traceback")
        errors = row["errors"]
        assert {name: e[0] for name, e in errors.items()} == {
            "key_fn raises": "UserHookError", "validate, result None": "NothingToValidateError",
            "contextual validate, result None": "NothingToValidateError", "reference raises": "UserHookError",
            "point names an unknown keyword": "InvalidOptionError"}
        assert errors["key_fn raises"][1].startswith("key_fn raised KeyError: 'dtype'. Fix: make key_fn")
        assert errors["reference raises"][1].startswith("reference raised ZeroDivisionError: in the user's code. Fix:")
        assert row["sums"] == [2.0] * 5 and row["tuned"] == [2.0, 2.0] and row["cache_written"] is False
    assert rows[0]["errors"] == rows[1]["errors"]
