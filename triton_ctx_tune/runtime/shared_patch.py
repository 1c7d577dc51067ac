"""One attribute replaced while anyone holds the patch: the mechanism behind patch.py (Autotuner.run),
streams.py (torch.cuda.set_stream) and engine/exactly_once.py (torch.autograd.backward); its holder count
(SharedHold) also keeps collector.py's garbage collector off while any call tunes.

`install()` puts the replacement in (or counts one more holder) and returns the undo, which is idempotent.
Nested and concurrent holders share one patch; the last one out puts the original back, unless someone
else replaced the attribute meanwhile (then theirs stays, with a warning).
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any


class SharedHold:
    """Something held while anyone holds it: `acquire` runs for the first holder, `release` after the last.
    `hold()` counts one more holder and returns the undo, which is idempotent. Nested and concurrent holders
    share one hold (SharedPatch below; collector.py's garbage collector off while calls tune)."""

    def __init__(self, acquire: Callable[[], None], release: Callable[[], None]) -> None:
        self.acquire, self.release = acquire, release
        self.holders = 0
        self._lock = threading.Lock()

    def hold(self) -> Callable[[], None]:
        with self._lock:
            if self.holders == 0:
                self.acquire()
            self.holders += 1
        done = False

        def undo() -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
                self.holders -= 1
                if self.holders == 0:
                    self.release()

        return undo


class SharedPatch:
    def __init__(self, owner: Any, name: str, replacement: Any, on_install: Callable[[], None] | None = None,
                 on_release: Callable[[], None] | None = None) -> None:
        self.owner, self.name, self.replacement = owner, name, replacement
        self.on_install = on_install  # run when the first holder installs
        self.on_release = on_release  # run when the last holder lets go
        self.original: Any = None  # the attribute as it was, while installed
        self._hold = SharedHold(self._put_in, self._take_out)

    @property
    def installs(self) -> int:
        return self._hold.holders

    def installed(self) -> bool:
        return vars(self.owner).get(self.name) is self.replacement

    def install(self) -> Callable[[], None]:
        return self._hold.hold()

    def _put_in(self) -> None:
        self.original = vars(self.owner)[self.name]
        setattr(self.owner, self.name, self.replacement)
        if self.on_install is not None:
            self.on_install()

    def _take_out(self) -> None:
        if self.installed():
            setattr(self.owner, self.name, self.original)
        else:
            warnings.warn(f"triton_ctx_tune: {getattr(self.owner, '__name__', self.owner)}.{self.name} was "
                          "replaced by someone else while patched; leaving their version in place.",
                          RuntimeWarning, stacklevel=3)
        self.original = None
        if self.on_release is not None:
            self.on_release()
