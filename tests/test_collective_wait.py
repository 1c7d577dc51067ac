"""How a rank waits for one of the tuner's collectives (runtime/collectives.py: Collectives._wait).

The real gloo path (a peer 0.6 s late, waited for across slices) is tests/test_dist.py's late_peer scenario.
Here, a backend whose timed wait returns at once instead of blocking, which gloo does not do: such a wait must
neither spin nor miss the deadline."""
from __future__ import annotations

import time

import pytest

from triton_ctx_tune.errors import CollectiveTimeoutError
from triton_ctx_tune.runtime.collectives import Collectives


class _ImpatientWork:
    """Completes `after_s` from its making; wait(timeout) raises at once while it is pending."""

    def __init__(self, after_s: float) -> None:
        self.done_at = time.monotonic() + after_s
        self.waits = 0

    def is_completed(self) -> bool:
        return time.monotonic() >= self.done_at

    def wait(self, timeout: object = None) -> bool:
        self.waits += 1
        if not self.is_completed():
            raise RuntimeError("Operation timed out!")
        return True


def test_a_wait_that_returns_at_once_is_polled_not_spun():
    work = _ImpatientWork(0.3)
    start = time.monotonic()
    Collectives(False, timeout_s=5.0)._wait(work, "test")
    assert 0.3 <= time.monotonic() - start < 2.0
    assert 30 < work.waits < 400  # about one wait a millisecond, not hundreds of thousands


def test_the_deadline_holds_whatever_the_backend_does():
    work = _ImpatientWork(60.0)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match="within 0.2 s"):
        Collectives(False, timeout_s=0.2)._wait(work, "test")
    assert time.monotonic() - start < 1.5
