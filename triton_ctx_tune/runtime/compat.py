"""Everything that depends on the Triton version lives here (supported: triton 3.4 to 3.9).

The rest of the package talks to Triton's Autotuner only through these functions, so a new
Triton release means reading its runtime/autotuner.py and touching this file alone.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import hashlib
import importlib
import inspect
import linecache
import math
import multiprocessing
import os
import pickle
import re
import sys
import textwrap
import threading
import traceback
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import triton
from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure
from triton.runtime.autotuner import Autotuner, Config, Heuristics
from triton.runtime.errors import InterpreterError, OutOfResources, PTXASError
from triton.runtime.interpreter import InterpretedFunction

__all__ = ["Autotuner", "Config", "TRITON_VERSION", "SUPPORTED", "OLDEST_TORCH", "torch_version_note",
           "interpret_mode", "tuning_key",
           "prune_configs", "RUN_LEAVES", "note_run", "launch_config", "launch_cached", "compile_only",
           "SignatureUnknown", "hooked_launch_args",
           "prime_compiler_hash", "prime_backend_hash", "prime_soon", "prime_interpreter", "load_binary",
           "await_launcher", "reset_before_final_launch", "preload_compiler",
           "config_failure_reason", "kernel_name", "JitInfo", "jit_info", "jit_function",
           "inner_heuristics", "constexpr_value", "aggregate_members", "is_triton_builtin",
           "autotuner_definition", "autotuner_hooks", "explain_error", "interpreter_numpy_note",
           "config_to_dict", "config_str", "print_autotuning", "notify_listener", "LaunchSpec", "ShippedFunction",
           "capture_compile", "describe_compile", "Described", "in_disk_cache", "knob",
           "compile_target", "use_compile_only_driver", "compile_described", "triton_cache_dir"]

TRITON_VERSION: str = triton.__version__
SUPPORTED = ((3, 4), (3, 9))


def _version_tuple(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


if not SUPPORTED[0] <= _version_tuple(TRITON_VERSION) <= SUPPORTED[1]:
    warnings.warn(f"triton_ctx_tune supports triton 3.4 to 3.9; found {TRITON_VERSION}. "
                  "It may work, but nothing has been tested on this version.", stacklevel=2)

# setup.py's floor: the torch that Triton 3.4, the oldest supported Triton, ships with. Older torch can hang in
# destroy_process_group() at a job's end: gloo's destructor held the GIL while waiting for its thread, which was
# freeing a finished collective's tensors and needed the GIL to do so (pytorch/pytorch#154976, in torch 2.8). On
# torch 2.4.1 a 4-rank CPU test hung there after its last tuning call, every rank's results written.
OLDEST_TORCH = (2, 8)


def torch_version_note(version: str = torch.__version__) -> str | None:
    """Why and how to upgrade, for a torch older than OLDEST_TORCH; None for a supported one."""
    if _version_tuple(version) >= OLDEST_TORCH:
        return None
    floor = ".".join(map(str, OLDEST_TORCH))
    return (f"triton_ctx_tune needs torch {floor} or newer; found {version}. With an older torch a job can hang in "
            "torch.distributed.destroy_process_group() at its end (gloo's destructor holds the GIL that its "
            f"own thread needs: pytorch/pytorch#154976, fixed in torch 2.8). Upgrade: pip install 'torch>={floor}'.")


if (_torch_note := torch_version_note()) is not None:
    warnings.warn(_torch_note, stacklevel=2)

# What Triton's own _bench treats as "this config cannot run here", plus compile errors,
# which the issue of one bad config must not turn into a failure of the whole function.
_FAILURES = (OutOfResources, PTXASError, CompilationError, CompileTimeAssertionFailure)


def interpret_mode() -> bool:
    """True under TRITON_INTERPRET=1, where kernels run synchronously on the host."""
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # knobs appeared in 3.4; keep the env var as the fallback
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _named_args(at: Autotuner, args: Sequence[Any]) -> dict[str, Any]:
    return dict(zip(at.arg_names, args))


def tuning_key(at: Autotuner, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
    """The key Triton's Autotuner.run uses for `cache`, byte for byte, so later plain launches hit it.

    On every warm launch's path: when no keyword argument names a kernel parameter (the usual
    launch), the key is read from positions worked out once per autotuner, with no dicts built.
    """
    plan = at.__dict__.get("_ctx_tune_key_plan")
    if plan is None:
        names = list(at.arg_names)
        plan = at._ctx_tune_key_plan = (frozenset(names), tuple(names.index(k) for k in at.keys if k in names),
                                        len(names))
    params, positions, n_params = plan
    n = len(args)
    if n <= n_params and params.isdisjoint(kwargs):
        key = [args[i] for i in positions if i < n]
        try:
            for a in args:
                dtype = getattr(a, "dtype", None)
                if dtype is not None:
                    text = _DTYPE_TEXT.get(dtype)
                    if text is None:
                        text = _DTYPE_TEXT[dtype] = str(dtype)
                    key.append(text)
        except TypeError:  # an unhashable dtype: Triton's own way
            return triton_key(at, args, kwargs)
        return tuple(key)
    return triton_key(at, args, kwargs)


# str(dtype), as Triton's key spells it, once per dtype: str(torch.float16) costs more than a lookup.
_DTYPE_TEXT: dict[Any, str] = {}


def triton_key(at: Autotuner, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
    """Autotuner.run's own key computation, as Triton writes it."""
    all_args = {**_named_args(at, args), **kwargs}
    named = {k: v for k, v in all_args.items() if k in at.arg_names}
    key: list[Any] = [named[k] for k in at.keys if k in named]
    key.extend(str(v.dtype) for v in named.values() if hasattr(v, "dtype"))
    return tuple(key)


def prune_configs(at: Autotuner, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Config]:
    """Run the autotuner's own prune_configs_by (early_config_prune, perf_model/top_k)."""
    at.nargs = _named_args(at, args)  # prune_configs and perf_model read self.nargs
    try:
        return list(at.prune_configs(kwargs))
    finally:
        at.nargs = None


def _check_conflicts(config: Config, kwargs: dict[str, Any]) -> None:
    conflicts = kwargs.keys() & config.kwargs.keys()
    if conflicts:
        raise ValueError(f"Conflicting meta-parameters: {', '.join(sorted(conflicts))}. "
                         "Make sure that you don't re-define auto-tuned symbols.")


# What Triton's own Autotuner.run leaves on the autotuner for its callers, the same in 3.4 to 3.9:
# `cache` (key -> config), `best_config` (the config the launch ran: libraries reuse it, e.g. to run
# a backward kernel with the forward's tile), `configs_timings` and `bench_time` (after it benchmarked)
# and `nargs` (None once run returns). A tuning call keeps each as a caller expects (note_run, and
# decisions.py for the timings once a key is decided).
RUN_LEAVES = ("cache", "best_config", "configs_timings", "bench_time", "nargs")


