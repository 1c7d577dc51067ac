"""Autotuners that are not quite Triton's, in one table: what a tuning call does with each.

Some libraries subclass Triton's Autotuner and override `run` (flag-gems' LibTuner: its own key
"strategies", a "policy" that picks the config, a sqlite cache of winners), and some wrap an
autotuner in a launcher that caches compiled kernels above it (flag-gems' LibEntry: after its first
launch of an argument signature, later launches never reach Autotuner.run). A dispatcher on
Autotuner.run sees neither: inside a tuning call such a kernel would benchmark itself on the call's
real buffers, on each rank alone, or keep running whatever config its first launch happened to get.

patch.py covers both kinds while the patch is held (their `run` is replaced too). Then:
- a subclass whose run keeps Triton's meaning is tuned like any autotuned kernel, under the key its
  own run would cache under (`Subclass.key`), and its winner goes into its own `cache`;
- a subclass whose run does some work and then calls Triton's (`super().run(...)`, FLA's CachedAutotuner)
  keeps its run: the patch of Autotuner.run sees the launch when it gets there;
- any other subclass that overrides run is refused by name: a warning says what it does and how to
  tune it, and inside tuning calls it runs its first config, untuned, the same on every rank;
- a caching launcher passes every launch made inside a tuning call straight down to its autotuner
  (nothing it caches there outlives the call's choice, since it caches nothing then).
Users declare their own subclasses with `tune_like_triton(cls, key=...)`.
"""
from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedAutotunerWarning
from .compat import Autotuner, kernel_name, launch_cached, prune_configs
from .compat import tuning_key as triton_tuning_key

KeyFn = Callable[[Any, dict[str, Any]], tuple]


@dataclass(frozen=True)
class Subclass:
    """How a tuning call treats one Autotuner subclass that overrides run."""
    name: str  # module.QualName
    tuned: bool  # True: tuned like Triton's; False: refused (first config, untuned, warned)
    does: str  # what its run does, for the refusal's warning and docs/compatibility.md
    key: KeyFn | None = None  # (autotuner, named kernel arguments) -> the key its run caches under
    # Its run does some work of its own and then calls Triton's (super().run), which the patch of Autotuner.run
    # sees: its run is left in place, so that work still happens (FLA loads shipped configs into `cache`).
    delegates: bool = False


def _flag_gems_key(at: Any, named: dict[str, Any]) -> tuple:
    return tuple(at.get_key(named))


# Known subclasses, by where they are defined (a library need not be importable here).
KNOWN: dict[str, Subclass] = {s.name: s for s in (
    Subclass("flag_gems.utils.libentry.LibTuner", True,
             "keys its winners by per-argument 'strategy' functions (e.g. align32, log) and keeps them in a sqlite "
             "cache; its default policy benchmarks every pruned config and keeps the fastest, as Triton's run does",
             _flag_gems_key),
    Subclass("fla.ops.utils.cache.CachedAutotuner", True,
             "loads FLA's shipped best config of a key into `cache`, then calls Triton's run", delegates=True),
)}

# Launchers that cache compiled kernels above an autotuner: module.QualName -> what they do.
CACHING_LAUNCHERS: dict[str, str] = {
    "flag_gems.utils.libentry.LibEntry": "caches the compiled kernel of each argument signature, with the config its "
                                         "autotuner chose first, so later launches never reach Autotuner.run",
}

