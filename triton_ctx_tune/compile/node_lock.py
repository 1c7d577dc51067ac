"""A lock on the node, shared by the processes of its local ranks and their compile workers: a file in Triton's
cache dir, held with flock. The OS drops it when its holder dies, so a crashed or killed holder never leaves
others waiting. Where a cache dir takes no lock (some network file systems), open_lock answers None and each
process does the work itself: the locks save work, they never decide what anyone gets."""
from __future__ import annotations

import contextlib
import fcntl
import os


def open_lock(folder: str, name: str) -> int | None:
    """The file descriptor of lock `name` in `folder` (created), not yet taken; None where none can be made."""
    try:
        os.makedirs(folder, exist_ok=True)
        return os.open(os.path.join(folder, name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None


def take(fd: int, wait: bool) -> bool | None:
    """Take the lock: True when held; False when another process holds it (only with wait=False); None when this
    file system takes no lock (fd is closed then)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        os.close(fd)
        return None


def release(fd: int) -> None:
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