def note_run(at: Autotuner, config: Config) -> None:
    """What a caller reads after a launch inside a tuning call: the config that ran, and timings so far."""
    at.best_config = config
    if getattr(at, "configs_timings", None) is None:  # not decided yet: no timings, as before any benchmark
        at.configs_timings = {}
        at.bench_time = 0.0


def launch_config(at: Autotuner, config: Config, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """One launch as Triton's _bench times it: config.pre_hook, pre_hook, run, post_hook."""
    _check_conflicts(config, kwargs)
    note_run(at, config)
    current = dict(kwargs, **config.all_kwargs())
    full_nargs = {**_named_args(at, args), **current}
    if config.pre_hook:
        config.pre_hook(full_nargs)
    at.pre_hook(full_nargs)
    try:
        ret = at.fn.run(*args, **current)
    except Exception as e:
        at.post_hook(full_nargs, exception=e)
        raise
    at.post_hook(full_nargs, exception=None)
    return ret


def launch_cached(at: Autotuner, config: Config, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """What Autotuner.run does once it has found its key in `cache`, without computing the key again.

    The warm path of a tuning call computes the key itself (tuning_key), so calling Triton's
    run after it would pay for the key twice on every launch.
    """
    at.best_config = config
    if config.pre_hook is not None:
        config.pre_hook({**_named_args(at, args), **kwargs, **config.all_kwargs()})
    held = _LAUNCH_KWARGS.get(id(config))
    if held is None or held[0] is not config:
        held = _LAUNCH_KWARGS[id(config)] = (config, config.all_kwargs())
    return at.fn.run(*args, **kwargs, **held[1])


# Config.all_kwargs() builds a dict on every call; a tuned config's is built once (the config is
# kept alive with it, so its id cannot be reused for another config).
_LAUNCH_KWARGS: dict[int, tuple[Config, dict[str, Any]]] = {}


class SignatureUnknown(Exception):
    """A config's pre_hook could not run on copies of the arguments: what its launch compiles is unknown."""


def _hook_copy(value: Any) -> Any:
    """What a config pre_hook gets in place of an argument when precompiling: something it may change.

    A tensor becomes a meta tensor of its shape, strides and dtype (a hook that zeroes or fills one
    writes nothing); any other object a shallow copy whose list and dict attributes are copied too
    (a hook that sets a TensorDescriptor's block_shape sets the copy's). Numbers and strings stay.
    """
    import copy

    import torch

    if isinstance(value, torch.Tensor):
        return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="meta")
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.dtype)):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_hook_copy(v) for v in value) if type(value) in (list, tuple) else copy.copy(value)
    if isinstance(value, dict):
        return {k: _hook_copy(v) for k, v in value.items()}
    duplicate = copy.copy(value)
    attrs = getattr(duplicate, "__dict__", None)
    if isinstance(attrs, dict):
        for name, attr in list(attrs.items()):
            if isinstance(attr, (list, dict)):
                attrs[name] = copy.copy(attr)
    return duplicate


def _plain_argument(value: Any) -> bool:
    import torch

    return value is None or isinstance(value, (bool, int, float, str, bytes, torch.Tensor, torch.dtype,
                                               triton.language.dtype))


def hooked_launch_args(at: Autotuner, config: Config, args: Sequence[Any], kwargs: dict[str, Any]
                       ) -> tuple[tuple, dict[str, Any]]:
    """The arguments a launch of `config` compiles for: after its pre_hook, which runs on copies here.

    Triton's Autotuner.run (3.4 to 3.9) runs config.pre_hook(nargs) right before the launch, and a
    hook may change what the kernel is specialized on: the persistent-matmul pattern sets each host
    TensorDescriptor's block_shape from the config's BLOCK_* values, and the block shape is part of
    the signature. Compiling without the hook builds a different kernel (or none). Tensors are kept
    as they are for the compile (their data pointers decide alignment); every other argument is taken
    from the hook's copy. Raises SignatureUnknown when the hook fails on the copies (it reads data,
    calls into a library): then only the launch knows, and the caller must not guess.
    """
    import torch

    named = {**_named_args(at, args), **kwargs}
    if config.pre_hook is None or all(_plain_argument(v) for k, v in named.items() if k in at.arg_names):
        # Tensors, numbers and strings: a hook can change their contents or its dict, never the signature; so
        # it does not run here at all (a hook that counts its calls, or spends time, sees only the launches).
        return tuple(args), kwargs
    copies = {k: _hook_copy(v) for k, v in named.items()}
    try:
        config.pre_hook({**copies, **config.all_kwargs()})
    except Exception as e:  # noqa: BLE001 (whatever the hook raises, the signature is unknown)
        raise SignatureUnknown(f"its pre_hook raised {type(e).__name__}: {e}") from e

    # The objects the hook was given, as it left them: what it put in the dict in their place never reaches
    # Triton's launch either (Autotuner.run passes args, not the dict).
    def after(name: str, value: Any) -> Any:
        return value if isinstance(value, torch.Tensor) or name not in copies else copies[name]

    hooked_args = tuple(after(name, v) for name, v in zip(at.arg_names, args)) + tuple(args[len(at.arg_names):])
    return hooked_args, {k: after(k, v) for k, v in kwargs.items()}


def compile_only(at: Autotuner, configs: Sequence[Config], args: Sequence[Any], kwargs: dict[str, Any],
                 strict: bool = True) -> list:
    """A warmup=True launch: compile each config without running it, as its launch would compile it
    (config pre_hooks applied to copies: hooked_launch_args). `strict`: raise SignatureUnknown where a
    hook cannot run on copies; otherwise compile such a config as Triton's Autotuner.warmup does, unhooked."""
    kw = {k: v for k, v in kwargs.items() if k != "warmup"}
    out = []
    for c in configs:
        _check_conflicts(c, kw)
        try:
            a, k = hooked_launch_args(at, c, args, kw)
        except SignatureUnknown:
            if strict:
                raise
            a, k = tuple(args), kw
        out.append(at.fn.run(*a, warmup=True, **k, **c.all_kwargs()))
    return out


# The threads prime_soon() started: "hash" (at the package's import), "driver" (at a decoration).
_priming: dict[str, threading.Thread] = {}