_declared: dict[type, Subclass] = {}
_rules: dict[type, Subclass | None] = {}  # per class, once: rule() runs on every launch
_warned: set[type] = set()


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def tune_like_triton(cls: type, key: KeyFn | None = None) -> type:
    """Declare that `cls` (an Autotuner subclass that overrides run) keeps the meaning of Triton's run: a
    tuning call then tunes its kernels like any autotuned kernel. `key(autotuner, named_args)` is the
    key its run caches winners under (default: Triton's key). Returns cls, so it works as a decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Autotuner)):
        raise TypeError(f"tune_like_triton takes a subclass of triton.runtime.Autotuner, got {cls!r}")
    _declared[cls] = Subclass(_qualified(cls), True, "declared with tune_like_triton", key)
    _rules.clear()
    return cls


def overrides_run(cls: type) -> bool:
    """Whether cls defines run below Autotuner (then the patch of Autotuner.run does not reach it)."""
    return any("run" in vars(klass) for klass in cls.__mro__[:cls.__mro__.index(Autotuner)])


def _calls_triton_run(cls: type) -> bool:
    """Whether the run that cls defines ends in Triton's (`super().run(`): then it delegates."""
    import inspect

    klass = next(k for k in cls.__mro__ if "run" in vars(k))
    try:
        source = inspect.getsource(vars(klass)["run"])
    except (OSError, TypeError):
        return False  # no source to read: refused rather than guessed
    return "super().run(" in source or "Autotuner.run(self" in source


def rule_of(cls: type) -> Subclass | None:
    """How to treat autotuners of class `cls`: None for Triton's own run (or a subclass that inherits it)."""
    if cls in _rules:
        return _rules[cls]
    found: Subclass | None = None
    if cls is not Autotuner and overrides_run(cls):
        for klass in cls.__mro__:
            found = _declared.get(klass) or KNOWN.get(_qualified(klass))
            if found is not None:
                break
        else:
            found = (Subclass(_qualified(cls), True, "does its own work, then calls Triton's run", delegates=True)
                     if _calls_triton_run(cls) else
                     Subclass(_qualified(cls), False, "overrides Autotuner.run with its own benchmarking or caching"))
    _rules[cls] = found
    return found


def rule(at: Any) -> Subclass | None:
    """How to treat autotuner `at` (rule_of its class)."""
    return rule_of(type(at))


def tuning_key(at: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
    """The key a launch is tuned and cached under: its own run's for a known subclass, else Triton's."""
    r = rule(at)
    if r is None or r.key is None:
        return triton_tuning_key(at, args, kwargs)
    all_args = {**dict(zip(at.arg_names, args)), **kwargs}
    return r.key(at, {k: v for k, v in all_args.items() if k in at.arg_names})


def refused(at: Any) -> bool:
    """Whether a tuning call refuses to tune `at` (an unknown subclass that overrides run)."""
    r = rule(at)
    return r is not None and not r.tuned


def launch_refused(at: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """A refused autotuner's launch inside a tuning call: its first (pruned) config, untuned, the same on every
    rank, and never its own run, which would benchmark on the call's buffers on each rank alone. Warns once."""
    r = rule(at)
    assert r is not None
    if type(at) not in _warned:
        _warned.add(type(at))
        warnings.warn(UnsupportedAutotunerWarning(kernel_name(at), r.name, r.does), stacklevel=5)
    return launch_cached(at, prune_configs(at, args, kwargs)[0], args, kwargs)


def overriding_subclasses() -> Iterator[type]:
    """Every Autotuner subclass defined so far that defines run itself and does not delegate to Triton's."""
    seen: set[type] = set()
    todo = list(Autotuner.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        r = rule_of(cls) if "run" in vars(cls) else None
        if r is not None and not r.delegates:
            yield cls


def caching_launchers() -> Iterator[tuple[type, str]]:
    """The known caching launchers whose module is imported."""
    for name, does in CACHING_LAUNCHERS.items():
        module, _, qualname = name.rpartition(".")
        cls = getattr(sys.modules.get(module), qualname, None)
        if isinstance(cls, type) and "run" in vars(cls):
            yield cls, does


def cache_winners(at: Any) -> list[tuple[Any, Any]]:
    """(key, config) of what `at.cache` holds; [] for a cache that cannot list itself (flag-gems' sqlite one)."""
    items = getattr(at.cache, "items", None)
    return list(items()) if callable(items) else []


def can_forget(at: Any) -> bool:
    """Whether `at.cache` can take a trial config back (a dict can; flag-gems' sqlite cache cannot)."""
    return callable(getattr(at.cache, "pop", None))


def forget(at: Any, key: Any) -> None:
    """Remove an undecided key from `at.cache`; only caches that can_forget() are ever given one."""
    if can_forget(at):
        at.cache.pop(key, None)
