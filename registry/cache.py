"""The content-addressed local cache, and the memo of files already verified.

Layout under the cache directory (as huggingface_hub's ``blobs/``)::

    blobs/sha256/<hex>     read-only, verified copies of remote blobs
    tmp/                   downloads in progress; renamed into blobs/ only after verification
    verified/<hex>-<id>    memo: (size, mtime, ctime, inode) of a file whose hash matched

A file is loaded only after its sha256 matched, either now or when the memo was written for the
same size, mtime, ctime and inode. Any change to the file (even one that restores the mtime
changes the ctime) makes it be hashed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .digests import hexdigest, sha256_file
from .errors import DigestMismatchError

# Memos held in memory per VerifiedFiles; all are dropped when it is full.
MAX_HELD = 1024


def _identity(path: Path, fd: int | None = None) -> list[int]:
    st = path.stat() if fd is None else os.fstat(fd)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


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
            identity = json.loads(memo.read_text())
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

    def remember(self, path: Path, digest: str) -> None:
        memo = self._memo(path, digest)
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=memo.parent, prefix=".memo-")
            identity = _identity(path)
            with os.fdopen(fd, "w") as fh:
                json.dump(identity, fh)
            os.replace(tmp, memo)
            self._hold(path, digest, memo, _identity(memo), identity)
        except OSError:
            pass  # a memo is an optimisation: without it the file is simply hashed again

    def forget(self, path: Path, digest: str) -> None:
        self._held.pop((str(path), digest), None)
        self._memo(path, digest).unlink(missing_ok=True)

    def verify(self, path: Path, digest: str, *, what: str) -> None:
        """Raise DigestMismatchError unless ``path`` hashes to ``digest`` (memo first)."""
        if self.is_verified(path, digest):
            return
        actual = sha256_file(path)
        if actual != digest:
            self.forget(path, digest)
            raise DigestMismatchError(
                f"{what} {path} is corrupt: its sha256 is {actual}, expected {digest}; it was "
                "not loaded. Push the same weights again to repair it, or restore the file"
            )
        self.remember(path, digest)


class BlobCache:
    """Verified local copies of blobs fetched from a remote store."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.verified = VerifiedFiles(root / "verified")

    def path(self, digest: str) -> Path:
        # The digest may come from a server's answer: it becomes a path only once it is checked.
        return self.root / "blobs" / "sha256" / hexdigest(digest)

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

    def get(self, digest: str, download: Callable[[Path], str | None]) -> Path:
        """A verified local path for ``digest``, calling ``download(tmp_path)`` only if needed.

        ``download`` returns the sha256 of what it wrote when it hashed while writing; if it
        returns None the file is hashed here.
        """
        target = self.path(digest)
        if target.exists():
            try:
                self.verified.verify(target, digest, what="cached blob")
                return target
            except DigestMismatchError:
                _remove(target)  # a corrupt cache entry is discarded and fetched again
        target.parent.mkdir(parents=True, exist_ok=True)
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
        return target


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, 0o644)
        path.unlink()