def prime_soon(driver: bool = False) -> None:
    """Start prime_compiler_hash() on a thread, and with `driver` then the loading of Triton's driver helper module.

    The hash starts when the package is imported: a function decorated just before its first call (a closure
    wrapped at run time, as benchmarks/clients/run_clients.py does) waited 0.45 s for it (RESULTS.md, section
    36), 0.7 s of a fresh process's first call before any config could compile. The driver's helper module starts
    at a decoration, when the program has chosen its device and TRITON_CACHE_DIR. The hash reads and digests
    files, so the thread leaves the GIL to the program; daemon threads, so that no exit waits for them."""
    what = "driver" if driver else "hash"
    if what in _priming or multiprocessing.parent_process() is not None:  # (not in a DataLoader worker)
        return
    _priming[what] = threading.Thread(target=_prime_driver if driver else prime_compiler_hash,
                                      name=f"ctx-tune-prime-{what}", daemon=True)
    _priming[what].start()


def _prime_driver() -> None:
    prime_compiler_hash()
    preload_compiler()  # the first description of a config imports it otherwise, on a thread all others wait for
    # The driver's helper module, built with the C compiler when the Triton cache is fresh: the first describe of a
    # config waited for it in a fresh process. Loading it touches no device.
    with contextlib.suppress(Exception):
        import triton.runtime  # noqa: PLC0415

        _ = triton.runtime.driver.active.utils


def prime_compiler_hash() -> bool:
    """Compute Triton's hash of its own compiler once, before compiles start on many threads.

    Every compile, a cache hit included, keys on triton_key(): a SHA-256 of the compiler's sources
    and of libtriton (hundreds of MB). It is lru_cached, but threads that start together all miss
    and all compute it: on an H200 host, 16 compile threads spent a quarter of their time there.
    When prime_soon() started it, this waits for that thread rather than compute it twice.
    """
    started = _priming.get("hash")
    if started is not None and started is not threading.current_thread():
        started.join()
    for module in ("triton.runtime.cache", "triton.compiler.compiler"):  # its home in 3.9, then in 3.4
        fn = getattr(importlib.import_module(module), "triton_key", None)
        if fn is not None:
            fn()
            return True
    return False  # a Triton that keys its cache otherwise: nothing to prime


def prime_backend_hash() -> None:
    """Compute the current device's backend hash once, before a key's configs are described on many threads.

    Every compile's cache key holds it; for CUDA it is the version that `ptxas --version` prints, lru_cached per
    architecture: the threads that describe a key's configs together all missed, and each ran ptxas (on the
    CPU here the first description took 0.16 s, 0.07 s of it in ptxas; 16 threads took 0.11 s and summed 1.4 s)."""
    from triton.compiler.compiler import make_backend  # noqa: PLC0415

    with contextlib.suppress(Exception):  # (a compile reports whatever fails here)
        make_backend(compile_target()).hash()


def preload_compiler() -> None:
    """Import what Triton's compile imports at its first call in a process (its code generator, and with it
    the language's semantics and, in 3.9, Gluon), so that processes forked from this one compile their first
    config without it: a compile worker's first compile was 0.13 to 0.15 s here, 0.07 s with this done before
    the fork (the same as its second)."""
    with contextlib.suppress(ImportError):
        importlib.import_module("triton.compiler.code_generator")  # (the same path in 3.4 to 3.9)


def prime_interpreter(at: Autotuner) -> bool:
    """Under the interpreter, rewrite the kernel's AST on the calling thread, once, before compile-only
    launches of it start on other threads.

    The interpreter rewrites a kernel's source at its first launch (InterpretedFunction.rewrite, cached
    per function), with ast.parse. CPython 3.11's parser is not safe on two threads at once ("SystemError:
    AST constructor recursion depth mismatch", seen with Triton 3.4 when a key's background compile and
    the execution both met a kernel for the first time).
    """
    fn: Any = at.fn
    while fn is not None and not callable(getattr(fn, "rewrite", None)):
        fn = getattr(fn, "fn", None)  # through heuristics() wrappers to the InterpretedFunction
    if fn is None:
        return False
    fn.rewrite()
    return True


def load_binary(compiled: Any) -> None:
    """Load a compiled kernel onto the current device now rather than at its first launch.

    This is also where Triton raises OutOfResources for shared memory or threads, so a config
    that cannot run is found before any slot is spent on it.
    """
    init = getattr(compiled, "_init_handles", None)
    if init is not None:
        await_launcher(compiled)
        init()


# Triton 3.4 to 3.6 build a C launcher for each new kernel signature (nvidia driver's CudaLauncher: make_launcher,
# then the C compiler) when a binary is first loaded, on the execution's path: 0.8 s of the FLA step's first
# execution on a fresh Triton cache. Its source depends only on the signature, known when a config is described,
# so it is built then, on a thread, while the kernel compiles; the load finds it in Triton's cache.
_LAUNCHERS: dict[tuple, threading.Thread] = {}
_LAUNCHERS_LOCK = threading.Lock()
LAUNCHER_WAIT_S = 5.0  # a load waits this long for a launcher being built, then builds its own


def _launcher_key(signature: Any) -> tuple | None:
    if not isinstance(signature, dict):
        return None
    types_ = tuple(signature.values())
    if any(isinstance(t, str) and t.startswith("tensordesc") for t in types_):
        return None  # a tensor descriptor's launcher depends on the compiled kernel's metadata (tensordesc_meta)
    return (triton_cache_dir(), *types_)  # where it is built: a load under another cache dir builds its own


def _launcher_builder() -> Callable[[dict[str, Any]], Any] | None:
    """What CudaLauncher(src, metadata) runs to build a signature's launcher; None where Triton has one launcher
    for every signature (3.7 on) or no CUDA backend."""
    try:
        from triton.backends.nvidia import driver as nvidia  # noqa: PLC0415
    except ImportError:
        return None
    make = getattr(nvidia, "make_launcher", None)
    build = getattr(nvidia, "compile_module_from_src", None)
    if make is None or build is None:
        return None

    def launcher(signature: dict[str, Any]) -> Any:
        return build(src=make({}, signature, None), name="__triton_launcher", library_dirs=nvidia.library_dirs(),
                     include_dirs=nvidia.include_dirs, libraries=nvidia.libraries)
    return launcher


def prebuild_launcher(signature: dict[str, Any], target: Any) -> bool:
    """Start building the launcher of a kernel of this signature on a thread, once per signature in this process.
    Whether one started."""
    key = _launcher_key(signature)
    if key is None or getattr(target, "backend", None) != "cuda":
        return False
    with _LAUNCHERS_LOCK:
        if key in _LAUNCHERS:
            return False
        builder = _launcher_builder()
        if builder is None:
            return False

        def build() -> None:
            with contextlib.suppress(Exception):  # (the load builds it then, and reports what failed)
                builder(dict(signature))
        thread = threading.Thread(target=build, name="ctx-tune-launcher", daemon=True)
        _LAUNCHERS[key] = thread
    thread.start()
    return True


