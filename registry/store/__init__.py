"""Object stores: where blobs and manifests live, addressed by store-relative keys.

Keys look like ``blobs/sha256/<hex>`` and ``manifests/<name>/v3.json``; a store never sees refs.
Every key is written and parsed by :mod:`registry.store.layout`, which draws the whole tree.
Every store implements :class:`ObjectStore`. Abilities only some stores have are declared as
their own small protocols (as mlflow's artifact repositories declare theirs as mixins) and
checked with ``isinstance``, never probed with ``getattr``:

- :class:`Staging`: a local directory where a push can write so that storing is a rename (file).
- :class:`Presigning`: time-limited URLs so clients move bytes without the server (S3).
- :class:`BucketAdmin`: creating the bucket the store lives in (S3).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from ..errors import SettingsError
from .base import BucketAdmin, ObjectStore, Presigning, Progress, Staging
from .file import FileStore
from .s3 import S3Store

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["BucketAdmin", "FileStore", "ObjectStore", "Presigning", "Progress", "S3Store",
           "Staging", "open_store"]


def open_store(url: str, settings: Settings | None = None) -> ObjectStore:
    """The store a URL names: ``file:///path`` or ``s3://bucket/prefix``."""
    if url.startswith("file://"):
        return FileStore(Path(_file_path(url)))
    if url.startswith("s3://"):
        if settings is None:
            return S3Store.from_url(url)
        return S3Store.from_url(url, endpoint_url=settings.s3_endpoint_url,
                                max_attempts=settings.s3_max_attempts,
                                part_size=settings.s3_part_size,
                                concurrency=settings.s3_concurrency,
                                retry_seconds=settings.store_retry.total_seconds())
    raise SettingsError(f"store URL {url!r} is not supported; use file:///path or s3://bucket/prefix")


def _file_path(url: str) -> str:
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise SettingsError(f"store URL {url!r} names host {parsed.netloc!r}; use file:///abs/path")
    path = unquote(parsed.path)
    if not os.path.isabs(path):
        raise SettingsError(f"store URL {url!r} must hold an absolute path (file:///abs/path)")
    return path
