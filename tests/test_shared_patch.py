"""runtime/shared_patch.py: holders share one patch, the last one out restores, undo is idempotent, and a
replacement someone else made meanwhile is left in place with a warning."""
from __future__ import annotations

import types

import pytest

from triton_ctx_tune.runtime.shared_patch import SharedPatch


def _original() -> str:
    return "original"


def _replacement() -> str:
    return "patched"


def test_holders_share_one_patch_and_the_last_one_out_restores():
    owner = types.SimpleNamespace(fn=_original)
    installed, released = [], []
    patch = SharedPatch(owner, "fn", _replacement, on_install=lambda: installed.append(True),
                        on_release=lambda: released.append(True))
    first, second = patch.install(), patch.install()
    assert owner.fn() == "patched" and patch.installs == 2 and patch.original is _original and installed == [True]
    first()
    first()  # idempotent: the second holder still holds
    assert owner.fn() == "patched" and patch.installs == 1 and released == []
    second()
    assert owner.fn is _original and patch.installs == 0 and patch.original is None and released == [True]


def test_a_replacement_made_meanwhile_stays_with_a_warning():
    owner = types.SimpleNamespace(fn=_original)
    patch = SharedPatch(owner, "fn", _replacement)
    undo = patch.install()
    owner.fn = lambda: "theirs"
    with pytest.warns(RuntimeWarning, match="replaced by someone else while patched"):
        undo()
    assert owner.fn() == "theirs" and patch.installs == 0
