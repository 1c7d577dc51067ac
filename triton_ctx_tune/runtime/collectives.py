"""The tuner's own collectives, each bounded in time and checked against an agreed schedule.

They run on a gloo group of the tuner's own (the user's group's ranks) with CPU tensors. Every helper is a
no-op (it returns what a one-rank group would) when is_dist=False or torch.distributed is not initialized, so
the single-process path has no special cases.
"""
from __future__ import annotations

import atexit
import datetime
import hashlib
import json
import time
import weakref
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import CollectiveTimeoutError, NoProcessGroupError, ScheduleMismatchError


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def require_process_group(is_dist: bool, function: str) -> None:
    """is_dist=True needs a process group when the function is called (not when it is decorated, which
    happens at import, before init_process_group): without one, each process would tune alone, silently."""
    if is_dist and _dist() is None:
        raise NoProcessGroupError(function)


# The schedule guard's header, one row of int64 per rank before every tuning collective: which collective of
# the process it is (a sequence number per control group), the call and step it ends, what it is (the kind and
# a checksum of its label) and the payload's size. Ranks that agree issue equal rows.
HEADER = ("seq", "call", "step", "op", "label", "numel", "dtype")
FUSED = 32  # a payload of at most this many int64/float64 numbers rides in the header's row
WAIT_SLICE_S = 0.2  # a blocked wait for a collective wakes this often to check its deadline
ABANDON_WAIT_S = 30.0  # how long a rank that leaves with an error waits for the others to hear it
_OPS = {"all_gather": 1, "broadcast": 2, "abandon": 3}


class _Control:
    """A process group of the tuner's own (gloo, same ranks as the user's group) and its collective count.

    The tuner's collectives never share a sequence with the user's: a rank that diverged can pair our small
    header with our header only, never with the user's all_reduce (on NCCL that pairing would hang or
    corrupt), and the payloads are CPU tensors that never touch the user's streams. Held weakly, as is the
    default group it was made under: destroy_process_group() must free both, with their gloo threads (a
    thread still running at interpreter finalization aborts the process; runtime/clean_exit.py)."""

    def __init__(self, group: Any, default: Any) -> None:
        self._group = weakref.ref(group)
        self._default = weakref.ref(default)
        self.seq = 0  # collectives issued on it by this process
        self.calls = 0  # Collectives objects (one per tuning call) that issued one

    @property
    def group(self) -> Any:
        group = self._group()
        if group is None:
            raise NoProcessGroupError("the tuning call")  # destroy_process_group() ran while it was tuning
        return group

    def serves(self, default: Any) -> bool:
        return self._default() is default and self._group() is not None


_controls: dict[tuple[int, ...], _Control] = {}


