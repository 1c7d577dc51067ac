"""Per-rank logs: a human-readable rank-{i}.log and a machine-readable rank-{i}.jsonl.

Both are appended to and flushed line by line, so a crashed or killed job still leaves
everything it measured. Rank 0 also prints one summary line per tuned key on stderr.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

from . import __version__
from .compat import TRITON_VERSION, print_autotuning

DEFAULT_LOG_DIR = "./.autotune_logs"
_calls = itertools.count(1)


def fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.4f} ms"


class RankLog:
    """Opened lazily: a call that tunes nothing writes nothing."""

    def __init__(self, log_dir: str | os.PathLike[str] | None, rank: int, quiet: bool) -> None:
        self.dir = Path(log_dir) if log_dir is not None else None
        self.rank = rank
        self.quiet = quiet
        self._text: IO[str] | None = None
        self._jsonl: IO[str] | None = None
        # Jobs that share a log directory append to the same files: this tells their records apart.
        self.call = f"{socket.gethostname()}:{os.getpid()}:{next(_calls)}"

    @property
    def paths(self) -> tuple[Path, Path] | None:
        if self.dir is None:
            return None
        return self.dir / f"rank-{self.rank}.log", self.dir / f"rank-{self.rank}.jsonl"

    def _open(self) -> None:
        if self._text is not None or self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        text, jsonl = self.paths  # type: ignore[misc]
        self._text = open(text, "a", encoding="utf-8")
        self._jsonl = open(jsonl, "a", encoding="utf-8")

    def write(self, event: str, line: str, **fields: Any) -> None:
        if print_autotuning() and self.rank == 0:
            print(f"[triton_ctx_tune] {line}", flush=True)
        if self.dir is None:
            return
        self._open()
        assert self._text is not None and self._jsonl is not None
        self._text.write(f"[rank-{self.rank}] {line}\n")
        self._text.flush()
        record = {"event": event, "rank": self.rank, "call": self.call, "time": time.time(), **fields}
        self._jsonl.write(json.dumps(record, default=repr) + "\n")
        self._jsonl.flush()

    def header(self, function: str, world: int, device: str, timer: str) -> None:
        import torch

        self.write("call", f"=== tuning {function}: world={world} device={device} timer={timer} "
                   f"triton={TRITON_VERSION} torch={torch.__version__} triton_ctx_tune={__version__} "
                   f"host={socket.gethostname()} pid={os.getpid()}",
                   function=function, world=world, device=device, timer=timer, triton=TRITON_VERSION,
                   torch=torch.__version__, triton_ctx_tune=__version__, host=socket.gethostname(), pid=os.getpid())

    def summary(self, line: str) -> None:
        """One line per tuned key on rank 0's stderr unless silenced."""
        if self.rank == 0 and not self.quiet:
            print(f"[triton_ctx_tune] {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        for f in (self._text, self._jsonl):
            if f is not None:
                f.close()
        self._text = self._jsonl = None

