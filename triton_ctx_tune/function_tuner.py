"""autotune(config_space, key_fn, prune_fn): Triton-distributed's function-level tuner, on our engine.

The function takes a point of the space as keyword arguments (chunk counts, SM splits, stream
layouts: knobs that are not triton.Configs). For each point, the @triton.autotune kernels it
launches are tuned in context, as contextual_autotune does, because their keys and best configs
may depend on the point; points are compared on the end-to-end time of whole executions (MAX
over ranks), screened with the same early stopping as kernel configs (search.py). Rank 0's
decision, the point and every kernel's config under it, reaches every rank, the persistent
cache (function_cache.py), the logs and `report`.

A drop-in rather than an extension of contextual_autotune: code written for Triton-distributed
keeps its decorator and its per-call switches (autotune, autotune_verbose, autotune_pg,
autotune_allow_arg_overwrite) unchanged, and a function without a space stays as cheap as it is.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from .engine.call import Call
from .engine.search import PointTunable
from .engine.session import CallStats, Session
from .errors import InvalidOptionError, call_hook
from .options import TuneOptions
from .runtime import patch, resolver
from .runtime.collectives import require_process_group
from .runtime.compat import Autotuner, config_str
from .store import function_cache
from .tuner import ContextualAutotuner

R = TypeVar("R")
Space = Iterable[dict[str, Any]] | Callable[..., Iterable[dict[str, Any]]]


@dataclass
class Winner:
    point: dict[str, Any]
    installs: list[tuple[Autotuner, tuple, Any]]  # the kernels' winners under the point, for Autotuner.cache


class FunctionAutotuner(ContextualAutotuner[R]):
    """A function tuned over a space of keyword arguments, jointly with the kernels it launches.

    A ContextualAutotuner whose calls take Triton-distributed's switches and run the function with
    a point of the space: it shares the wrapper (methods, torch.compile) and the call loop (_drive).
    """

    def __init__(self, fn: Callable[..., R], config_space: Space, key_fn: Callable[..., Any] | None,
                 prune_fn: Callable[..., bool] | None, opts: TuneOptions, is_dist: bool | None) -> None:
        if opts.online:
            raise InvalidOptionError("online", True, "False under autotune(config_space=...): points are timed end "
                                     "to end, one whole execution each; use contextual_autotune(online=True) for "
                                     "the kernels alone")
        if not callable(config_space):
            config_space = _check_points(config_space, "config_space")
            if not config_space:
                raise InvalidOptionError("config_space", config_space, "a non-empty list of dicts of keyword arguments")
        for name, f in (("key_fn", key_fn), ("prune_fn", prune_fn)):
            if f is not None and not callable(f):
                raise InvalidOptionError(name, f, "a callable taking the function's arguments, or None")
        super().__init__(fn, opts)
        # The keywords the function takes (None: it takes **kwargs): a point naming another one would
        # fail in every execution, so it is refused before any.
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # no signature to read (a builtin): let the executions say
            params = [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
        self._takes: frozenset[str] | None = (None if any(p.kind is p.VAR_KEYWORD for p in params) else frozenset(
            p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)))
        if not callable(config_space):
            self._check_names(config_space, "config_space")
        self.config_space = config_space
        self.key_fn = key_fn
        self.prune_fn = prune_fn
        self.is_dist = is_dist
        self.best: dict[Any, Winner] = {}
        self._last_point: dict[str, Any] | None = None

    @property
    def last_call(self) -> CallStats | None:
        """What the last call did: executions, the point, the kernels tuned, wall time."""
        if self._last is None:
            return None
        stats = self._last.stats
        if stats.point is None and self._last_point is not None:
            stats.point = dict(self._last_point)
        return stats

    def space(self, args: tuple, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        """The points for these arguments: config_space (called if it is a callable), then prune_fn."""
        space = self.config_space
        if callable(space):
            takes_args = bool(inspect.signature(space).parameters)
            fix = "make config_space(*args, **kwargs) return a list of dicts of keyword arguments for these arguments"
            space = _check_points(call_hook("config_space()", fix, space, *args, **kwargs) if takes_args
                                  else call_hook("config_space()", fix, space), "config_space()")
            self._check_names(space, "config_space()")
        if self.prune_fn is not None:
            space = [p for p in space if call_hook(
                "prune_fn", "make prune_fn(point, *args, **kwargs) return True to keep the point, False to drop it, "
                "for every point and these arguments", self.prune_fn, p, *args, **kwargs)]
        if not space:
            raise InvalidOptionError("config_space", "[] after prune_fn",
                                     "a space that keeps at least one point for these arguments (check prune_fn)")
        return list(space)

    def _call(self, *args: Any, autotune: bool = True, autotune_verbose: bool = False,
              autotune_allow_arg_overwrite: bool = False, autotune_pg: Any = None, **kwargs: Any) -> R:
        if autotune is not True or autotune_verbose is not False or autotune_allow_arg_overwrite is not False \
                or autotune_pg is not None:  # the plain call pays one comparison per switch, nothing more
            _check_switches(autotune=autotune, autotune_verbose=autotune_verbose,
                            autotune_allow_arg_overwrite=autotune_allow_arg_overwrite, autotune_pg=autotune_pg)
        points = self.space(args, kwargs)
        clash = set(kwargs) & set().union(*points)
        if clash and not autotune_allow_arg_overwrite:
            raise InvalidOptionError("keyword arguments", sorted(clash),
                                     "names that are not in config_space (or autotune_allow_arg_overwrite=True, "
                                     "which lets the caller's value win)")
        if resolver.current() is not None:  # inside another tuning call: run as part of it
            return self.fn(*args, **{**points[0], **kwargs})
        opts = self._options(autotune_verbose, autotune_pg)
        key = (call_hook("key_fn", "make key_fn(*args, **kwargs) return a hashable value for these arguments, "
                         "such as a tuple of ints (shapes) and strings (dtypes)", self.key_fn, *args,
                         check=_unhashable, **kwargs) if self.key_fn is not None else None)
        if isinstance(key, Mapping):  # named values: bucketed by name (buckets=), then a sorted tuple that hashes
            key = opts.bucketing.function_key(key) if opts.bucketing is not None else tuple(sorted(key.items()))
        if not autotune:
            return self._run(opts, args, kwargs, points[0], None)
        winner = self.best.get(key)
        if winner is not None:
            for at, k, config in winner.installs:  # other keys of this function may share a kernel key
                at.cache[k] = config
            return self._run(opts, args, kwargs, winner.point, None)
        return self._run(opts, args, kwargs, None, (key, points))

    def _options(self, verbose: bool, pg: Any) -> TuneOptions:
        changes: dict[str, Any] = {}
        if pg is not None:
            changes.update(group=pg, is_dist=True)
        elif self.is_dist is None:
            changes["is_dist"] = torch.distributed.is_available() and torch.distributed.is_initialized()
        if verbose:
            changes["quiet"] = False
        return dataclasses.replace(self.opts, **changes) if changes else self.opts

    def _run(self, opts: TuneOptions, args: tuple, kwargs: dict[str, Any], point: dict[str, Any] | None,
             tune: tuple[Any, list[dict[str, Any]]] | None) -> R:
        require_process_group(opts.is_dist, self.name)
        if not patch.resident or patch.cover_changed():  # (cover_changed: a library imported since)
            patch.make_resident()
        call = Call(self.name, opts)
        self._last = call
        lookup = None
        if tune is not None:
            key, points = tune
            session = Session(self.name, opts, PointTunable(configs=points, n_warmup=opts.n_warmup,
                                                            n_repeat=opts.n_repeat, function=self.name,
                                                            early_stop=opts.resolved_early_stop()))
            try:
                lookup = function_cache.lookup(opts.resolved_cache_dir(), function_cache.function_identity(
                    self.fn, self.name, key, points, session.comm.world, opts.objective, opts.reduce, opts.stat,
                    None if (budget := opts.resolved_budget()) is None else f"{budget.limit:g} {budget.measure}"),
                    session.comm, opts.resolved_retune(), opts.resolved_shipped())
                if lookup.hit:
                    assert lookup.entry is not None and session.search.points is not None
                    winner = int(lookup.entry["winner"]["index"])
                    session.search.points.winner = winner
                    session.executor.pins = lookup.pins()  # the executor installs them as launches meet them
                    session.stats.cache_hits += 1
                    session.ensure_header()
                    session.log.write("cache-hit", f"cache-hit function={self.name} key={key!r} winner=point#{winner} "
                                      f"{points[winner]} from {lookup.where}", function=self.name, key=repr(key),
                                      winner=winner, path=str(lookup.path), entry=lookup.entry, source=lookup.source)
                    session.log.summary(f"{self.name}: point {points[winner]} (from the tuning cache, tuned "
                                        f"{lookup.entry['tuned']['date']})")
                elif lookup.stale is not None:  # rank 0: a shipped entry of this key that does not apply, and why
                    session.ensure_header()
                    line, fields = lookup.stale.describe(self.name, repr(key))
                    session.log.write("cache-stale", line, **fields)
                session.on_point_decided = functools.partial(self._store, lookup)
                call.attach(session)
            except BaseException as e:
                session.close(type(e), e)  # (its services hold the stream watch)
                raise
        result = self._drive(call, args, kwargs, point)
        if tune is not None and call.session is not None:
            self._remember(tune[0], call.session)
        self._last_point = point
        return result

    def _remember(self, key: Any, session: Session) -> None:
        pts = session.search.points
        if pts is None or pts.winner is None:
            return
        installs = list(session.installed)
        for s in session.search.of_point(pts.winner):
            if s.winner is not None:
                installs.append((s.autotuner, s.key, s.configs[s.winner]))
        self.best[key] = Winner(dict(pts.configs[pts.winner]), installs)
        session.stats.point = dict(pts.configs[pts.winner])

    def _store(self, lookup: function_cache.FunctionLookup, session: Session, decided: dict[str, Any]) -> None:
        if session.opts.resolved_cache_dir() is None or lookup.hit:
            return
        pts = session.search.points
        assert pts is not None and pts.winner is not None
        kernels = [{"kernel": s.kernel, "key": repr(s.key), "configs": [config_str(c) for c in s.configs],
                    "winner": s.winner, "config": config_str(s.configs[s.winner])}
                   for s in session.search.of_point(pts.winner) if s.winner is not None]
        path = function_cache.store(lookup, session.comm, decided["winner"], decided["reduced"], decided["per_rank"],
                                    kernels, {"function": self.name, "executions": session.stats.executions,
                                              "tuning_s": pts.tuning_s})
        if path is not None:
            session.log.write("cache-store", f"cache-store function={self.name} point#{decided['winner']} -> {path}",
                              function=self.name, path=str(path))


    def _check_names(self, points: list[dict[str, Any]], what: str) -> None:
        if self._takes is None:
            return
        for point in points:
            unknown = sorted(set(point) - self._takes)
            if unknown:
                raise InvalidOptionError(
                    what, point, f"points whose names are keyword arguments of {self.name}, which takes "
                    f"{', '.join(sorted(self._takes)) or 'none'} (not {', '.join(unknown)}): rename the point's "
                    "keys, or add those parameters to the function")


def _check_switches(autotune_pg: Any, **flags: Any) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):  # a string such as "false" would be truthy and silently mean True
            raise InvalidOptionError(name, value, "True or False (a per-call switch of the tuned function)")
    if autotune_pg is not None and torch.distributed.is_available() \
            and not isinstance(autotune_pg, torch.distributed.ProcessGroup):
        raise InvalidOptionError("autotune_pg", autotune_pg, "a torch.distributed process group (e.g. "
                                 "torch.distributed.new_group(ranks)), or None for the default group")


def _unhashable(key: Any) -> str | None:
    if isinstance(key, Mapping):
        key = tuple(key.items())
    try:
        hash(key)
    except TypeError:
        return f"returned {key!r}, which is not hashable ({type(key).__name__}), so it cannot key the tuned results"
    return None


def _check_points(points: Any, what: str) -> list[dict[str, Any]]:
    try:
        listed = list(points) if not isinstance(points, (dict, str, bytes)) else None
    except TypeError:  # not iterable at all (a number, None)
        listed = None
    if listed is None or not all(isinstance(p, dict) and all(isinstance(k, str) for k in p) for p in listed):
        raise InvalidOptionError(what, points if listed is None else listed,
                                 "a list of dicts mapping keyword-argument names to values, "
                                 "e.g. [{'chunks': 2}, {'chunks': 4}]")
    return listed


def autotune(config_space: Space, key_fn: Callable[..., Any] | None = None, prune_fn: Callable[..., bool] | None = None,
             *, is_dist: bool | None = None, **options: Any) -> Callable[[Callable[..., R]], FunctionAutotuner[R]]:
    """Tune a function over `config_space` (points passed as keyword arguments), jointly with its kernels.

    Same signature as Triton-distributed's triton_dist.tune.autotune: `key_fn(*args, **kwargs)` names
    the tuning key, `prune_fn(point, *args, **kwargs)` keeps a point when it returns True. The calls
    take its switches: autotune=False runs the first point, autotune_verbose=True prints decisions,
    autotune_pg=group tunes over that group. is_dist=None: distributed when torch.distributed is
    initialized. The other keyword options are contextual_autotune's (TuneOptions).
    """
    opts = TuneOptions.from_kwargs(is_dist=bool(is_dist), **options)
    return lambda fn: FunctionAutotuner(fn, config_space, key_fn, prune_fn, opts, is_dist)