def await_launcher(compiled: Any, timeout_s: float = LAUNCHER_WAIT_S) -> None:
    """Wait for prebuild_launcher()'s build of this binary's launcher, if one is running (two builds of one
    launcher would both run the C compiler)."""
    key = _launcher_key(getattr(getattr(compiled, "src", None), "signature", None))
    thread = _LAUNCHERS.get(key) if key is not None else None
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout_s)


def restores(at: Autotuner) -> bool:
    """Whether the autotuner declares arguments to restore or zero around a benchmarked launch."""
    return bool(getattr(at, "restore_value", None) or getattr(at, "reset_to_zero", None))


def declared_writes(at: Autotuner, args: Sequence[Any], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """The tensors a launch writes in place by the autotuner's declaration (restore_value, reset_to_zero)."""
    named = {**_named_args(at, args), **kwargs}
    names = list(getattr(at, "restore_value", None) or []) + list(getattr(at, "reset_to_zero", None) or [])
    return [(str(n), named[n]) for n in names if hasattr(named.get(n), "untyped_storage")]


def reset_before_final_launch(at: Autotuner, config: Config, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """What Triton does between benchmarking and the real launch: zero the reset_to_zero arguments."""
    at.pre_hook({**_named_args(at, args), **kwargs, **config.all_kwargs()}, reset_only=True)


def _is_interpreted_static_assert(exc: BaseException) -> bool:
    # The interpreter turns tl.static_assert into a Python assert and wraps it in
    # InterpreterError; on a GPU the same line raises CompileTimeAssertionFailure.
    cause = exc.__cause__
    if not isinstance(exc, InterpreterError) or not isinstance(cause, AssertionError):
        return False
    frames = traceback.extract_tb(cause.__traceback__)
    return bool(frames) and frames[-1].name == "_new_static_assert"


def _compile_error_cause(exc: CompilationError) -> str | None:
    """What a CompilationError says went wrong: its error_message, or the innermost one it was raised from
    (a failure inside a called @triton.jit function is re-raised at each call site with no message)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    found: str | None = None
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        message = getattr(cause, "error_message", None) if isinstance(cause, CompilationError) else (
            f"{type(cause).__name__}: {cause}" if str(cause) else None)
        if message:
            found = " ".join(str(message).split())
        cause = cause.__cause__ or cause.__context__
    return found


def config_failure_reason(exc: BaseException) -> str | None:
    """The reason if `exc` means "this config cannot run", else None (a real error).

    One line, what went wrong first: a CompilationError's text is the source excerpt and then the
    message, so a reason cut anywhere used to keep the excerpt and lose the message. The whole text
    follows: the logs keep it all, and messages cut the end (errors.distinct_reasons)."""
    if isinstance(exc, _FAILURES) or _is_interpreted_static_assert(exc):
        text = " ".join(str(exc).split())
        cause = _compile_error_cause(exc) if isinstance(exc, CompilationError) else None
        if cause and cause not in text:
            text = f"{cause} | {text}"
        elif cause:
            text = f"{cause} | {text.replace(cause, '').strip()}"
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return None


def kernel_name(at: Autotuner) -> str:
    return at.base_fn.__name__


def autotuner_definition(at: Autotuner) -> dict[str, list[str]]:
    """Argument names the autotuner was defined with: key=, reset_to_zero=, restore_value= (the cache hashes them)."""
    return {"key": [str(k) for k in at.keys],
            "reset_to_zero": [str(k) for k in getattr(at, "reset_to_zero", None) or []],
            "restore_value": [str(k) for k in getattr(at, "restore_value", None) or []]}


def autotuner_hooks(at: Autotuner) -> tuple[Callable[..., Any] | None, Callable[..., Any] | None]:
    """The autotuner-level pre_hook and post_hook (Triton's reset/restore defaults or the user's): both are timed."""
    return getattr(at, "pre_hook", None), getattr(at, "post_hook", None)


# ---- what a kernel's code is made of (cache identity) ------------------------------------------
#
# Triton's own JITFunction.cache_key hashes a function's source with the cache_key of every
# JIT function it references (found by walking its AST; 3.5+ also mixes in the values of the
# tl.constexpr globals it reads) plus its `def` line number. It exists only on compiled
# functions (the interpreter's InterpretedFunction has none), and the line number would make a
# comment added above a kernel look like new code. So fingerprint.kernel_code walks the same
# references itself; these functions give it what it needs from each Triton version.

try:  # 3.5+: the base of JITFunction and of tl.constexpr_function's ConstexprFunction
    from triton.runtime.jit import JITCallable as _JitBase
except ImportError:  # 3.4
    from triton.runtime.jit import JITFunction as _JitBase

_JIT_OPTIONS = ("noinline", "debug", "do_not_specialize", "do_not_specialize_on_alignment")


@dataclass(frozen=True)
class JitInfo:
    fn: Callable[..., Any]  # the Python function
    source: str  # from `def` on, decorators removed, as Triton compiles it
    options: dict[str, Any]  # the jit() arguments that change the compiled code


def _source_from_def(fn: Callable[..., Any]) -> str:
    src = textwrap.dedent(inspect.getsource(fn))
    match = re.search(r"^def\s+\w+\s*\(", src, re.MULTILINE)
    return src[match.start():] if match else src


def jit_info(obj: Any) -> JitInfo | None:
    """The Python function, source and options of a @triton.jit function (compiled or interpreted)
    or of a constexpr_function (3.5+, bound methods included); None for anything else."""
    func = getattr(obj, "__func__", None)
    if isinstance(func, _JitBase):  # 3.5+: BoundConstexprFunction, a constexpr_function method
        obj = func
    if isinstance(obj, _JitBase):
        source = obj.src  # what Triton compiles, even after _unsafe_update_src
        options = {k: getattr(obj, k, None) for k in _JIT_OPTIONS}
    elif isinstance(obj, InterpretedFunction):
        try:
            source = _source_from_def(obj.fn)
        except (OSError, TypeError):
            source = obj.fn.__qualname__
        # 3.9 keeps jit()'s arguments on the function, 3.4 on its rewriter.
        kwargs = getattr(obj, "kwargs", None) or getattr(getattr(obj, "rewriter", None), "kwargs", None) or {}
        options = {k: kwargs.get(k) for k in _JIT_OPTIONS}
    else:
        return None
    return JitInfo(obj.fn, source, {k: _plain(v) for k, v in options.items()})


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def jit_function(at: Autotuner) -> Any:
    """The @triton.jit function an autotuner launches, under any heuristics() between them."""
    fn = at.fn
    while jit_info(fn) is None and hasattr(fn, "fn"):
        fn = fn.fn
    return fn


def inner_heuristics(at: Autotuner) -> dict[str, Callable[..., Any]]:
    """heuristics() values between the autotuner and its JIT function: they pick constexprs it compiles with."""
    values: dict[str, Callable[..., Any]] = {}
    fn = at.fn
    while isinstance(fn, Heuristics):
        values.update(fn.values)
        fn = fn.fn
    return values


def constexpr_value(value: Any) -> tuple[bool, Any]:
    """(True, the value) for a tl.constexpr global, else (False, None)."""
    if isinstance(value, triton.language.constexpr):
        return True, value.value
    return False, None


def aggregate_members(value: Any) -> tuple[str, list[tuple[str, Any]]] | None:
    """For a tl.core._aggregate class (3.5+): its field annotations and the members Triton hashes."""
    if not getattr(value, "__triton_aggregate__", False):
        return None
    members = getattr(value, "hash_attrs", [])
    return (str(getattr(value, "__annotations__", {})),
            [(getattr(m, "__name__", str(i)), m) for i, m in enumerate(members)])


def is_triton_builtin(value: Any) -> bool:
    """Part of Triton itself (tl.arange, a triton module): not user code, so not hashed."""
    if getattr(value, "__triton_builtin__", False):
        return True
    module = value.__name__ if isinstance(value, type(triton)) else getattr(value, "__module__", None)
    return isinstance(module, str) and (module == "triton" or module.startswith("triton."))


def config_to_dict(config: Config) -> dict[str, Any]:
    """A JSON-able description of a config (pre_hook excluded: it cannot be stored)."""
    return {"kwargs": dict(config.kwargs), **{k: v for k, v in config.all_kwargs().items() if k not in config.kwargs}}


def config_str(config: Config) -> str:
    """Short, stable text for logs: the tunables, then compile options that differ from defaults."""
    parts = [f"{k}={v}" for k, v in config.kwargs.items()]
    parts += [f"num_warps={config.num_warps}", f"num_stages={config.num_stages}"]
    extra = {k: v for k, v in config.all_kwargs().items() if k not in config.kwargs
             and k not in ("num_warps", "num_stages") and v is not None and not (k == "num_ctas" and v == 1)}
    parts += [f"{k}={v}" for k, v in extra.items()]
    return ", ".join(parts)


def tile_stages_warps(config: Any) -> tuple[int, int, int]:
    """What a config's compile time is guessed from (precompile.compile_weight, budget.tile_weight): its tile, the
    product of its integer meta-parameters of 16 or more; its num_stages (1 if unset) and num_warps (4 if unset)."""
    tile = math.prod(v for v in (getattr(config, "kwargs", None) or {}).values()
                     if isinstance(v, int) and not isinstance(v, bool) and v >= 16)
    return tile, getattr(config, "num_stages", None) or 1, getattr(config, "num_warps", None) or 4


def print_autotuning() -> bool:
    """TRITON_PRINT_AUTOTUNING=1, read the way this Triton reads it."""
    try:
        return bool(triton.knobs.autotuning.print)
    except AttributeError:
        return os.environ.get("TRITON_PRINT_AUTOTUNING", "0") == "1"


def notify_listener(at: Autotuner, key: tuple, best: Config, timings: dict, duration: float) -> None:
    """Triton >= 3.5 lets tools subscribe to tuning results; tell them like Triton would."""
    listener: Callable[..., None] | None = getattr(getattr(triton, "knobs", None), "autotuning", None)
    listener = getattr(listener, "listener", None)
    if listener is None:
        return
    fn = at.fn
    while hasattr(fn, "fn") and not isinstance(fn, triton.runtime.jit.JITFunction):
        fn = fn.fn
    listener(fn=fn, key=key, best_config=best, configs_timings=timings, duration=duration, cache_hit=False)


# Triton 3.4 to 3.6's interpreter makes a scalar tensor an index (range(tl.cdiv(K, BLOCK_K)), a slice)
# with int() on a 1-element array, which NumPy 1.25 deprecated and NumPy 2.4 made a TypeError. Any
# kernel that does so fails under TRITON_INTERPRET=1, tuned or not; Triton 3.7 fixed it
# (triton-lang/triton#9171). Patching Triton's interpreter from here would make a user's kernels
# behave differently depending on whether this package was imported, so the error names the fix.
_NUMPY_SCALAR_ERROR = "only 0-dimensional arrays can be converted to Python scalars"


def interpreter_numpy_note(exc: BaseException, triton_version: str = TRITON_VERSION,
                           numpy_version: str = np.__version__) -> str | None:
    """What to do about `exc` if it is that interpreter error on this Triton and NumPy, else None."""
    cause = exc.__cause__
    if not (isinstance(exc, InterpreterError) and isinstance(cause, TypeError) and _NUMPY_SCALAR_ERROR in str(cause)):
        return None
    if _version_tuple(triton_version) >= (3, 7) or _version_tuple(numpy_version) < (2, 4):
        return None
    return (f"triton_ctx_tune: triton {triton_version}'s interpreter cannot run this kernel with numpy "
            f"{numpy_version}: it turns a 1-element array into an int, an error since numpy 2.4 "
            "(triton-lang/triton#9171, fixed in triton 3.7). Install numpy<2.4 (pip install 'numpy<2.4') "
            "or triton>=3.7.")


def explain_error(exc: BaseException) -> None:
    """Attach the fix to an error that this Triton and NumPy cause together (see above)."""
    note = interpreter_numpy_note(exc)
    if note is None or note in getattr(exc, "__notes__", ()):
        return
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python < 3.11 prints no notes
        warnings.warn(note, stacklevel=2)


# ---- compiling in another process (compile_workers.py) -----------------------------------------
#
# A compile worker is a fresh Python process that never touches the GPU and never imports the user's
# kernel library (FLA asks the GPU for its name at import; a kernel built in a function, or in
# __main__, cannot be imported at all). The parent ships what Triton compiles instead: it runs its own
# compile-only launch (JITFunction.run(warmup=True)) up to the call of `compile(src, target, options)`
# and takes those three there, so the signature, constexprs, specialization attributes and options are
# Triton's own in every version. The kernel travels as source: every @triton.jit function it reaches,
# with the globals it reads (values, Triton's modules and builtins, other shipped functions). The worker
# rebuilds the functions at their own file and line (line info in the binary is the parent's) and
# compiles an ASTSource whose hash() is the parent's, so the binary lands in Triton's disk cache under
# the very key the parent's compile-only launch then looks up.


class _NotDescribable(Exception):
    pass


class _Captured(Exception):  # noqa: N818 (a signal, raised through Triton's run)
    def __init__(self, src: Any, target: Any, options: dict[str, Any]) -> None:
        super().__init__()
        self.src, self.target, self.options = src, target, options


_capture = threading.local()


def _capturing_compile(real: Callable[..., Any]) -> Callable[..., Any]:
    def compile_or_capture(src: Any, target: Any = None, options: Any = None, **kw: Any) -> Any:
        if getattr(_capture, "on", False):
            raise _Captured(src, target, dict(options or {}))
        return real(src, target=target, options=options, **kw)
    compile_or_capture._ctx_tune_real = real  # type: ignore[attr-defined]
    return compile_or_capture


def capture_compile(at: Autotuner, config: Config, args: Sequence[Any], kwargs: dict[str, Any],
                    ) -> tuple[Any, Any, dict[str, Any]] | None:
    """What compile_only(at, [config], args, kwargs) would hand Triton's compile(): (ASTSource, target,
    options), taken from Triton's own JITFunction.run without compiling; None when this process has the
    binary already (its launch is a cache hit in memory)."""
    fn = jit_function(at)
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise _NotDescribable("not a compiled JIT function")
    from triton.runtime import driver

    with _CAPTURE_LOCK:  # two threads' first access would both run create_binder, the second unwrapping compile
        fn.device_caches[driver.active.get_current_device()]  # create_binder sets fn.compile: wrap it after
        current = fn.__dict__.get("compile")
        if current is None:
            raise _NotDescribable("this Triton keeps no compile() on the JIT function")
        if getattr(current, "_ctx_tune_real", None) is None:
            fn.compile = _capturing_compile(current)
    _capture.on = True
    try:
        compile_only(at, [config], args, kwargs)
    except _Captured as c:
        return c.src, c.target, c.options
    finally:
        _capture.on = False
    if getattr(fn.__dict__.get("compile"), "_ctx_tune_real", None) is None:
        # Another thread's first launch on another device rebuilt the binder meanwhile: the launch above may
        # have compiled here. Counted as compiled here, not as a cache hit.
        raise _NotDescribable("compiled in this process: Triton rebuilt the kernel's binder meanwhile")
    return None


_CAPTURE_LOCK = threading.Lock()


@dataclass(frozen=True)
class ShippedFunction:
    """One @triton.jit (or constexpr) function as source, with what its body reads."""
    kind: str  # "jit" or "constexpr"
    module: str
    qualname: str
    filename: str
    first_line: int  # where the raw lines below start in `filename` (decorators included)
    raw_lines: tuple[str, ...]  # inspect.getsourcelines(fn), as the parent reads them
    def_offset: int  # lines from first_line to `def`
    future_annotations: bool
    options: dict[str, Any]  # noinline, debug
    scope: dict[str, tuple]  # name -> ("value", v) | ("jit", index) | ("module", name) | ("pickle", bytes)
    #                                  | ("namespace", {attr: description})


@dataclass(frozen=True)
class LaunchSpec:
    """One config's compile, picklable, needing nothing of the kernel's module: see above."""
    kernel: str  # the kernel's name, for logs
    functions: tuple[ShippedFunction, ...]  # [0] is the kernel
    signature: dict[str, Any]
    constexprs: dict[Any, tuple]  # path -> a description, as scope values
    attrs: dict[Any, Any]
    options: dict[str, Any]
    target: Any
    src_hash: str  # the parent's ASTSource.hash(): the cache key's part that names the code
    env: dict[str, str]  # the parent's TRITON_* variables: some change the compiled code, all the cache key
    cache_dir: str

    def binary_key(self) -> tuple:
        """What names the binary in Triton's cache (code, options, target, environment, cache): two specs with
        the same key compile the same file."""
        return (self.src_hash, repr(sorted(self.options.items())), repr(self.target),
                tuple(sorted(self.env.items())), self.cache_dir)


_FUTURE_ANNOTATIONS = 0x1000000  # __future__.annotations.compiler_flag


def _picklable(value: Any) -> tuple:
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", "") or ""
    if (callable(value) or isinstance(value, type)) and (module in (None, "__main__", "__mp_main__")
                                                          or "<locals>" in qualname):
        raise _NotDescribable(f"{qualname or type(value).__name__}: defined where a fresh process cannot import it")
    try:
        return ("pickle", pickle.dumps(value))
    except Exception as e:  # noqa: BLE001 (anything pickle raises: the value cannot travel)
        raise _NotDescribable(f"{type(value).__name__}: {e}") from None


class _Shipper:
    def __init__(self) -> None:
        self.functions: list[ShippedFunction | None] = []
        self._index: dict[int, int] = {}

    def function(self, obj: Any) -> int:
        func = getattr(obj, "__func__", None)
        if isinstance(func, _JitBase):
            raise _NotDescribable("a bound constexpr_function")
        if id(obj) in self._index:
            return self._index[id(obj)]
        if isinstance(obj, triton.runtime.jit.JITFunction):
            kind = "jit"
        elif isinstance(obj, _JitBase) and hasattr(triton, "constexpr_function"):
            kind = "constexpr"
        else:
            raise _NotDescribable(type(obj).__name__)
        index = len(self.functions)
        self._index[id(obj)] = index
        self.functions.append(None)
        py = obj.fn
        try:
            raw, first = inspect.getsourcelines(py)
        except (OSError, TypeError) as e:
            raise _NotDescribable(f"{py.__qualname__}: no source ({e})") from None
        def_offset = next((i for i, line in enumerate(raw) if re.match(r"\s*def\s", line)), 0)
        names, chains = _referenced(obj.src)
        closure = dict(zip(py.__code__.co_freevars, (c.cell_contents for c in py.__closure__ or ())))
        scope: dict[str, tuple] = {}
        for name in sorted(names):
            if name in closure:
                value = closure[name]
            elif name in py.__globals__:
                value = py.__globals__[name]
            else:
                continue  # a local, an argument or a builtin
            scope[name] = self.value(value, chains.get(name, set()))
        options = {k: getattr(obj, k, None) for k in ("noinline", "debug")}
        self.functions[index] = ShippedFunction(
            kind, py.__module__, py.__qualname__, py.__code__.co_filename, first, tuple(raw), def_offset,
            bool(py.__code__.co_flags & _FUTURE_ANNOTATIONS), options, scope)
        return index

    def value(self, value: Any, attrs: set[tuple[str, ...]] = frozenset()) -> tuple:  # type: ignore[assignment]
        if isinstance(value, _JitBase) or isinstance(getattr(value, "__func__", None), _JitBase):
            return ("jit", self.function(value))
        if value is None or isinstance(value, (bool, int, float, str)):
            return ("value", value)
        if isinstance(value, types.ModuleType):
            name = value.__name__
            if name == "triton" or name.startswith("triton.") or name.split(".")[0] in sys.stdlib_module_names:
                return ("module", name)
            members: dict[str, tuple] = {}
            for chain in attrs:
                if chain and chain[0] not in members and hasattr(value, chain[0]):
                    rest = {c[1:] for c in attrs if c and c[0] == chain[0] and len(c) > 1}
                    members[chain[0]] = self.value(getattr(value, chain[0]), rest)
            return ("namespace", members)
        return _picklable(value)


def _referenced(src: str) -> tuple[set[str], dict[str, set[tuple[str, ...]]]]:
    """The names a function's body reads, and the attribute chains read from each (a module's members)."""
    names: set[str] = set()
    chains: dict[str, set[tuple[str, ...]]] = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            path: list[str] = []
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                path.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name):
                chains.setdefault(inner.id, set()).add(tuple(reversed(path)))
    return names, chains


def in_disk_cache(src: Any, target: Any, options: dict[str, Any]) -> bool:
    """Whether Triton's compile(src, target, options) would find its binary in the disk cache (3.4 to 3.9
    key it alike: the compiler, the source's hash, the backend, the options and the cache-invalidating
    environment)."""
    from triton.compiler.compiler import get_cache_invalidating_env_vars, make_backend
    from triton.runtime.cache import get_cache_manager

    triton_key = next(fn for fn in (getattr(importlib.import_module(m), "triton_key", None)  # 3.9's home, then 3.4's
                                    for m in ("triton.runtime.cache", "triton.compiler.compiler")) if fn is not None)

    if knob("compilation", "always_compile"):
        return False
    backend = make_backend(target)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    env_vars = get_cache_invalidating_env_vars()
    key = f"{triton_key()}-{src.hash()}-{backend.hash()}-{parsed.hash()}-{str(sorted(env_vars.items()))}"
    group = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(f"{src.name[:150]}.json")
    return bool(group) and f"{src.name[:150]}.json" in group


def knob(group: str, name: str) -> Any:
    return getattr(getattr(getattr(triton, "knobs", None), group, None), name, None)


@dataclass(frozen=True)
class Described:
    """What precompile knows of a config before it compiles it."""
    spec: LaunchSpec | None  # for a compile worker; None when cached or not describable
    cached: bool  # in this process's memory or in Triton's disk cache: the compile-only launch is a hit
    reason: str | None = None  # why no worker can compile it (spec None, not cached)


# A kernel's shipped functions, walked once (JIT functions live as long as their module: id() stays theirs).
_SHIPPERS: dict[int, tuple[Any, _Shipper]] = {}
_SHIPPERS_LOCK = threading.Lock()


def _compile_env() -> dict[str, str]:
    """The environment a worker must share: TRITON_*, and every variable Triton's cache key reads."""
    from triton.compiler.compiler import get_cache_invalidating_env_vars

    env = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
    env.update({k: os.environ[k] for k in get_cache_invalidating_env_vars() if k in os.environ})
    return env


