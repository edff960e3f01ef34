"""Object stores: where blobs and manifests live, addressed by store-relative keys.

Keys look like ``blobs/sha256/<hex>`` and ``manifests/<name>/v3.json``; a store never sees refs.
Every store implements :class:`ObjectStore`. Abilities only some stores have are declared as
their own small protocols (as mlflow's artifact repositories declare theirs as mixins) and
checked with ``isinstance``, never probed with ``getattr``:

- :class:`Staging`: a local directory where a push can write so that storing is a rename (file).
- :class:`Presigning`: time-limited URLs so clients move bytes without the server (S3).
- :class:`BucketAdmin`: creating the bucket the store lives in (S3).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..errors import SettingsError

if TYPE_CHECKING:
    from ..settings import Settings

Progress = Callable[[int], None]


@runtime_checkable
class ObjectStore(Protocol):
    """What the registry needs from a place that keeps bytes."""

    url: str

    def has(self, key: str) -> int | None:
        """Size of the object at ``key``, or None if there is none."""

    def put_file(self, key: str, path: Path, *, move: bool = False) -> None:
        """Store the file at ``path`` under ``key`` atomically (``move`` may consume it)."""

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store small ``data`` under ``key`` atomically, replacing what was there."""

    def get_bytes(self, key: str) -> bytes:
        """The whole object; raises NotFoundError if it is missing."""

    def get_to_file(self, key: str, path: Path, *, progress: Progress | None = None) -> str:
        """Download the object into ``path`` (a temporary file the caller owns); return the
        ``sha256:<hex>`` of the bytes written, computed as they were written."""

    def open_local(self, key: str) -> Path | None:
        """A local path to read the object in place, for stores on this filesystem."""

    def delete(self, key: str) -> None:
        """Remove the object; missing objects are fine."""

    def list(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix``."""

    def modified(self, key: str) -> datetime | None:
        """When the object was last written or touched (aware UTC), or None if there is none."""

    def touch(self, key: str) -> None:
        """Make the object count as just written, so gc's grace starts again for it (a push
        that reuses a stored blob does this); a missing object is left missing."""

    def uri(self, key: str) -> str:
        """A URI naming the object (for humans and for MLflow's ``source``)."""


@runtime_checkable
class Staging(Protocol):
    """A store on this filesystem: files written under ``staging_dir`` are stored by rename."""

    @property
    def staging_dir(self) -> Path: ...


@runtime_checkable
class Presigning(Protocol):
    """A store that can hand out URLs for one object, so bytes bypass the server (which then
    verifies what arrived: ``registry/direct_uploads.py``, keyed by the object's ETag)."""

    def presign(self, key: str, method: str, *, expires_s: int = ...) -> str: ...

    def etag(self, key: str) -> str | None: ...


@runtime_checkable
class BucketAdmin(Protocol):
    """A store that lives in a bucket it can create (``registry store init``)."""

    def create_bucket(self) -> bool: ...


def open_store(url: str, settings: Settings | None = None) -> ObjectStore:
    """The store a URL names: ``file:///path`` or ``s3://bucket/prefix``."""
    if url.startswith("file://"):
        from .file import FileStore

        return FileStore(Path(_file_path(url)))
    if url.startswith("s3://"):
        from .s3 import S3Store

        if settings is None:
            return S3Store.from_url(url)
        return S3Store.from_url(url, endpoint_url=settings.s3_endpoint_url,
                                max_attempts=settings.s3_max_attempts,
                                part_size=settings.s3_part_size,
                                concurrency=settings.s3_concurrency,
                                retry_seconds=settings.store_retry.total_seconds())
    raise SettingsError(f"store URL {url!r} is not supported; use file:///path or s3://bucket/prefix")


def _file_path(url: str) -> str:
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise SettingsError(f"store URL {url!r} names host {parsed.netloc!r}; use file:///abs/path")
    path = unquote(parsed.path)
    if not os.path.isabs(path):
        raise SettingsError(f"store URL {url!r} must hold an absolute path (file:///abs/path)")
    return path
