"""Which streams a tuning call's function works on, so that a key launched while another of them is busy
is known to overlap that work (engine/decisions.py then confirms it end to end under objective="auto").

`torch.cuda.stream(s)` and `torch.cuda.set_stream(s)` both go through `torch.cuda.set_stream`. While a
tuning call re-executes its function, a wrapper there notes each stream the function makes current.
A launch overlaps when one of those streams, other than the launch's own, still has work queued
(`Stream.query()` is False): an all-gather issued on a side stream, or a side stream that waits for
NCCL's. Work on a stream the function never makes current (NCCL's own, behind an async collective issued
from the launch's stream) is not seen. Without CUDA (the interpreter) nothing is noted.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .shared_patch import SharedPatch

_seen: dict[tuple[int, int], Any] = {}  # (device, stream id) -> a stream the function made current


def _noting_set_stream(stream: Any) -> None:
    if stream is not None and stream != torch.cuda.default_stream(stream.device):
        _seen[(stream.device_index, stream.stream_id)] = stream
    _patch.original(stream)


_patch = SharedPatch(torch.cuda, "set_stream", _noting_set_stream, on_release=_seen.clear)


def watch() -> Callable[[], None]:
    """Note the streams made current until the returned undo runs (calls that overlap share one patch)."""
    if not torch.cuda.is_available():
        return lambda: None
    return _patch.install()


def busy_elsewhere() -> bool:
    """Whether a stream the function made current, other than the current one, still has work queued."""
    if not _seen:
        return False
    current = torch.cuda.current_stream()
    return any(s != current and not s.query() for s in list(_seen.values()))
