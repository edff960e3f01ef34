"""One S3 object into a file by ranged GETs, hashed in order as its bytes land (the S3 store's
download; boto3 is never imported here: the caller hands in the GET).

An object of ``size`` bytes is asked for in parts of ``part_size``: one GET on the calling thread
when it fits in one part, else ranged GETs on up to ``concurrency`` threads of its own, which
take the parts in order of their offsets and write each byte where it belongs (``os.pwrite``).
Writes are whole :data:`BLOCK`-sized pieces at aligned offsets, so the page cache holds the
file in 2 MiB folios, which a mapped pull maps with one fault each (digests.py says why). The
blocks come from a free list the downloads of a process share (:data:`KEPT_BLOCKS` of them
kept), so their pages are not faulted in again for every part.

sha256 runs in order beside the download, on the calling thread, never on a socket's: the
part the hashed prefix ends in lends each block it writes to it (no copy; the part reads on
into a second buffer meanwhile), and bytes that land beyond that prefix (later parts, done
earlier) are read back from the page cache once every byte before them is hashed. What is
hashed is what was written. A single part is hashed on the calling thread as it is read.
No byte outside ``[0, size)`` is asked for, and an answer longer or shorter than
its range is refused. A part whose stream breaks is asked again from where it stopped, up to
:data:`PART_ATTEMPTS` times; the first failure stops the other parts, and nothing returns while
a part still writes the file.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import DigestMismatchError
from .base import Progress
from .retry import Unreachable

# Writes are whole blocks at aligned offsets (but a part's ends): 2 MiB is the smallest piece
# that still leaves a file in 2 MiB folios (8 MiB writes leave the same, and cost 4x the buffer).
BLOCK = 2 * 2**20
# Blocks kept between downloads (32 MiB), so a download's buffers are ones whose pages are
# already there: a new 2 MiB buffer is a fresh mapping whose 512 pages fault in as it is
# zeroed, which cost a 101 MB pull of six shards ~21,000 page faults (boto3's own download of
# the same objects makes ~25,000 in all).
KEPT_BLOCKS = 16
# Tries of one part when its stream breaks (s3transfer's num_download_attempts is 5).
PART_ATTEMPTS = 5

# ``get(start, end)`` asks for ``Range: bytes=start-end`` (inclusive) and answers (the length
# the answer announces, its body: a stream with ``readinto`` and ``close``).
Get = Callable[[int, int], tuple[int, Any]]


class _Blocks:
    """A free list of :data:`BLOCK`-sized buffers shared by every download of the process."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.free: list[memoryview] = []
        self.lock = threading.Lock()

    def take(self) -> memoryview:
        with self.lock:
            if self.free:
                return self.free.pop()
        return memoryview(bytearray(BLOCK))

    def give(self, block: memoryview) -> None:
        """``block`` back, once nothing reads or writes it any more."""
        with self.lock:
            if len(self.free) < self.keep:
                self.free.append(block)


_BLOCKS = _Blocks(KEPT_BLOCKS)


class Stopped(Exception):
    """Another part failed: this one stops where it is (never escapes :func:`download`)."""