def _control_for(d: Any, group: Any, timeout_s: float, rank: int) -> _Control:
    ranks = tuple(d.get_process_group_ranks(group)) if group is not None else tuple(range(d.get_world_size()))
    default = d.distributed_c10d._get_default_group()
    held = _controls.get(ranks)
    if held is not None and held.serves(default):  # (a re-initialised default group gets a new control group)
        return held
    # Only the group's ranks take part (use_local_synchronization): a subgroup's outsiders never call the tuner.
    # Bounded like any collective of the tuner: a rank that never tunes never joins.
    start = time.monotonic()
    try:
        made = d.new_group(list(ranks), backend="gloo", use_local_synchronization=True,
                           timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 (torch raises DistStoreError or RuntimeError, by version)
        if time.monotonic() - start < timeout_s * 0.9:
            raise
        raise CollectiveTimeoutError("create the tuner's process group", timeout_s, rank, len(ranks)) from e
    if not _controls:
        atexit.register(_release_controls)
    _controls[ranks] = control = _Control(made, default)
    return control


def _release_controls() -> None:
    """At exit, before the interpreter finalizes: destroy the groups the tuner made (and the threads gloo
    runs for them) while Python still runs, when the program did not call destroy_process_group()."""
    d = _dist()
    for control in list(_controls.values()):
        try:
            if d is not None and control.serves(d.distributed_c10d._get_default_group()):
                d.destroy_process_group(control.group)
        except Exception:  # noqa: BLE001 (exit: a group torch already tore down has nothing left to release)
            pass
    _controls.clear()


class Collectives:
    """The tuner's collectives, each bounded in time and checked against the schedule (the guard).

    Before each collective, every rank gathers a small header (see HEADER). When the rows differ, the ranks
    are about to issue different collectives: every rank then gathers the others' descriptions and raises
    ScheduleMismatchError naming both sides, within one round trip, instead of pairing mismatched payloads.
    The session says where the schedule is (`at`: call, step, what it is doing); `on_header` records each
    header (the JSONL log), so tests can compare every rank's sequence."""

    def __init__(self, is_dist: bool, group: Any = None, timeout_s: float = 300.0) -> None:
        self.dist = _dist() if is_dist else None
        self.group = group
        self.timeout_s = timeout_s
        self.call, self.step, self.doing = 0, 0, ""  # call 0: numbered at its first collective
        self.function = ""  # the tuned function's name: ranks in different functions' calls differ at once
        self.on_header: Callable[[dict[str, Any]], None] | None = None
        self._control: _Control | None = None
        if self.dist is None:
            self.rank, self.world, self.global_rank = 0, 1, 0
            return
        d = self.dist
        self.rank = d.get_rank(group)
        self.world = d.get_world_size(group)
        self.global_rank = d.get_rank()

    @property
    def active(self) -> bool:
        return self.dist is not None and self.world > 1

    def at(self, step: int, doing: str = "") -> None:
        """Where the schedule is: the headers of the collectives that follow name it."""
        self.step, self.doing = step, doing

    def _d(self) -> Any:
        """torch.distributed, for what runs only when active (so with a process group)."""
        assert self.dist is not None
        return self.dist

    def _ctl(self) -> _Control:
        if self._control is None:
            self._control = _control_for(self._d(), self.group, self.timeout_s, self.global_rank)
        return self._control

    def _group(self) -> Any:
        return self._ctl().group

    def _wait(self, work: Any, what: str, timeout_s: float | None = None) -> None:
        """Block until `work` completes, at most `timeout_s`. A blocked wait (the GIL released) wakes the moment
        the collective ends; the old poll, sleeps doubling to 5 ms, overshot a wait for the slower rank by up
        to as long again: 2.0 to 2.2 ms per step's agreement against 1.4 to 1.5 ms blocked, on the example's
        tuning call on 2 H200s (RESULTS.md section 40). Slices of WAIT_SLICE_S let the deadline and Python's
        signal handlers run."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 and not work.is_completed():
                raise CollectiveTimeoutError(what, timeout_s, self.global_rank, self.world)
            slice_s = min(max(left, 1e-3), WAIT_SLICE_S)
            began = time.monotonic()
            try:
                work.wait(datetime.timedelta(seconds=slice_s))
                return
            except RuntimeError:
                if work.is_completed():  # it failed (a peer gone), or ended just after the slice did:
                    work.wait()  # returns, or raises the collective's own error
                    return
                # else the slice ended first ("Operation timed out!"): the collective is still pending. A backend
                # whose timed wait returns at once instead would spin here: poll it every millisecond then.
                if time.monotonic() - began < slice_s / 2:
                    time.sleep(1e-3)

    def _raw_gather(self, t: torch.Tensor, what: str, timeout_s: float | None = None) -> torch.Tensor:
        t = t.contiguous()
        out = [torch.empty_like(t) for _ in range(self.world)]
        self._wait(self._d().all_gather(out, t, group=self._group(), async_op=True), what, timeout_s)
        return torch.stack(out)

    def _raw_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        sizes = self._raw_gather(torch.tensor([len(data)], dtype=torch.int64), what)
        buf = torch.zeros(max(int(sizes.max()), 1), dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        rows = self._raw_gather(buf, what)
        return [bytes(rows[r, : int(sizes[r, 0])].tolist()) for r in range(self.world)]

    def _guard(self, op: str, what: str, payload: torch.Tensor | None,
               timeout_s: float | None = None) -> torch.Tensor | None:
        """Check the header of the collective about to run against every rank's; raise if any differs.

        A small payload (at most FUSED 8-byte numbers) rides in the header's row, which has one size on
        every rank whatever the payload: then the collective is this one gather, and every rank's payload
        ([world, *shape]) is returned. Otherwise None, and the caller issues the payload's collective."""
        control = self._ctl()
        if self.call == 0:  # this object's first collective: the call it belongs to gets the next number
            control.calls += 1
            self.call = control.calls
        control.seq += 1
        numel = -1 if payload is None else payload.numel()
        dtype = -1 if payload is None else _DTYPES.get(payload.dtype, 0)
        label = zlib.crc32(f"{self.function}\0{what}".encode())
        row = torch.zeros(len(HEADER) + FUSED, dtype=torch.int64)
        row[: len(HEADER)] = torch.tensor([control.seq, self.call, self.step, _OPS[op], label, numel, dtype])
        fused = payload is not None and payload.dtype in (torch.int64, torch.float64) and numel <= FUSED
        if fused:
            assert payload is not None
            row[len(HEADER): len(HEADER) + numel] = payload.reshape(-1).view(torch.int64)
        shape = "none" if payload is None else "x".join(map(str, payload.shape)) + f" {str(payload.dtype)[6:]}"
        mine = {"seq": control.seq, "function": self.function, "call": self.call, "step": self.step, "op": op,
                "what": what, "doing": self.doing, "shape": shape}
        if self.on_header is not None:
            self.on_header(mine)  # before the wait: a hung rank's log names the collective it is in
        rows = self._raw_gather(row, f"{what} (schedule header)", timeout_s)
        head = rows[:, : len(HEADER)]
        if bool((head == head[0]).all()):
            if not fused:
                return None
            assert payload is not None
            data = rows[:, len(HEADER): len(HEADER) + numel].contiguous().view(payload.dtype)
            return data.reshape(self.world, *payload.shape)
        views = [json.loads(b) for b in self._raw_gather_bytes(json.dumps(mine).encode(),
                                                               "explain a schedule mismatch")]
        control.seq = max(int(head[:, 0].max()), control.seq)  # later collectives start from one count again
        raise ScheduleMismatchError(self.rank, views)

    def abandon(self, reason: str) -> None:
        """This rank leaves the call with an error: ranks still at a collective of the call learn it now (their
        header differs) instead of at the deadline. Ranks that all leave with an error pass each other here."""
        if self.active:
            self.doing = f"leaving the call: {reason}"
            # Bounded shorter than a collective: ranks busy in the function's own collectives never come.
            self._guard("abandon", "leave the call with an error", None, min(self.timeout_s, ABANDON_WAIT_S))

    def all_gather(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Stack every rank's tensor (same shape and dtype everywhere): result[r] is rank r's."""
        if not self.active:
            return tensor.unsqueeze(0).clone()
        t = tensor.detach().to("cpu").contiguous()
        rows = self._guard("all_gather", what, t)
        return rows if rows is not None else self._raw_gather(t, what)

    def broadcast_from_root(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """The group's rank 0 value, on every rank."""
        if not self.active:
            return tensor.clone()
        t = tensor.detach().to("cpu").clone().contiguous()
        rows = self._guard("broadcast", what, t)
        if rows is not None:
            return rows[0].clone()  # (a small payload: every rank's rode in the header's gather; rank 0's counts)
        d = self._d()
        root = d.get_global_rank(self._group(), 0)
        self._wait(d.broadcast(t, src=root, group=self._group(), async_op=True), what)
        return t

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        """Every rank's byte string, in rank order (lengths may differ)."""
        if not self.active:
            return [data]
        self._guard("all_gather", what, None)  # (lengths differ between ranks: the header has none)
        return self._raw_gather_bytes(data, what)

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
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()  # the tuner's group is the host's: line up the GPUs' work too
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


_DTYPES = {torch.int64: 1, torch.float64: 2, torch.uint8: 3, torch.float32: 4, torch.int32: 5, torch.bool: 6}
