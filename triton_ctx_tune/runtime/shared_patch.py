"""One attribute replaced while anyone holds the patch: the mechanism behind patch.py (Autotuner.run),
streams.py (torch.cuda.set_stream) and engine/exactly_once.py (torch.autograd.backward).

`install()` puts the replacement in (or counts one more holder) and returns the undo, which is idempotent.
Nested and concurrent holders share one patch; the last one out puts the original back, unless someone
else replaced the attribute meanwhile (then theirs stays, with a warning).
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any


class SharedPatch:
    def __init__(self, owner: Any, name: str, replacement: Any, on_install: Callable[[], None] | None = None,
                 on_release: Callable[[], None] | None = None) -> None:
        self.owner, self.name, self.replacement = owner, name, replacement
        self.on_install = on_install  # run when the first holder installs
        self.on_release = on_release  # run when the last holder lets go
        self.installs = 0
        self.original: Any = None  # the attribute as it was, while installed
        self._lock = threading.Lock()

    def installed(self) -> bool:
        return vars(self.owner).get(self.name) is self.replacement

    def install(self) -> Callable[[], None]:
        with self._lock:
            if self.installs == 0:
                self.original = vars(self.owner)[self.name]
                setattr(self.owner, self.name, self.replacement)
                if self.on_install is not None:
                    self.on_install()
            self.installs += 1
        done = False

        def undo() -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
                self.installs -= 1
                if self.installs:
                    return
                if self.installed():
                    setattr(self.owner, self.name, self.original)
                else:
                    warnings.warn(f"triton_ctx_tune: {getattr(self.owner, '__name__', self.owner)}.{self.name} was "
                                  "replaced by someone else while patched; leaving their version in place.",
                                  RuntimeWarning, stacklevel=2)
                self.original = None
                if self.on_release is not None:
                    self.on_release()

        return undo
