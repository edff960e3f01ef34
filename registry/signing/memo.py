"""Signature checks that passed: this process's memo, and the ones written down in the cache.

Every key is content-addressed (the bundle's sha256, the subjects' and the trusted files'), so a
hit is the same check with the same answer: a pull of a signed version pays for its signature
once per process, and once per machine for a check by a trusted key (``cache.SIGNATURE_MEMOS``,
trusted as the cache's blob memos are). A certificate chain's answer depends on the day it is
asked, so :mod:`oms` writes down only key checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

Check = tuple[str, str, tuple[str, ...]]  # (bundle sha256, subjects sha256, trusted sha256s)
# Checks held in memory; all are dropped when it is full.
MAX_HELD = 256
_HELD: dict[Check, str] = {}


def held(check: Check) -> str | None:
    """The signer of ``check`` if it passed in this process."""
    return _HELD.get(check)


def hold(check: Check, signer: str) -> None:
    if len(_HELD) >= MAX_HELD:
        _HELD.clear()
    _HELD[check] = signer


def forget() -> None:
    """Empty this process's memo, as a new process starts with (the cache's stay)."""
    _HELD.clear()


def file_of(folder: Path, check: Check) -> Path:
    """Where ``check`` is written down under ``folder``."""
    return folder / hashlib.sha256(json.dumps(check).encode()).hexdigest()


def recall(path: Path, signer: str) -> bool:
    """Whether the check written at ``path`` passed for ``signer`` (the caller still asks that
    the signer is trusted now)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(signer) + 1) == signer.encode("ascii", "replace")
    except OSError:
        return False


def write(path: Path, signer: str) -> None:
    with contextlib.suppress(OSError):  # a memo only saves checking again
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".memo-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(signer.encode("ascii", "replace"))
        os.replace(tmp, path)