class _Parts:
    """The parts of one object, handed out in order to the threads that fetch them; the bytes
    each has written so far; and the blocks lent to the calling thread, which hashes the
    object's bytes in order."""

    def __init__(self, size: int, part_size: int) -> None:
        self.size = size
        self.parts = [(at, min(part_size, size - at)) for at in range(0, size, part_size)]
        self.written = [0] * len(self.parts)
        self.next = 0  # the next part to hand out
        self.first = 0  # the first part not wholly written: the written prefix ends in it
        self.failed: BaseException | None = None
        self.cond = threading.Condition()
        self.sha = hashlib.sha256()
        self.hashed = 0  # bytes hashed, from the start
        self.queued = 0  # the end of the bytes hashed or lent to be, from the start
        self.lent: deque[memoryview] = deque()
        # Buffers of parts that ended with their last block still lent, by that block's end:
        # back to the free list once it is hashed.
        self.orphans: dict[int, memoryview] = {}

    def take(self) -> int | None:
        with self.cond:
            if self.failed is not None or self.next == len(self.parts):
                return None
            self.next += 1
            return self.next - 1

    def wrote(self, index: int, at: int, block: memoryview, done: int) -> bool:
        """Part ``index`` wrote ``block`` at ``at`` (``done`` bytes of it written now). True
        when the block was lent to the calling thread to hash, being next in order: its buffer
        is not written again until :meth:`returned`."""
        with self.cond:
            self.written[index] = done
            lent = at == self.queued
            if lent:
                self.lent.append(block)
                self.queued += len(block)
            grew = index == self.first
            while self.first < len(self.parts) and \
                    self.written[self.first] == self.parts[self.first][1]:
                self.first += 1
            if lent or grew:
                self.cond.notify_all()
            return lent

    def returned(self, end: int) -> None:
        """Wait until the bytes before ``end`` are hashed (a lent block is free again)."""
        with self.cond:
            while self.hashed < end:
                if self.failed is not None:
                    raise Stopped()
                self.cond.wait()

    def release(self, buffer: memoryview, end: int) -> None:
        """A part is done with ``buffer``: back to the free list now, or once the bytes before
        ``end`` are hashed when a block of it is still lent."""
        with self.cond:
            if self.hashed < end:
                self.orphans[end] = buffer
                return
        _BLOCKS.give(buffer)

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = exc
            self.cond.notify_all()

    def hash_all(self, fd: int, what: str) -> None:
        """On the calling thread, until every byte is hashed, in order: each lent block, and
        each stretch written past those (later parts, done first) read back from the page
        cache once every byte before it is written. Raises the first failure of a part."""
        view: memoryview | None = None
        while True:
            with self.cond:
                while True:
                    if self.failed is not None:
                        raise self.failed
                    if self.hashed == self.size:
                        if view is not None:
                            _BLOCKS.give(view)
                        return
                    block = self.lent.popleft() if self.lent else None
                    prefix = self.size if self.first == len(self.parts) else \
                        self.parts[self.first][0] + self.written[self.first]
                    if block is not None or prefix > self.queued:
                        break
                    self.cond.wait()
                start = self.queued
                if block is None:  # nothing lent: read back what is written
                    self.queued = prefix
            if block is not None:
                self.sha.update(block)
                n = len(block)
            else:
                view = view or _BLOCKS.take()
                n = prefix - start
                self._read_back(fd, view, start, prefix, what)
            with self.cond:
                self.hashed += n
                self.cond.notify_all()
                orphan = self.orphans.pop(self.hashed, None)
            if orphan is not None:
                _BLOCKS.give(orphan)

    def _read_back(self, fd: int, view: memoryview, start: int, end: int, what: str) -> None:
        while start < end:
            n = os.preadv(fd, [view[:min(len(view), end - start)]], start)
            if n <= 0:
                raise DigestMismatchError(f"{what}: a downloaded part vanished from its file "
                                          "before it was hashed; it was discarded")
            self.sha.update(view[:n])
            start += n


def download(fd: int, size: int, get: Get, *, part_size: int, concurrency: int,
             retryable: tuple[type[BaseException], ...], what: str,
             progress: Progress | None = None) -> str:
    """Write the object's ``size`` bytes into ``fd`` (an empty file open for reading and
    writing) and return their ``"sha256:<hex>"``. ``retryable``: the errors of a broken stream,
    after which a part is asked again from where it stopped (:class:`Unreachable` once it broke
    :data:`PART_ATTEMPTS` times); ``what`` names the object in messages."""
    fetch = _Fetch(fd, get, retryable, what, progress)
    if size <= part_size:
        sha = hashlib.sha256()
        fetch(0, size, sha=sha)
        return f"sha256:{sha.hexdigest()}"
    parts = _Parts(size, part_size)

    def work() -> None:
        try:
            while (index := parts.take()) is not None:
                at, length = parts.parts[index]
                fetch(at, length, parts=parts, index=index)
        except Stopped:
            pass
        except BaseException as exc:  # handed to the calling thread, which raises it
            parts.fail(exc)

    threads = [threading.Thread(target=work, name="registry-s3-part", daemon=True)
               for _ in range(min(concurrency, len(parts.parts)))]
    for thread in threads:
        thread.start()
    try:
        parts.hash_all(fd, what)
    except BaseException:
        parts.fail(Stopped())  # the parts still running stop at their next block
        raise
    finally:
        for thread in threads:  # nothing writes to ``fd`` once this returns
            thread.join()
    return f"sha256:{parts.sha.hexdigest()}"


