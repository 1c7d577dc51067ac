"""Shape buckets: which tuned key a launch falls into, so that a server's new token count is not a new tuning.

`buckets={"M": rule}` names a dimension and how its values group. The name is matched against each
@triton.autotune kernel's `key=[...]` argument names (and against the names of the mapping that an
autotune() `key_fn` returns). A rule maps a value to its bucket's value, which is also the shape
tune-ahead tunes for that bucket (its *representative*):

- ``"pow2"``: the next power of two at or above the value (1, 2, 4, ..., 2048, ...); 0 stays 0.
- a sorted list of ints ``[b0 < b1 < ... < bn]``: the smallest bi at or above the value; values
  above bn fall into bn, the largest bucket.
- a callable ``rule(value) -> int``: your own grouping.

A key's other values (other dimensions, dtypes) are kept as they are. A key tuned inside a normal
call is tuned on the call's own shape and then serves its whole bucket.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import InvalidOptionError

Rule = str | Sequence[int] | Callable[[int], int]
RULE_NAMES = ("pow2",)
_FIX = ('a dict mapping a key dimension\'s name to "pow2", a sorted list of ints (bucket edges), or a callable '
        'value -> bucket value, e.g. buckets={"M": "pow2"}')


def _pow2(value: int) -> int:
    return 0 if value <= 0 else 1 << (value - 1).bit_length()


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class Buckets:
    """Validated bucket rules, and the key mapping every launch of a bucketed function goes through."""

    __slots__ = ("rules", "_funcs", "_plans")

    def __init__(self, rules: Mapping[str, Rule]) -> None:
        if not isinstance(rules, Mapping) or not rules:
            raise InvalidOptionError("buckets", rules, _FIX)
        funcs: dict[str, Callable[[int], int]] = {}
        for name, rule in rules.items():
            if not isinstance(name, str) or not name:
                raise InvalidOptionError("buckets", rules, _FIX + f" (the name {name!r} is not a non-empty string)")
            funcs[name] = _rule_function(name, rule)
        self.rules = dict(rules)
        self._funcs = funcs
        self._plans: dict[int, tuple[tuple[int, str], ...]] = {}  # id(autotuner) -> (key position, name) to map

    def value(self, name: str, value: Any) -> Any:
        """The bucket of one dimension's value (values that are not ints are their own bucket)."""
        if not _is_int(value):
            return value
        bucket = self._funcs[name](value)
        if not _is_int(bucket):
            raise InvalidOptionError("buckets", self.rules[name], f"a rule for {name!r} that returns an int "
                                     f"(it returned {bucket!r} for {value})")
        return bucket

    def kernel_key(self, at: Any, key: tuple) -> tuple:
        """A kernel's tuning key with its bucketed dimensions replaced by their buckets."""
        plan = self._plans.get(id(at))
        if plan is None:
            names = [k for k in at.keys if k in at.arg_names]  # the key's order (compat.tuning_key)
            plan = self._plans[id(at)] = tuple((i, n) for i, n in enumerate(names) if n in self._funcs)
        if not plan:
            return key
        mapped = list(key)
        for i, name in plan:
            if i < len(mapped):
                mapped[i] = self.value(name, mapped[i])
        return tuple(mapped)

    def function_key(self, key: Any) -> Any:
        """An autotune() key: a mapping's named values bucketed (then a sorted tuple of pairs, so it hashes)."""
        if isinstance(key, Mapping):
            return tuple(sorted((k, self.value(k, v) if k in self._funcs else v) for k, v in key.items()))
        return key

    def dimensions(self, at: Any) -> list[int]:
        """The positions in `at`'s key that are bucketed."""
        self.kernel_key(at, ())
        return [i for i, _ in self._plans[id(at)]]

    def sizes(self, name: str, up_to: int) -> list[int]:
        """Every bucket of dimension `name` from 1 to `up_to`: the representatives tune-ahead tunes."""
        if name not in self._funcs:
            raise InvalidOptionError("tune_ahead(dim=...)", name,
                                     f"one of the bucketed dimensions {sorted(self._funcs)}")
        if not _is_int(up_to) or up_to < 1:
            raise InvalidOptionError("tune_ahead(up_to=...)", up_to, "an int >= 1: the largest size to serve")
        return sorted({self.value(name, v) for v in range(1, up_to + 1)})


def _rule_function(name: str, rule: Rule) -> Callable[[int], int]:
    if isinstance(rule, str):
        if rule == "pow2":
            return _pow2
        raise InvalidOptionError("buckets", {name: rule}, f"one of {', '.join(map(repr, RULE_NAMES))}, a sorted list "
                                 "of ints, or a callable (unknown rule name)")
    if callable(rule):
        return rule
    if isinstance(rule, (list, tuple)) and rule and all(_is_int(b) for b in rule) \
            and all(a < b for a, b in zip(rule, rule[1:])):
        edges = list(rule)
        return lambda value: edges[min(bisect.bisect_left(edges, value), len(edges) - 1)]
    raise InvalidOptionError("buckets", {name: rule},
                             _FIX + " (a list must be non-empty, of ints, strictly increasing)")


def key_by_name(at: Any, key: tuple) -> dict[str, Any]:
    """A kernel key's values by the names in @triton.autotune(key=[...]) (dtypes, which follow, left out)."""
    return dict(zip([k for k in at.keys if k in at.arg_names], key))


def nearest(key: tuple, candidates: Iterable[tuple], dims: Sequence[int] | None = None) -> tuple | None:
    """The candidate key closest to `key`, or None: same length, equal outside `dims` (None: every int
    position is a dimension), and nearest on a log scale in the dimensions (ties: the smaller key)."""
    best: tuple[float, str, tuple] | None = None
    for cand in candidates:
        if not isinstance(cand, tuple) or len(cand) != len(key) or cand == key:
            continue
        distance = 0.0
        for i, (a, b) in enumerate(zip(key, cand)):
            if (i in dims) if dims is not None else (_is_int(a) and _is_int(b)):
                if not (_is_int(a) and _is_int(b)):
                    break
                distance += abs(math.log2(max(a, 0) + 1) - math.log2(max(b, 0) + 1))
            elif a != b:
                break
        else:
            ranked = (distance, repr(cand), cand)
            if best is None or ranked[:2] < best[:2]:
                best = ranked
    return None if best is None else best[2]
