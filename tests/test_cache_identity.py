"""Exact cache identity: an entry is served only for the same kernel code, every @triton.jit function
it calls included, and a miss next to an entry that no longer applies says what changed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.kernels import DEVICE
from triton_ctx_tune.store import cache as C

ROOT = Path(__file__).resolve().parents[1]

# The kernel calls _twice (same module), which calls helpers.shift (another module), which reads
# the constexpr global helpers.STEP: edits two calls deep must count.
KERNEL_MODULE = """
import triton
import triton.language as tl
import time
import helpers


def _hook(ms):
    return lambda nargs: time.sleep(ms / 1e3)


@triton.jit
def _twice(x):
    return helpers.shift(x) * 2


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, pre_hook=_hook(30)), triton.Config({"BLOCK": 32}),
                          triton.Config({"BLOCK": 64}, pre_hook=_hook(60))], key=["n"])
@triton.jit
def transform(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, _twice(tl.load(x_ptr + offs, mask=mask)), mask=mask)
"""

HELPERS = """
import triton
import triton.language as tl

STEP = tl.constexpr({step})


@triton.jit
def shift(x):
    return x + {offset}STEP
"""

RUN = """
import json, sys
import torch
import triton
sys.path.insert(0, sys.argv[1])
import kernels
from triton_ctx_tune import contextual_autotune

@contextual_autotune(n_warmup=1, n_repeat=1, early_stop=False, cache_dir=sys.argv[2])
def op(x):
    h = x.clone()
    kernels.transform[lambda meta: (triton.cdiv(h.numel(), meta["BLOCK"]),)](h, h.numel())
    return h

out = op(torch.arange(40, dtype=torch.float32))
print(json.dumps({"out": out.tolist(), "executions": op.last_call.executions, "hits": op.last_call.cache_hits,
                  "chosen": {repr(k): c.kwargs["BLOCK"] for k, c in kernels.transform.cache.items()}}))
"""


def _write_helpers(src: Path, step: int, offset: str = "") -> None:
    (src / "helpers.py").write_text(textwrap.dedent(HELPERS.format(step=step, offset=offset)))


def _run(src: Path, cache: Path, logs: Path) -> dict:
    """One fresh process: it imports the kernel modules as they are on disk now."""
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_CTX_TUNE_LOG_DIR=str(logs), TRITON_CTX_TUNE_QUIET="1",
               PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-c", RUN, str(src), str(cache)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _stale_events(logs: Path) -> list[dict]:
    return [e for e in map(json.loads, (logs / "rank-0.jsonl").read_text().splitlines()) if e["event"] == "cache-stale"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs its processes under the interpreter")
def test_editing_a_called_helper_or_a_global_it_reads_invalidates_the_entry(tmp_path):
    src, cache, logs = tmp_path / "src", tmp_path / "cache", tmp_path / "logs"
    src.mkdir()
    (src / "kernels.py").write_text(textwrap.dedent(KERNEL_MODULE))
    _write_helpers(src, step=1)
    expected = [(i + 1) * 2.0 for i in range(40)]
    chosen = {"(40, 'torch.float32')": 32}

    first = _run(src, cache, logs)
    assert first == {"out": expected, "executions": 3 * 2 + 1, "hits": 0, "chosen": chosen}
    (entry_path,) = C.entry_paths(cache)
    functions = [f["name"] for f in C.read_entry(entry_path)["identity"]["code"]["functions"]]
    assert functions == ["transform", "_twice", "shift"]
    # The same code in a new process: the identity holds nothing process-specific, so it hits.
    assert _run(src, cache, logs) == {"out": expected, "executions": 1, "hits": 1, "chosen": chosen}

    _write_helpers(src, step=1, offset="1 + ")  # shift(x) = x + 1 + STEP: the outer kernel's text is unchanged
    edited = _run(src, cache, logs)
    assert edited == {"out": [(i + 2) * 2.0 for i in range(40)], "executions": 7, "hits": 0, "chosen": chosen}
    (stale,) = _stale_events(logs)
    assert stale["path"] == str(entry_path) and stale["others"] == 0
    assert stale["reasons"] == ["the source of the @triton.jit function shift it calls changed"]
    text_log = (logs / "rank-0.log").read_text()
    assert (f"cache-stale kernel=transform key=(40, 'torch.float32'): the cached entry {entry_path} does not apply: "
            "the source of the @triton.jit function shift it calls changed. Tuning again.") in text_log
    assert len(C.entry_paths(cache)) == 2  # the old entry stays: the code may come back

    _write_helpers(src, step=3, offset="1 + ")  # only the constexpr global shift reads
    assert _run(src, cache, logs)["out"] == [(i + 4) * 2.0 for i in range(40)]
    assert _stale_events(logs)[-1]["reasons"] == ["global shift:STEP: constexpr 1 -> constexpr 3"]

    _write_helpers(src, step=1)  # back to the first version: its entry hits again
    assert _run(src, cache, logs) == {"out": expected, "executions": 1, "hits": 1, "chosen": chosen}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the entry's foreign device is a GPU; run where there is none")
def test_an_entry_from_another_device_or_triton_or_cache_format_misses_and_says_why(tmp_path):
    import triton

    from tests import kernels as K
    from tests.kernels import grid
    from triton_ctx_tune import contextual_autotune

    cache = tmp_path / "c"
    runs = {"n": 0}

    @contextual_autotune(n_warmup=1, n_repeat=1, early_stop=False, cache_dir=cache)
    def op(x: torch.Tensor):
        runs["n"] += 1
        h = x.clone()
        K.double_[grid(h.numel())](h, h.numel())
        return h

    x = torch.arange(96, dtype=torch.float32, device=DEVICE)
    op(x)
    (path,) = C.entry_paths(cache)
    entry = C.read_entry(path)
    path.unlink()
    # As if tuned on an H200 with another Triton, then brought here with `cache import`.
    entry["identity"].update(device="NVIDIA H200", arch="sm_90", device_count=2, triton="0.0.0-other")
    entry["id"] = C.entry_id(entry["identity"])
    foreign = C.write_entry(cache, entry)
    K.reset_caches()
    runs["n"] = 0
    torch.testing.assert_close(op(x), x * 2)
    assert runs["n"] == 3 * 2 + 1 and op.last_call.cache_hits == 0
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    (stale,) = [e for e in events if e["event"] == "cache-stale"]
    assert stale["path"] == str(foreign) and stale["reasons"] == [
        "device 'NVIDIA H200' -> 'cpu-interpreter'", "architecture 'sm_90' -> ''", "device count 2 -> 0",
        f"Triton '0.0.0-other' -> '{triton.__version__}'"]

    # An entry of the previous cache format, which hashed the outer kernel's source alone.
    for p in C.entry_paths(cache):
        p.unlink()
    old = {"format": "triton_ctx_tune.cache/1", "identity": {"format": "triton_ctx_tune.cache/1", "kernel": "double_",
                                                               "key": "(96, 'torch.float32')",
                                                             "source_sha256": "0" * 64}}
    (cache / f"double_-{'e' * 64}.json").write_text(json.dumps(old))
    K.reset_caches()
    op(x)
    events = [json.loads(line) for line in (tmp_path / "logs" / "rank-0.jsonl").read_text().splitlines()]
    assert [e for e in events if e["event"] == "cache-stale"][-1]["reasons"] == [
        "it was written in cache format 'triton_ctx_tune.cache/1', and this version writes 'triton_ctx_tune.cache/2' "
        "(which also covers the @triton.jit functions a kernel calls)"]


COMPARE = """
import importlib, json, sys
from triton_ctx_tune.store import cache as C
from triton_ctx_tune.runtime.compat import jit_function
from triton_ctx_tune.store.fingerprint import kernel_code