class _Fetch:
    """Fetches byte ranges of one object into ``fd``, in whole aligned blocks."""

    def __init__(self, fd: int, get: Get, retryable: tuple[type[BaseException], ...],
                 what: str, progress: Progress | None) -> None:
        self.fd, self.get, self.retryable = fd, get, retryable
        self.what, self.progress = what, progress

    def __call__(self, offset: int, length: int, *, sha: Any = None,
                 parts: _Parts | None = None, index: int = 0) -> None:
        """Bytes ``[offset, offset + length)`` into the file at ``offset``; hashed into ``sha``
        as read, or handed to ``parts`` as written (which hashes them when they are next)."""
        # A block lent to the calling thread to hash is not written again until it is hashed:
        # the part goes on in a second buffer meanwhile (only the part the hashed prefix ends
        # in lends its blocks, so only it has two).
        buffers = [_BLOCKS.take()]
        busy_until = [0]  # a lent buffer is free once every byte before this is hashed
        k = 0
        done = 0  # bytes of the range written
        for attempt in range(PART_ATTEMPTS):
            start, last = offset + done, offset + length - 1
            announced, body = self.get(start, last)
            try:
                if announced != last - start + 1:
                    raise DigestMismatchError(
                        f"{self.what}: the store answered {announced} bytes for bytes "
                        f"{start}-{last}; it was discarded")
                while done < length:
                    if parts is not None:
                        if parts.failed is not None:
                            raise Stopped()
                        parts.returned(busy_until[k])
                    view = buffers[k]
                    filled = self._block(body, view, offset + done, offset + length, start)
                    if sha is not None:
                        sha.update(view[:filled])
                    at, written = offset + done, 0
                    while written < filled:
                        written += os.pwrite(self.fd, view[written:filled], at + written)
                    done += filled
                    if parts is not None and parts.wrote(index, at, view[:filled], done):
                        busy_until[k] = at + filled
                        if len(buffers) == 1:
                            buffers.append(_BLOCKS.take())
                            busy_until.append(0)
                        k = (k + 1) % len(buffers)
                    if self.progress is not None:
                        self.progress(filled)
                if body.readinto(bytearray(1)):  # read to its end: the connection is kept
                    raise DigestMismatchError(f"{self.what}: the store's answer for bytes "
                                              f"{start}-{last} is longer; it was discarded")
                for block, end in zip(buffers, busy_until, strict=True):
                    if parts is None:
                        _BLOCKS.give(block)
                    else:  # a block still lent to be hashed goes back once it is
                        parts.release(block, end)
                return
            except self.retryable as exc:
                if attempt == PART_ATTEMPTS - 1:
                    raise Unreachable(
                        f"{self.what}: the download of bytes {start}-{last} broke "
                        f"{PART_ATTEMPTS} times ({type(exc).__name__}); check that the endpoint "
                        "is up and REGISTRY_S3_ENDPOINT_URL is right") from None
            finally:
                body.close()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _block(self, body: Any, view: memoryview, at: int, end: int, start: int) -> int:
        """Read the bytes from ``at`` up to the next :data:`BLOCK` boundary (or ``end``) into
        ``view``; how many."""
        want = min(end, (at // BLOCK + 1) * BLOCK) - at
        filled = 0
        while filled < want:
            n = body.readinto(view[filled:want])
            if not n:
                raise DigestMismatchError(f"{self.what}: the store's answer for bytes "
                                          f"{start}-{end - 1} ended at byte {at + filled}; it "
                                          "was discarded")
            filled += n
        return filled