def describe_compile(at: Autotuner, config: Config, args: Sequence[Any], kwargs: dict[str, Any],
                     ship: bool = True) -> Described:
    """compile_only(at, [config], args, kwargs) as a LaunchSpec for a compile worker, or why not: the binary is
    cached already (in memory or on disk), or no other process can compile it (the reason). `ship=False`: only
    whether it is cached (no LaunchSpec is built)."""
    try:
        captured = capture_compile(at, config, args, kwargs)
        if captured is None:
            return Described(None, True)
        src, target, options = captured
        if in_disk_cache(src, target, options):
            return Described(None, True)
        prebuild_launcher(src.signature, target)
        if not ship:
            return Described(None, False)
        if getattr(triton.knobs.runtime, "add_stages_inspection_hook", None) is not None:
            raise _NotDescribable("a stages-inspection hook is set (knobs.runtime.add_stages_inspection_hook)")
        with _SHIPPERS_LOCK:  # one walk of the kernel's functions for all its configs
            held = _SHIPPERS.get(id(src.fn))
            if held is None or held[0] is not src.fn:
                shipper = _Shipper()
                shipper.function(src.fn)
                _SHIPPERS[id(src.fn)] = (src.fn, shipper)
            else:
                shipper = held[1]
            constexprs = {path: shipper.value(v) for path, v in src.constants.items()}
            functions = tuple(f for f in shipper.functions if f is not None)
        spec = LaunchSpec(kernel_name(at), functions, dict(src.signature), constexprs, dict(src.attrs), options,
                          target, src.hash(), _compile_env(), triton_cache_dir())
        pickle.dumps(spec)  # everything in it travels, or the reason is known here
        return Described(spec, False)
    except _NotDescribable as e:
        return Described(None, False, str(e))
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        return Described(None, False, f"{type(e).__name__}: {e}")


