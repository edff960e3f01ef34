"""Signature checks that passed: this process's memo, and the ones written down in the cache.

Every key is content-addressed (the bundle's sha256, the subjects' and the trusted files'), so a
hit is the same check with the same answer: a pull of a signed version pays for its signature
once per process, and once per machine for a check by a trusted key (``cache.SIGNATURE_MEMOS``),
each memo bound by an HMAC under a secret of the memo folder (made once, 0600), so a memo planted
by whoever can write the cache but not read that secret is not believed. A certificate chain's
answer depends on the day it is asked, so :mod:`oms` writes down only key checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
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


SECRET_NAME = ".secret"  # in the memo folder: 32 random bytes, mode 0600, this user's
SECRET_BYTES = 32


def _mac(secret: bytes, path: Path, signer: str) -> bytes:
    return hmac.new(secret, f"{path.name}\0{signer}".encode("ascii", "replace"),
                    hashlib.sha256).hexdigest().encode()


def _secret(folder: Path, *, create: bool) -> bytes | None:
    """The memo folder's secret: made once (0600, exclusively) when ``create``; None when it
    is missing, or readable or writable by anyone but this user (then it binds nothing)."""
    path = folder / SECRET_NAME
    if create:
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(SECRET_BYTES))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.getuid():
            return None
        secret = fh.read(SECRET_BYTES + 1)
    return secret if len(secret) == SECRET_BYTES else None


def recall(path: Path, signer: str) -> bool:
    """Whether the check written at ``path`` passed for ``signer`` (the caller still asks that
    the signer is trusted now): the memo must carry the HMAC of its name and signer under the
    folder's secret, so a memo planted by someone who can write the cache but not read that
    secret is not believed."""
    secret = _secret(path.parent, create=False)
    if secret is None:
        return False
    try:
        with open(path, "rb") as fh:
            found = fh.read(len(signer) + 2 + 64 + 1)
    except OSError:
        return False
    expected = signer.encode("ascii", "replace") + b"\n" + _mac(secret, path, signer)
    return hmac.compare_digest(found, expected)


def write(path: Path, signer: str) -> None:
    with contextlib.suppress(OSError):  # a memo only saves checking again
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = _secret(path.parent, create=True)
        if secret is None:
            return  # a secret we cannot trust: nothing is written down
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".memo-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(signer.encode("ascii", "replace") + b"\n" + _mac(secret, path, signer))
        os.replace(tmp, path)
