"""Blobs that reached the store without passing through the server, verified before a commit.

A presigned PUT URL pins neither content nor checksum (and moto, used here, does not enforce an
S3 checksum on one): whoever holds a write token can begin a push of a digest it predicts and
PUT other bytes of the right size. So before the server makes a version visible, every blob of
a store that hands out presigned URLs is hashed by the server, reading it back from the store,
unless a marker ``checked/sha256/<hex>`` written by the server records that the object with its
present ETag (which changes whenever the object is written) was already hashed and matched.
A blob that fails is deleted (with its marker), never reused: the push is refused with a
:class:`DigestMismatchError` and, retried, uploads it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from .errors import DigestMismatchError, NotFoundError
from .files import VersionFile
from .io.parallel import concurrently
from .manifest import blob_key
from .store import ObjectStore, Presigning, layout
from .trust import boundedjson

CHECKED = layout.CHECKED


def checked_key(digest: str) -> str:
    return layout.checked_key(digest)


def verify_blobs(store: ObjectStore, files: Sequence[VersionFile], scratch: Path) -> None:
    """Verify each distinct blob of ``files`` in ``store`` (see the module doc); a no-op for a
    store that hands out no URLs (every byte of it passed through a hash first)."""
    if not isinstance(store, Presigning):
        return
    unique = list({f.digest: f for f in files}.values())
    concurrently(lambda f: verify_blob(store, f.digest, f.size, scratch), unique)


def verify_blob(store: ObjectStore, digest: str, size: int, scratch: Path) -> None:
    key, marker = blob_key(digest), checked_key(digest)
    etag = cast(Presigning, store).etag(key)
    if etag is None:
        return  # absent: the commit itself refuses a version whose blob is missing
    seen = {"etag": etag, "size": size}
    if store.has(marker) is not None:
        try:
            if boundedjson.loads(store.get_bytes(marker)) == seen:
                return
        except (NotFoundError, ValueError):
            pass
    fd, name = tempfile.mkstemp(dir=scratch, prefix=".check-")
    os.close(fd)
    try:  # never more than the reserved size is read: another size is refused unread
        actual: str | None = store.get_to_file(key, Path(name), size=size)
        stored = os.path.getsize(name)
    except DigestMismatchError:
        actual, stored = None, store.has(key) or 0
    finally:
        Path(name).unlink(missing_ok=True)
    if actual != digest or stored != size or cast(Presigning, store).etag(key) != etag:
        for stale in (key, marker):
            with contextlib.suppress(NotFoundError):
                store.delete(stale)
        hashing = f" hashing to {actual}" if actual else f" (its push reserved {size})"
        raise DigestMismatchError(
            f"blob {digest} in the store holds {stored} bytes{hashing}, not the bytes its "
            "digest names (an upload sent other bytes); it was deleted: retry the push")
    store.put_bytes(marker, json.dumps(seen).encode())