def compile_target() -> Any:
    """The target the current device compiles for (a GPUTarget: backend, arch, warp size)."""
    from triton.runtime import driver

    return driver.active.get_current_target()


def triton_cache_dir() -> str:
    try:
        return str(triton.knobs.cache.dir)
    except AttributeError:
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


class _CompileOnlyDriver:
    """What JITFunction.run asks the driver for before it compiles, answered without a GPU."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def is_active(self) -> bool:
        return True


def use_compile_only_driver(target: Any) -> None:
    """Make this process compile for `target` and never initialise a GPU (a compile worker only)."""
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver

    driver.set_active(_CompileOnlyDriver(target))
    make_backend(target)  # imports the backend's compiler now, before the first job


SAME_BINARY = "the same binary as config "  # how precompile.same_binaries' reasons start (not a failure)


def same_binary(reason: str) -> bool:
    """A config left out of a key's timing that did not fail: it is another config's binary and was timed as that
    one (precompile.same_binaries)."""
    return reason.startswith(SAME_BINARY)


def binary_digest(kernel: Any) -> str | None:
    """What a compiled kernel's launch runs: a digest of its binary (cubin, hsaco) and of its metadata but the cache
    key's hash and num_stages, which the launch does not read. None without a binary (the interpreter)."""
    asm = getattr(kernel, "asm", None) or {}
    binary = asm.get("cubin") or asm.get("hsaco")
    if not isinstance(binary, (bytes, bytearray)):
        return None
    meta: Any = getattr(kernel, "metadata", None)  # a namedtuple in 3.4 to 3.9
    fields = meta._asdict() if hasattr(meta, "_asdict") else dict(vars(meta)) if meta is not None else {}
    launch = sorted((k, repr(v)) for k, v in fields.items() if k not in ("hash", "num_stages"))
    return hashlib.sha256(bytes(binary) + repr(launch).encode()).hexdigest()


