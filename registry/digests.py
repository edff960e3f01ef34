"""sha256 digests: the one place that computes, checks and combines them.

A digest is ``"sha256:"`` followed by 64 lowercase hex digits. Every digest that arrives from
outside the process (a manifest, a store listing, a server's answer, a request) passes
:func:`check_digest` before it becomes a path, a store key or a SQL value.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from .errors import RefError

PATTERN = r"sha256:[0-9a-f]{64}"
_DIGEST_RE = re.compile(PATTERN)
_CHUNK = 8 * 1024 * 1024
_SHOWN = 80


def check_digest(value: object, what: str = "digest") -> str:
    """``value`` if it is a well-formed ``sha256:<hex>`` digest, else :class:`RefError`."""
    if isinstance(value, str) and _DIGEST_RE.fullmatch(value):
        return value
    shown = repr(value[:_SHOWN]) + ("…" if len(value) > _SHOWN else "") \
        if isinstance(value, str) else type(value).__name__
    raise RefError(f"invalid {what} {shown}: expected 'sha256:' followed by 64 lowercase hex "
                   "digits")


def hexdigest(digest: str) -> str:
    """The hex part of a digest, checked first (for store keys and cache file names)."""
    return check_digest(digest)[7:]


def sha256_file(path: str | os.PathLike[str]) -> str:
    """``"sha256:<hex>"`` of a file's bytes."""
    sha = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            sha.update(view[:n])
    return f"sha256:{sha.hexdigest()}"


def sha256_bytes(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def version_digest(shard_digests: Sequence[str]) -> str:
    """The digest that names a version's weights: a single shard's own digest, else the sha256
    of the canonical JSON list of its shard digests (``["sha256:…","sha256:…"]``, no spaces)."""
    checked = [check_digest(d, "shard digest") for d in shard_digests]
    if not checked:
        raise ValueError("a version has at least one weights file")
    if len(checked) == 1:
        return checked[0]
    return sha256_bytes(json.dumps(checked, separators=(",", ":")).encode())


class HashingWriter:
    """A write-only, non-seekable file that hashes everything written through it.

    Non-seekable on purpose: s3transfer then hands over downloaded parts in order, so the hash
    runs alongside the download instead of in a second pass.
    """

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self._sha = hashlib.sha256()
        self.written = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        self._sha.update(view)
        done = 0
        while done < len(view):  # an unbuffered file may take less than it was given
            done += self._fh.write(view[done:])
        self.written += done
        return done

    def seekable(self) -> bool:
        return False

    def digest(self) -> str:
        return f"sha256:{self._sha.hexdigest()}"
