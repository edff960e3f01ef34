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


# Writes reach a file in whole blocks at block-aligned offsets. The kernel sizes the page cache's
# folios by the writes that fill them: 8 MiB writes leave a file in 2 MiB folios (large folios
# on ext4 since Linux 6.16, XFS, tmpfs), which a mapped pull then maps 2 MiB per page fault;
# the 256 KiB pieces s3transfer hands over, or 1 MiB ones, left an 806 MB file whose warm map
# cost 35-45 ms of faults instead of 0.5 ms here.
BLOCK = 8 * 1024 * 1024


class HashingWriter:
    """A write-only, non-seekable file that hashes everything written through it, and writes it
    on in whole :data:`BLOCK`-sized pieces at aligned offsets; :meth:`close` writes the rest.

    Non-seekable on purpose: s3transfer then hands over downloaded parts in order, so the hash
    runs alongside the download instead of in a second pass. Use it as a context manager (or
    call :meth:`close`): until then up to a block of what was written is held here.
    """

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self._sha = hashlib.sha256()
        self._held = bytearray()
        self._start = fh.tell() % BLOCK if fh.seekable() else 0  # the first block ends early
        self.written = 0  # bytes taken, held ones included

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:  # after a failure the file is thrown away: nothing to finish
            self.close()

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        taken = len(view)
        self._sha.update(view)
        if self._held or self._start:
            room = BLOCK - self._start - len(self._held)
            self._held += view[:room]
            view = view[room:]
            if len(self._held) < BLOCK - self._start:
                self.written += taken
                return taken
            self._write_all(self._held)
            self._held.clear()
            self._start = 0
        whole = len(view) - len(view) % BLOCK
        if whole:
            self._write_all(view[:whole])  # straight from the caller's memory: no copy
        self._held += view[whole:]
        self.written += taken
        return taken

    def close(self) -> None:
        """Write what is held (the last, partial block)."""
        if self._held:
            self._write_all(self._held)
            self._held.clear()

    def _write_all(self, view: bytes | bytearray | memoryview) -> None:
        view = memoryview(view)
        done = 0
        while done < len(view):  # an unbuffered file may take less than it was given
            done += self._fh.write(view[done:])

    def seekable(self) -> bool:
        return False

    def digest(self) -> str:
        """The sha256 of every byte written; only once they are all in the file."""
        if self._held:
            raise RuntimeError("HashingWriter.digest() before close(): "
                               f"{len(self._held)} bytes are not in the file yet")
        return f"sha256:{self._sha.hexdigest()}"
