"""The content-addressed local cache, and the memo of files already verified.

Layout under the cache directory (as huggingface_hub's ``blobs/``)::

    blobs/sha256/<hex>     read-only, verified copies of remote blobs
    locks/sha256/<hex>.lock  the blob's lock (``fcntl.flock``; see "One download per blob"),
                           kept out of blobs/ so that blobs/ only ever holds verified bytes
    tmp/                   downloads in progress; renamed into blobs/ only after verification
    verified/<hex>-<id>    memo: (size, mtime, ctime, inode) of a file whose hash matched
    signatures/<hex>       memo: the signer of a signature check by a trusted key that passed
                           (named by the bundle's, subjects' and trusted keys' digests)

A file is loaded only after its sha256 matched, either now or when the memo was written for the
same size, mtime, ctime and inode. Any change to the file (even one that restores the mtime
changes the ctime) makes it be hashed again.

One download per blob, however many processes share the cache: a blob's lock file is locked
exclusively (``flock``) by the one process that downloads and verifies it; the others wait on
it, then open the verified file. The kernel releases the lock of a process that dies, so a
waiter whose downloader was killed takes the lock and downloads itself: only a file that was
verified is ever renamed into ``blobs/``, so a partial download is never seen. A reader holds
the lock shared for as long as its verified file stays open (``BlobCache.open``), and
``registry cache prune`` removes only blobs whose lock it takes exclusively without waiting:
a blob in use by a pull is never removed under it (registry/caching/cachedir.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import DigestMismatchError
from ..io.digests import hexdigest, sha256_file
from ..trust import boundedjson

# Where signing.oms.recall finds the signature checks that passed (see the layout above).
SIGNATURE_MEMOS = "signatures"
# Memos held in memory per VerifiedFiles; all are dropped when it is full.
MAX_HELD = 1024
# How often an open file that changed while it was hashed (a touch, a rename over it) is hashed
# again before it is refused; only a hash during which it did not change is believed.
HASH_ATTEMPTS = 3
# A blob's lock file is its path with this suffix (never a digest: those are hex only).
LOCK_SUFFIX = ".lock"
# Looks for a blob in the cache, each after waiting for its lock, before a pull gives up: the
# first may find another process fetching it, a later one a file pruned in the instant the lock
# was free.
OPEN_ATTEMPTS = 4


def _identity(path: Path, fd: int | None = None) -> list[int]:
    return _of(path.stat() if fd is None else os.fstat(fd))


def identity_of(fh: BinaryIO) -> list[int]:
    """The identity a memo records for the open file ``fh``."""
    return _of(os.fstat(fh.fileno()))


def _of(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def open_blob_file(path: Path, size: int | None, *, what: str,
                   file_class: type[io.FileIO] = io.FileIO) -> BinaryIO:
    """``path`` opened for reading, refused (:class:`DigestMismatchError`) unless it is a
    regular file of ``size`` bytes: a link to ``/dev/zero`` would be hashed forever, a FIFO
    would block the open, a folder fail with a raw ``IsADirectoryError``. The checks are made
    on the open file (``O_NONBLOCK``: a FIFO's open returns at once), before a byte is read."""
    try:
        fh = file_class(path, "rb",  # returned to the caller
                        opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK | os.O_CLOEXEC))
    except IsADirectoryError:
        raise DigestMismatchError(f"{what} {path} is a folder, not a file; it was not loaded. "
                                  "Remove it and push the same weights again") from None
    try:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DigestMismatchError(
                f"{what} {path} is not a regular file (a device, FIFO or socket); it was not "
                "read. Remove it and push the same weights again")
        if size is not None and st.st_size != size:
            raise DigestMismatchError(
                f"{what} {path} holds {st.st_size} bytes where its manifest lists {size}; it "
                "was not loaded. Push the same weights again to repair it, or restore the file")
    except BaseException:
        fh.close()
        raise
    return fh