out = {}
for variant in sys.argv[1:]:
    sys.path.insert(0, variant)
    for name in ("kernels", "helpers"):
        sys.modules.pop(name, None)
    kernels = importlib.import_module("kernels")
    fn = jit_function(kernels.transform)
    out[variant] = {"type": type(fn).__name__, "triton": fn.cache_key, "ours": C.code_digest(kernel_code(fn)),
                    "functions": [f["name"] for f in kernel_code(fn)["functions"]]}
    sys.path.remove(variant)
print(json.dumps(out))
"""


def _triton_version() -> tuple[int, int]:
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def test_compiled_kernels_change_identity_where_triton_cache_key_does_except_for_line_numbers(tmp_path):
    """Real JITFunctions (no interpreter; nothing is launched, so no GPU is needed): the walk finds what
    Triton's own cache_key covers."""
    variants = {}
    for name, helpers, prefix in (("base", dict(step=1), ""), ("helper", dict(step=1, offset="1 + "), ""),
                                  ("constexpr", dict(step=2), ""), ("moved", dict(step=1), "\n\n# moved down\n")):
        d = tmp_path / name
        d.mkdir()
        (d / "kernels.py").write_text(prefix + textwrap.dedent(KERNEL_MODULE))
        _write_helpers(d, **helpers)
        variants[name] = str(d)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-c", COMPARE, *variants.values()], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = {name: json.loads(proc.stdout)[path] for name, path in variants.items()}
    assert {g["type"] for g in got.values()} == {"JITFunction"}
    assert got["base"]["functions"] == ["transform", "_twice", "shift"]
    base = got["base"]
    assert got["helper"]["triton"] != base["triton"] and got["helper"]["ours"] != base["ours"]
    assert got["constexpr"]["ours"] != base["ours"]
    # Triton 3.4 checks constexpr globals at launch instead of hashing them; 3.5+ hash them as we do.
    assert (got["constexpr"]["triton"] != base["triton"]) == (_triton_version() >= (3, 5))
    # Moved lines: Triton hashes the line number (it lands in debug info), the tuned result stays valid.
    assert got["moved"]["triton"] != base["triton"] and got["moved"]["ours"] == base["ours"]


def test_importing_entries_of_the_previous_format_is_refused_with_the_fix(tmp_path, capsys):
    from triton_ctx_tune.tools.cli import main

    old_entry = {"format": "triton_ctx_tune.cache/1", "id": "0" * 64,
                 "identity": {"format": "triton_ctx_tune.cache/1", "kernel": "matmul_kernel", "key": "(32, 64)"}}
    export = tmp_path / "old-export.json"
    export.write_text(json.dumps({"format": C.EXPORT_FORMAT, "entries": [old_entry]}))
    assert main(["cache", "import", "--cache-dir", str(tmp_path / "c"), str(export)]) == 1
    err = capsys.readouterr().err
    assert err == (f"triton_ctx_tune: error: {export}: 1 of 1 entries are invalid, so nothing was imported:\n"
                   "  entry #0 (matmul_kernel key=(32, 64)): format is 'triton_ctx_tune.cache/1', expected "
                   "'triton_ctx_tune.cache/2'\n"
                   "Fix: entries of an older cache format cannot be converted (they do not record the @triton.jit "
                   "functions a kernel calls): tune again with this version, then export again.\n")
    assert not (tmp_path / "c").exists()
