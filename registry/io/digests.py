"""sha256 digests: the one place that computes, checks and combines them.

A digest is ``"sha256:"`` followed by 64 lowercase hex digits. Every digest that arrives from
outside the process (a manifest, a store listing, a server's answer, a request) passes
:func:`check_digest` before it becomes a path, a store key or a SQL value.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Sequence
from typing import Any, BinaryIO

from ..errors import RefError

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


def sha256_file(path: str | os.PathLike[str] | BinaryIO) -> str:
    """``"sha256:<hex>"`` of a file's bytes; of an open file's, from where it stands."""
    sha = hashlib.sha256()
    opened: Any = (contextlib.nullcontext(path) if hasattr(path, "readinto")
                   else open(path, "rb", buffering=0))  # type: ignore[arg-type]  # noqa: SIM115
    with opened as fh:
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
# the 256 KiB pieces s3transfer hands over left a cached 202 MB shard with none (its warm pull
# 16.1 ms against 9.8 ms in 2 MiB folios here).
BLOCK = 8 * 1024 * 1024
# writev takes at most this many pieces (EINVAL beyond): a block of many small pieces (a shard
# of thousands of small tensors, a request body read in small chunks) is joined before that.
try:
    IOV_MAX = os.sysconf("SC_IOV_MAX")
except (AttributeError, OSError, ValueError):
    IOV_MAX = -1
if IOV_MAX < 2:  # -1: the system names no limit; 1024 is POSIX's and Linux's
    IOV_MAX = 1024


class HashingWriter:
    """A write-only, non-seekable file that hashes everything written through it, and writes it
    on in whole :data:`BLOCK`-sized pieces at aligned offsets; :meth:`close` writes the rest.

    Nothing is copied to make the blocks: pieces are gathered and written with one ``writev``.
    A ``bytes`` piece is held as it is (it cannot change); any other buffer is copied where a
    part of it must wait for the next block, since its owner may reuse it. (An 8 MiB buffer per
    writer cost 4 ms a 17 MiB shard in fresh pages, a tenth of a cold S3 pull of 6 shards.)

    ``gather=n`` (a stream of about ``n`` bytes in small pieces, an HTTP body's 64 KiB reads)
    copies the pieces into one buffer of up to a block instead: 128 pieces held until their
    block is written are freed together, and glibc's malloc gives such a stretch back to the
    kernel and faults it in again for the next block (page faults were most of an 806 MB
    download's time: system 1.0-1.8 s against 0.4 s gathered).

    Non-seekable on purpose: s3transfer then hands over downloaded parts in order, so the hash
    runs alongside the download instead of in a second pass. Use it as a context manager (or
    call :meth:`close`): until then up to a block of what was written is held here.
    """

    def __init__(self, fh: Any, *, gather: int = 0) -> None:
        self._fh = fh
        self._sha = hashlib.sha256()
        self._held: list[memoryview] = []
        self._held_bytes = 0
        self._block = BLOCK - (fh.tell() % BLOCK if fh.seekable() else 0)  # the first ends early
        self._buffer = memoryview(bytearray(min(gather, BLOCK))) if gather > 0 else None
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
        if self._buffer is not None:
            self._gather(view, self._buffer)
            self.written += taken
            return taken
        stable = isinstance(data, bytes)
        while view:
            if self._held_bytes + len(view) < self._block:
                if len(self._held) >= IOV_MAX - 1:  # room for one more piece in the writev
                    self._held = [memoryview(b"".join(self._held))]
                self._held.append(view if stable else memoryview(bytes(view)))
                self._held_bytes += len(view)
                break
            take = self._block - self._held_bytes
            if not self._held:  # whole blocks straight from the caller's memory
                take += (len(view) - take) // BLOCK * BLOCK
            self._write_all([*self._held, view[:take]])
            self._held.clear()
            self._held_bytes = 0
            self._block = BLOCK
            view = view[take:]
        self.written += taken
        return taken

    def _gather(self, view: memoryview, buffer: memoryview) -> None:
        while view:
            n = min(len(view), self._block - self._held_bytes, len(buffer) - self._held_bytes)
            buffer[self._held_bytes:self._held_bytes + n] = view[:n]
            self._held_bytes += n
            view = view[n:]
            if self._held_bytes in (self._block, len(buffer)):
                self._write_all([buffer[:self._held_bytes]])
                self._held_bytes = 0
                self._block = BLOCK

    def close(self) -> None:
        """Write what is held (the last, partial block)."""
        if self._buffer is not None and self._held_bytes:
            self._write_all([self._buffer[:self._held_bytes]])
            self._held_bytes = 0
        if self._held:
            self._write_all(self._held)
            self._held.clear()
            self._held_bytes = 0

    def _write_all(self, views: list[memoryview]) -> None:
        if hasattr(self._fh, "flush"):
            self._fh.flush()  # a buffered file's own bytes go first
        fd = self._fh.fileno()
        first = 0
        while first < len(views):  # writev may take less than it was given
            done = os.writev(fd, views[first:])
            while first < len(views) and done >= len(views[first]):
                done -= len(views[first])
                first += 1
            if done:
                views[first] = views[first][done:]

    def seekable(self) -> bool:
        return False

    def digest(self) -> str:
        """The sha256 of every byte written; only once they are all in the file."""
        if self._held_bytes:
            raise RuntimeError("HashingWriter.digest() before close(): "
                               f"{self._held_bytes} bytes are not in the file yet")
        return f"sha256:{self._sha.hexdigest()}"
