"""A store on the local filesystem: the embedded default, read in place on pull."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from ..errors import NotFoundError, RefError, StoreUnavailableError
from ..io.digests import HashingWriter
from ..io.diskerrors import typed
from .base import Progress
from .layout import BLOBS, STAGING
from .sizes import check_size


class FileStore:
    """Objects as files under one root; writes go to ``tmp/`` and are renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts) or "\\" in key:
            raise RefError(f"invalid store key {key!r}")
        return self.root.joinpath(*parts)

    @property
    def staging_dir(self) -> Path:
        """Where a push writes its file so that ``put_file(move=True)`` is a rename."""
        path = self.root / STAGING
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot write to store {self.url}: {exc.strerror}"
            ) from None
        return path

    def has(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def put_file(self, key: str, path: Path, *, move: bool = False) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        readonly = key.startswith(BLOBS)  # content-addressed bytes never change in place
        if move:
            try:
                if readonly:
                    os.chmod(path, 0o444)
                os.replace(path, target)
                return
            except OSError:
                pass  # another filesystem: fall back to a copy
        with self._temporary(target, os.stat(path).st_size) as tmp:
            shutil.copyfile(path, tmp)
            if readonly:
                os.chmod(tmp, 0o444)
        if move:
            Path(path).unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._temporary(target, len(data)) as tmp:
            tmp.write_bytes(data)

    @contextlib.contextmanager
    def _temporary(self, target: Path, needed: int) -> Iterator[Path]:
        with typed(target, needed, f"store {self.url}: writing {target.name}"):
            fd, name = tempfile.mkstemp(dir=self.staging_dir, prefix=".put-")
            os.close(fd)
            tmp = Path(name)
            try:
                yield tmp
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"object {key!r} not found in store {self.url}") from None

    def get_to_file(self, key: str, path: Path, *, progress: Progress | None = None,
                    size: int | None = None) -> str:
        source = self._path(key)
        if not source.exists():
            raise NotFoundError(f"object {key!r} not found in store {self.url}")
        check_size(size, lambda: source.stat().st_size, f"object {key!r} in store {self.url}")
        with typed(path, size, f"pull: copying {key} from store {self.url}"), \
                open(source, "rb") as src, open(path, "wb") as dst, HashingWriter(dst) as out:
            while chunk := src.read(8 * 1024 * 1024):
                out.write(chunk)
                if progress:
                    progress(len(chunk))
        return out.digest()

    def open_local(self, key: str) -> Path | None:
        path = self._path(key)
        return path if path.exists() else None

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        # Leave no empty directories behind, but never remove the root.
        parent = path.parent
        while parent != self.root and parent.is_dir():
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list(self, prefix: str) -> Iterator[str]:
        base = self.root / prefix if prefix else self.root
        if not base.exists():
            return
        for dirpath, _dirs, files in os.walk(base):
            rel_dir = Path(dirpath).relative_to(self.root)
            if rel_dir.parts[:1] == ("tmp",):
                continue
            for name in sorted(files):
                yield (rel_dir / name).as_posix()

    def modified(self, key: str) -> datetime | None:
        try:
            return datetime.fromtimestamp(self._path(key).stat().st_mtime, timezone.utc)
        except FileNotFoundError:
            return None

    def touch(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(self._path(key))

    def uri(self, key: str) -> str:
        return (self.root / key).as_uri()