def config_but_stages(config: Config) -> str:
    """Everything of a config but num_stages (its meta-parameters, warps, hooks: whatever else it sets), to compare
    two configs whose binaries are the same."""
    return repr(sorted((k, repr(sorted(v.items())) if isinstance(v, dict) else
                        f"{getattr(v, '__qualname__', type(v).__name__)}@{id(v)}" if callable(v) else repr(v))
                       for k, v in vars(config).items() if k != "num_stages"))


def route_ptxas(route: Callable[[str, Callable[[], bytes]], bytes]) -> Callable[[], None]:
    """Send Triton's ptxas step (the NVIDIA backend's make_cubin, the same signature in 3.4 to 3.9) through
    `route(key, run)`: `key` names everything the cubin depends on, `run()` runs ptxas. Returns the undo; a no-op
    without the NVIDIA backend."""
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: PLC0415
    except ImportError:
        return lambda: None
    original = CUDABackend.make_cubin

    def make_cubin(self: Any, src: str, metadata: dict[str, Any], opt: Any, capability: int) -> bytes:
        return route(_ptxas_key(self, src, opt, capability), lambda: original(self, src, metadata, opt, capability))

    CUDABackend.make_cubin = make_cubin

    def undo() -> None:
        CUDABackend.make_cubin = original

    return undo


