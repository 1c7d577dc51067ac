"""The tuner's own collectives, each bounded in time.

Every helper is a no-op (it returns what a one-rank group would) when is_dist=False or
torch.distributed is not initialized, so the single-process path has no special cases.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable, Sequence

import torch

from ..errors import CollectiveTimeoutError, NoProcessGroupError


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def require_process_group(is_dist: bool, function: str) -> None:
    """is_dist=True needs a process group when the function is called (not when it is decorated, which
    happens at import, before init_process_group): without one, each process would tune alone, silently."""
    if is_dist and _dist() is None:
        raise NoProcessGroupError(function)


class Collectives:
    def __init__(self, is_dist: bool, group: Any = None, timeout_s: float = 300.0) -> None:
        self.dist = _dist() if is_dist else None
        self.group = group
        self.timeout_s = timeout_s
        if self.dist is None:
            self.rank, self.world, self.global_rank = 0, 1, 0
            self.device = torch.device("cpu")
            return
        d = self.dist
        self.rank = d.get_rank(group)
        self.world = d.get_world_size(group)
        self.global_rank = d.get_rank()
        self.root = d.get_global_rank(group, 0) if group is not None else 0
        backend = str(d.get_backend(group)).lower()
        # NCCL only moves CUDA tensors; gloo (and a "cpu:gloo,cuda:nccl" pair) takes CPU ones.
        use_cuda = "nccl" in backend and "gloo" not in backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")

    @property
    def active(self) -> bool:
        return self.dist is not None and self.world > 1

    def _wait(self, work: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        pause = 1e-5
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise CollectiveTimeoutError(what, self.timeout_s, self.global_rank, self.world)
            time.sleep(pause)
            pause = min(pause * 2, 5e-3)
        work.wait()

    def all_gather(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Stack every rank's tensor (same shape and dtype everywhere): result[r] is rank r's."""
        if not self.active:
            return tensor.unsqueeze(0).clone()
        t = tensor.to(self.device).contiguous()
        out = [torch.empty_like(t) for _ in range(self.world)]
        self._wait(self.dist.all_gather(out, t, group=self.group, async_op=True), what)
        return torch.stack(out).cpu()

    def broadcast_from_root(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """The group's rank 0 value, on every rank."""
        if not self.active:
            return tensor.clone()
        t = tensor.to(self.device).contiguous()
        self._wait(self.dist.broadcast(t, src=self.root, group=self.group, async_op=True), what)
        return t.cpu()

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        """Every rank's byte string, in rank order (lengths may differ)."""
        if not self.active:
            return [data]
        sizes = self.all_gather(torch.tensor([len(data)], dtype=torch.int64), what + " (sizes)")
        longest = int(sizes.max())
        buf = torch.zeros(max(longest, 1), dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        rows = self.all_gather(buf, what)
        return [bytes(rows[r, : int(sizes[r, 0])].tolist()) for r in range(self.world)]

    def agree(self, identity: bytes, what: str, explain: Callable[[], bytes],
              payload: Sequence[int] = ()) -> tuple[torch.Tensor, list[bytes] | None]:
        """Check that every rank holds the same `identity`, in one small all-gather.

        Returns every rank's `payload` (small ints riding along, [world, len(payload)]) and None when
        all identities match; otherwise every rank's `explain()` (gathered only then, so the common
        case costs one collective). Every rank gets the same answer, so all of them take the same branch.
        """
        digest = torch.frombuffer(bytearray(hashlib.sha256(identity).digest()[:16]), dtype=torch.int64)
        row = torch.cat([digest, torch.tensor(list(payload), dtype=torch.int64)])
        rows = self.all_gather(row, what)
        if bool((rows[:, :2] == rows[0, :2]).all()):
            return rows[:, 2:], None
        return rows[:, 2:], self.all_gather_bytes(explain(), what + ": the differences")

    def barrier(self, what: str) -> None:
        """Every rank reaches this point before any goes on (a bounded all-gather of one number)."""
        if self.active:
            self.all_gather(torch.zeros(1, dtype=torch.int64), what)

    def share_failures(self, mine: dict[int, str], n: int, what: str) -> dict[int, str]:
        """Every rank's failed configs (indices below `n`), on every rank: ours as given, others' as "rank r: reason".

        One small all-gather of flags; the reasons are gathered only when some rank has a failure,
        which every rank learns from the same flags, so all of them take the same branch.
        """
        shared = dict(mine)
        flags = torch.zeros(n, dtype=torch.int64)
        for i in mine:
            if 0 <= i < n:
                flags[i] = 1
        if not bool(self.all_gather(flags, what).amax(0).any()):
            return shared
        blobs = self.all_gather_bytes(json.dumps({str(i): r for i, r in mine.items()}).encode(), f"{what}: reasons")
        for rank, blob in enumerate(blobs):
            for i, reason in json.loads(blob).items():
                shared.setdefault(int(i), f"rank {rank}: {reason}")
        return shared
