"""Proof that a caller limited to some models (server/auth.py) has a blob's bytes.

A blob is stored once, by digest, whichever models own it. A push by a token limited to some
models that lists a blob the store holds only for models it may not see is asked to upload it
like an absent one (server/routes/pushes.py), through this server, which hashes the bytes
before anything is kept. An upload by such a caller of a blob that a version of a model it may
not see lists leaves ``proved/sha256/<hex>`` (store/layout.py) naming the models whose pushes in
progress it may see; the commit of such a push needs the marker for each blob that no live
version of a model the caller may see owns and one it may not see lists, then removes it, and
without it answers as for a blob never uploaded. A blob new to the store (uploaded straight to
S3 by presigned URL, too) needs no marker. So knowing a digest is not enough to make
another model's blob one's own, and read it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable

from registry.errors import NotFoundError
from registry.store import ObjectStore
from registry.store.layout import proved_key
from registry.trust import boundedjson

# A marker names the models of the pushes in progress that list the blob (a handful): it is
# read only within this bound.
MAX_MODELS = 100
MAX_MARKER_BYTES = 64 * 1024


def record(store: ObjectStore, digest: str, models: Iterable[str]) -> None:
    """Bytes hashing to ``digest`` were just received for pushes of ``models``."""
    names = sorted(models)[:MAX_MODELS]
    store.put_bytes(proved_key(digest), json.dumps({"models": names}).encode())


def proved(store: ObjectStore, digest: str, name: str) -> bool:
    """Whether ``digest`` was uploaded for a push of model ``name`` since the marker was last
    used."""
    key = proved_key(digest)
    size = store.has(key)
    if size is None or size > MAX_MARKER_BYTES:
        return False
    try:
        models = boundedjson.loads(store.get_bytes(key))["models"]
    except (NotFoundError, ValueError, TypeError, KeyError):
        return False
    return isinstance(models, list) and name in models


def clear(store: ObjectStore, digest: str) -> None:
    with contextlib.suppress(NotFoundError):
        store.delete(proved_key(digest))