def _ptxas_key(backend: Any, src: str, opt: Any, capability: int) -> str:
    """What ptxas makes of `src`: the PTX, the target, ptxas itself (the backend's hash: its version and arch), and
    every option but num_stages, which acts before the PTX (it is in the PTX when it matters), with Triton's version
    and the environment that steers it (line info, ptxas options)."""
    try:
        options = repr(dataclasses.replace(opt, num_stages=0))
    except (TypeError, ValueError):  # not a dataclass with num_stages: every option
        options = repr(opt)
    backend_hash = backend.hash() if callable(getattr(backend, "hash", None)) else ""
    # What steers a compile (_compile_env), but this package's own variables and the cache dir; and PTXAS_OPTIONS,
    # read at the options' parse, no cache-invalidating variable.
    env = sorted((k, v) for k, v in {**_compile_env(), "PTXAS_OPTIONS": os.environ.get("PTXAS_OPTIONS", "")}.items()
                 if not k.startswith("TRITON_CTX_TUNE_") and k != "TRITON_CACHE_DIR")
    digest = hashlib.sha256()
    for part in (triton.__version__, backend_hash, str(capability), options, repr(env), src):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:40]


def _sync_environment(spec: LaunchSpec) -> None:
    from triton.compiler.compiler import get_cache_invalidating_env_vars

    keyed = set(get_cache_invalidating_env_vars())
    for k in [k for k in os.environ if (k.startswith("TRITON_") or k in keyed) and k not in spec.env]:
        del os.environ[k]
    os.environ.update(spec.env)
    try:
        triton.knobs.cache.dir = spec.cache_dir
    except AttributeError:
        os.environ["TRITON_CACHE_DIR"] = spec.cache_dir


# In a worker: the functions rebuilt so far, by (module, qualname, source), reused by every later config.
_REBUILT: dict[tuple[str, str, tuple[str, ...]], Any] = {}


_GAP = "pass\n"


def _place_source(f: ShippedFunction) -> None:
    """Put f's lines in linecache at its place in its file, so that inspect (Triton's JITFunction) reads them
    there, and the binary's line info is the parent's."""
    entry = linecache.cache.get(f.filename)
    lines = list(entry[2]) if entry is not None and len(entry) == 4 and entry[1] is None else []
    end = f.first_line - 1 + len(f.raw_lines)
    # The lines no shipped function covers: a statement at column 0, so that inspect's block of each function
    # ends where it ends in the real file (blank lines would let a one-line def, or a body followed by another
    # function's indented lines, run on into the next function's).
    lines += [_GAP] * (end + 1 - len(lines))
    lines[f.first_line - 1:end] = [line if line.endswith("\n") else line + "\n" for line in f.raw_lines]
    linecache.cache[f.filename] = (sum(map(len, lines)), None, lines, f.filename)


def _resolve(description: tuple, built: list[Any]) -> Any:
    kind, payload = description
    if kind == "value":
        return payload
    if kind == "jit":
        return built[payload]
    if kind == "module":
        return importlib.import_module(payload)
    if kind == "pickle":
        return pickle.loads(payload)
    namespace = types.SimpleNamespace()
    for name, member in payload.items():
        setattr(namespace, name, _resolve(member, built))
    return namespace


def _rebuild(functions: tuple[ShippedFunction, ...]) -> list[Any]:
    """The shipped functions as JIT (and constexpr) functions of this process; [0] is the kernel."""
    built: list[Any] = [_REBUILT.get((f.module, f.qualname, f.raw_lines)) for f in functions]
    fresh = [i for i, b in enumerate(built) if b is None]
    spaces: dict[int, dict[str, Any]] = {}
    for i in fresh:
        f = functions[i]
        _place_source(f)
        space: dict[str, Any] = {"__name__": f.module, "__builtins__": builtins}
        # Values first: annotations (tl.constexpr) are evaluated when the def runs.
        space.update({k: _resolve(d, built) for k, d in f.scope.items() if d[0] != "jit"})
        body = textwrap.dedent("".join(f.raw_lines[f.def_offset:]))
        code = compile("\n" * (f.first_line - 1 + f.def_offset) + body, f.filename, "exec",
                       flags=_FUTURE_ANNOTATIONS if f.future_annotations else 0, dont_inherit=True)
        exec(code, space)  # noqa: S102 (the parent's own kernel source, as Triton itself compiles it)
        py = space[f.qualname.rsplit(".", 1)[-1]]
        py.__qualname__ = f.qualname
        spaces[i] = space
        if f.kind == "jit":
            built[i] = triton.runtime.jit.JITFunction(py, noinline=f.options.get("noinline"),
                                                      debug=f.options.get("debug"))
        else:
            built[i] = triton.constexpr_function(py)
    for i in fresh:
        f = functions[i]
        spaces[i].update({k: built[d[1]] for k, d in f.scope.items() if d[0] == "jit"})
        _REBUILT[(f.module, f.qualname, f.raw_lines)] = built[i]
    return built


class _ShippedSource(triton.compiler.ASTSource):
    """The parent's ASTSource, rebuilt here: its hash() is the parent's, so the cache key is too."""

    def __init__(self, fn: Any, signature: dict[str, Any], constexprs: dict[Any, Any], attrs: dict[Any, Any],
                 src_hash: str) -> None:
        super().__init__(fn, signature, constexprs, attrs)
        self._parent_hash = src_hash

    def hash(self) -> str:
        return self._parent_hash


def compile_described(spec: LaunchSpec) -> None:
    """In a compile worker: Triton's compile of what `spec` describes (its binary lands in Triton's cache)."""
    _sync_environment(spec)
    built = _rebuild(spec.functions)
    constexprs = {path: _resolve(d, built) for path, d in spec.constexprs.items()}
    src = _ShippedSource(built[0], spec.signature, constexprs, spec.attrs, spec.src_hash)
    triton.compile(src, target=spec.target, options=spec.options)
