"""What a store is: the :class:`ObjectStore` protocol every store implements, and the small
protocols of abilities only some stores have (checked with ``isinstance``, never ``getattr``).
``registry.store`` re-exports them all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

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

    def get_to_file(self, key: str, path: Path, *, progress: Progress | None = None,
                    size: int | None = None) -> str:
        """Download the object into ``path`` (a temporary file the caller owns); return the
        ``sha256:<hex>`` of the bytes written, computed as they were written. With ``size``,
        an object of another size is refused before it is read (registry/store/sizes.py)."""

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