class VerifiedFiles:
    """Remembers which files were hashed and matched, so a hot pull does not rehash them.

    A memo this process has read or written is also held in memory with the memo file's own
    identity: a hot pull then checks it with two ``stat`` calls (the file and its memo) instead
    of resolving the path, reading and parsing the memo (0.2 ms of a small pull). A memo file
    removed or rewritten (another process found the file corrupt) is read again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._held: dict[tuple[str, str], tuple[Path, list[int], list[int]]] = {}

    def _memo(self, path: Path, digest: str) -> Path:
        tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
        return self.root / f"{hexdigest(digest)}-{tag}"

    def is_verified(self, path: Path, digest: str, *, fd: int | None = None) -> bool:
        """Whether ``path`` (or the file open as ``fd``, which was opened from ``path``) is the
        file that was hashed to ``digest``, unchanged since."""
        held = self._held.get((str(path), digest))
        if held is not None:
            memo, memo_identity, identity = held
            try:
                if _identity(memo) == memo_identity and _identity(path, fd) == identity:
                    return True
            except OSError:
                pass
        memo = self._memo(path, digest)
        try:
            memo_identity = _identity(memo)
            identity = boundedjson.loads(memo.read_text())
            if identity != _identity(path, fd):
                return False
        except (OSError, ValueError):
            return False
        self._hold(path, digest, memo, memo_identity, identity)
        return True

    def _hold(self, path: Path, digest: str, memo: Path, memo_identity: list[int],
              identity: list[int]) -> None:
        if len(self._held) >= MAX_HELD:
            self._held.clear()
        self._held[(str(path), digest)] = (memo, memo_identity, identity)

    def remember(self, path: Path, digest: str, identity: list[int] | None = None) -> None:
        """Record that ``path`` hashed to ``digest``: with ``identity``, the one of the open
        file that was hashed (a file put at ``path`` since then does not match it)."""
        memo = self._memo(path, digest)
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=memo.parent, prefix=".memo-")
            identity = _identity(path) if identity is None else identity
            with os.fdopen(fd, "w") as fh:
                json.dump(identity, fh)
            os.replace(tmp, memo)
            self._hold(path, digest, memo, _identity(memo), identity)
        except OSError:
            pass  # a memo is an optimisation: without it the file is simply hashed again

    def reuse(self, path: Path, digest: str, size: int, touch: Callable[[], None]) -> bool:
        """Whether ``path`` holds intact bytes of ``digest`` (of ``size``), calling ``touch``
        (which changes the file's times) if it does. The memo then records the times as the
        verified open file sees them (else the next pull hashes it again): a file put at
        ``path`` meanwhile is another file, which the memo does not vouch for."""
        try:
            fh = self.open(path, digest, what="stored blob", size=size)
        except DigestMismatchError:
            return False
        with fh:
            touch()
            self.remember(path, digest, identity_of(fh))
        return True

    def forget(self, path: Path, digest: str) -> None:
        self._held.pop((str(path), digest), None)
        self._memo(path, digest).unlink(missing_ok=True)

    def verify(self, path: Path, digest: str, *, what: str, size: int | None = None) -> None:
        """Raise DigestMismatchError unless ``path`` hashes to ``digest`` (memo first)."""
        self.open(path, digest, what=what, size=size).close()

    def open(self, path: Path, digest: str, *, what: str, size: int | None = None,
             file_class: type[io.FileIO] = io.FileIO) -> BinaryIO:
        """``path`` opened for reading (at offset 0), its bytes those of ``digest``: checked by
        the memo against this open file's identity, else hashed through it. The caller maps or
        reads the file it gets, so the bytes it loads are the bytes that were checked, even if
        ``path`` is replaced meanwhile. Type and size are checked first (:func:`open_blob_file`);
        a file that changed while it was hashed is hashed again, and refused if it keeps
        changing."""
        fh = open_blob_file(path, size, what=what, file_class=file_class)
        try:
            fd = fh.fileno()
            if self.is_verified(path, digest, fd=fd):
                return fh
            for _attempt in range(HASH_ATTEMPTS):
                before = _identity(path, fd)
                actual = sha256_file(fh)
                after = _identity(path, fd)
                if after == before:
                    break
                fh.seek(0)  # touched (gc's grace) or replaced meanwhile: hash this file again
            if actual != digest or after != before:
                self.forget(path, digest)
                changed = " (it kept changing while it was hashed)" if after != before else ""
                raise DigestMismatchError(
                    f"{what} {path} is corrupt: its sha256 is {actual}, expected {digest}"
                    f"{changed}; it was not loaded. Push the same weights again to repair it, "
                    "or restore the file")
            self.remember(path, digest, before)
            fh.seek(0)
        except BaseException:
            fh.close()
            raise
        return fh


class HeldFile(io.FileIO):
    """A verified cache file, open, that holds its blob's lock shared until it is closed: while
    a pull reads or maps it, ``registry cache prune`` leaves the blob alone."""

    lock_fd: int | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.lock_fd is not None:
                fd, self.lock_fd = self.lock_fd, None
                os.close(fd)  # the last descriptor of the lock file: the lock is released


class BlobCache:
    """Verified local copies of blobs fetched from a remote store, one download per blob however
    many threads and processes ask (see the module's docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.verified = VerifiedFiles(root / "verified")

    def path(self, digest: str) -> Path:
        # The digest may come from a server's answer: it becomes a path only once it is checked.
        return self.root / "blobs" / "sha256" / hexdigest(digest)

    def lock_path(self, digest: str) -> Path:
        """The blob's lock file (under ``locks/``, the same name as the blob's with
        :data:`LOCK_SUFFIX`)."""
        return self.root / "locks" / "sha256" / f"{hexdigest(digest)}{LOCK_SUFFIX}"

    def holds_verified(self) -> bool:
        """Whether any blob here has a verification memo (none: nothing here to compare)."""
        try:
            return any(self.verified.root.iterdir())
        except OSError:
            return False

    def tmp_dir(self) -> Path:
        path = self.root / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def get(self, digest: str, download: Callable[[Path], str | None],
            size: int | None = None) -> Path:
        """A verified local path for ``digest``, calling ``download(tmp_path)`` only if needed.

        ``download`` returns the sha256 of what it wrote when it hashed while writing; if it
        returns None the file is hashed here.
        """
        self.open(digest, download, size).close()
        return self.path(digest)

    def holds(self, digest: str, size: int | None = None) -> bool:
        """Whether the cache holds verified bytes of ``digest`` now (hashed if no memo vouches
        for them); nothing is downloaded."""
        target = self.path(digest)
        if not os.path.lexists(target):
            return False
        with self.locked(digest, exclusive=False):
            try:
                self.verified.open(target, digest, what="cached blob", size=size).close()
            except (DigestMismatchError, FileNotFoundError):
                return False
        return True

    def open(self, digest: str, download: Callable[[Path], str | None],
             size: int | None = None) -> BinaryIO:
        """:meth:`get`, returning the verified file open (see :meth:`VerifiedFiles.open`),
        holding the blob's lock shared until it is closed. While another process downloads the
        blob this waits for it (sharing the lock with every other waiter, so all of them read
        the blob as soon as it is there), then opens what it verified; if that process dies,
        this one downloads."""
        target = self.path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = self._lock(digest, fcntl.LOCK_SH)  # waits while a download or a prune holds it
        try:
            for attempt in range(OPEN_ATTEMPTS):
                fh = self._open_held(target, digest, size, lock)
                if fh is not None:
                    return fh
                # Not here, or corrupt: take the lock alone, then fetch. A process holding it
                # is most likely fetching the blob: wait for that sharing the lock (a failed
                # LOCK_NB conversion holds nothing), then look again. Blocked on LOCK_EX, the
                # waiters would wake one at a time.
                if attempt == 0 and not _locked_alone(lock):
                    fcntl.flock(lock, fcntl.LOCK_SH)
                    continue
                fcntl.flock(lock, fcntl.LOCK_EX)
                # Another waiter may have fetched it by the time this one has the lock alone.
                if not self._verified_here(target, digest, size):
                    self._download(digest, target, download)
                # Share the lock again to read (every waiter wakes now); the file is opened
                # and checked again under it, since the lock was free for an instant.
                fcntl.flock(lock, fcntl.LOCK_SH)
            raise DigestMismatchError(f"cached blob {target} vanished right after it was "
                                      "verified; pull again")
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(lock)
            raise

    def _verified_here(self, target: Path, digest: str, size: int | None) -> bool:
        """Whether ``target`` holds verified bytes of ``digest``; a corrupt file is removed
        (the caller holds the blob's lock alone)."""
        if not os.path.lexists(target):
            return False
        try:
            self.verified.open(target, digest, what="cached blob", size=size).close()
        except FileNotFoundError:
            return False
        except DigestMismatchError:
            _remove(target)  # a corrupt cache entry is discarded and fetched again
            return False
        return True

    def _open_held(self, target: Path, digest: str, size: int | None, lock: int
                   ) -> BinaryIO | None:
        """The verified file at ``target`` holding ``lock`` once open, or None when there is no
        such file, or a corrupt one (left for a process holding the lock alone to remove)."""
        if not os.path.lexists(target):
            return None
        try:
            fh = self.verified.open(target, digest, what="cached blob", size=size,
                                    file_class=HeldFile)
        except (FileNotFoundError, DigestMismatchError):
            return None
        assert isinstance(fh, HeldFile)
        fh.lock_fd = lock
        with contextlib.suppress(OSError):
            os.utime(lock)  # the blob's last use, for ``registry cache prune --older-than``
        return fh

    def _download(self, digest: str, target: Path, download: Callable[[Path], str | None]
                  ) -> None:
        fd, name = tempfile.mkstemp(dir=self.tmp_dir(), prefix=f"{hexdigest(digest)[:16]}-")
        os.close(fd)
        tmp = Path(name)
        try:
            actual = download(tmp) or sha256_file(tmp)
            if actual != digest:
                raise DigestMismatchError(
                    f"downloaded blob {digest} hashes to {actual}: the store copy is corrupt or "
                    "changed in transit; it was discarded and not loaded"
                )
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        self.verified.remember(target, digest)

    @contextlib.contextmanager
    def locked(self, digest: str, *, exclusive: bool) -> Iterator[None]:
        """The blob's lock held (waiting for it) inside the ``with``."""
        lock = self._lock(digest, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            os.close(lock)

    def try_remove(self, digest: str) -> int | None:
        """Remove the blob, its memos and its lock file if no process uses it (its lock taken
        alone without waiting); the bytes freed, or None when it is busy (a pull reads it, or
        it is being downloaded)."""
        try:
            lock = self._lock(digest, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            target = self.path(digest)
            try:
                freed = target.lstat().st_size
            except FileNotFoundError:
                freed = 0
            self.verified.forget(target, digest)
            _remove(target)
            # Unlinked while held: a process waiting on this lock file sees it is no longer the
            # one at the path, and locks the new one (:meth:`_lock`).
            self.lock_path(digest).unlink(missing_ok=True)
            return freed
        finally:
            os.close(lock)

    def _lock(self, digest: str, operation: int) -> int:
        """A descriptor of the blob's lock file, locked with ``operation``; the file locked is
        the one at the path now (one removed meanwhile by a prune is let go and the new one
        taken). Raises BlockingIOError for a ``LOCK_NB`` lock that is held."""
        path = self.lock_path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, operation)
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)


def _locked_alone(fd: int) -> bool:
    """Whether the lock on ``fd`` became exclusive without waiting (if not, none is held)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            return
        with contextlib.suppress(OSError):  # a link's target is not ours to change
            if not path.is_symlink():
                os.chmod(path, 0o644)
        path.unlink()
