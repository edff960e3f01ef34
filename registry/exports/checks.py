"""What a server checks of an export a client registers: the client ran the export and measured
``max_abs_diff``; the server cannot re-run that, but it checks what it can.

- An export blob is uploaded only for a registration that asked for it: registering an export
  whose blob the store lacks leaves ``exports-pending/sha256/<hex>`` (its declared size) in the
  store, so any replica accepts that upload, of at most that size, and nothing else.
- A server whose caller may see only some models (per-model token scopes) asks that caller to
  upload a blob the store holds for models it may not see; the upload, hashed on arrival, marks
  the pending entry ``proved``, and only then is the registration kept: an export record cannot
  claim another model's blob by its digest alone.
- The stored blob's sha256 and size are those of the record (hashed by the server, or known
  hashed: a blob that passed through it, or one whose ETag a ``checked/`` marker records), and
  it starts as its format does: a zip for TorchScript and pt2, an ONNX ``ModelProto`` (field 1,
  ``ir_version``) for ONNX.
- The record is marked as the uploader's claim (``versions["verified_by"] = "uploader"``): the
  server never calls it verified by itself.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ..caching.cache import VerifiedFiles
from ..direct_uploads import verify_blob
from ..errors import ExportError, NotFoundError, UnexpectedUploadError
from ..manifest import blob_key
from ..store import ObjectStore, layout
from ..trust import boundedjson

PENDING = layout.EXPORTS_PENDING
MAGIC = {"onnx": (b"\x08",), "torchscript": (b"PK\x03\x04",), "pt2": (b"PK\x03\x04",)}
CLAIM = {"verified_by": "uploader"}


def pending_key(digest: str) -> str:
    return layout.pending_export_key(digest)


def expect(store: ObjectStore, digest: str, size: int) -> None:
    """Accept one upload of ``digest`` of at most ``size`` bytes (a registration asked for it)."""
    store.put_bytes(pending_key(digest), json.dumps({"size": size}).encode())


def expected_size(store: ObjectStore, digest: str) -> int:
    """The size a registration declared for export blob ``digest``; else UnexpectedUploadError."""
    try:
        size = boundedjson.loads(store.get_bytes(pending_key(digest)))["size"]
    except (NotFoundError, ValueError, TypeError, KeyError):
        size = None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise UnexpectedUploadError(
            f"no export registration asked for blob {digest}: register the export first "
            "(POST .../exports) and upload only the blob it asks for")
    return size


def prove(store: ObjectStore, digest: str, size: int) -> None:
    """Record that bytes hashing to ``digest`` (``size`` of them) were just uploaded through the
    server for the registration that asked for them."""
    store.put_bytes(pending_key(digest), json.dumps({"size": size, "proved": True}).encode())


def proved(store: ObjectStore, digest: str) -> bool:
    """Whether an upload of ``digest`` was received since a registration asked for it."""
    try:
        return boundedjson.loads(store.get_bytes(pending_key(digest))).get("proved") is True
    except (NotFoundError, ValueError, TypeError, AttributeError):
        return False


def done(store: ObjectStore, digest: str) -> None:
    with contextlib.suppress(NotFoundError):
        store.delete(pending_key(digest))


def check_blob(store: ObjectStore, verified: VerifiedFiles, record: dict[str, Any],
               scratch: Path) -> dict[str, Any]:
    """``record`` marked as the uploader's claim, once its stored blob passed the checks above;
    else ExportError (a blob that fails its hash is deleted by :func:`verify_blob`)."""
    digest, size, fmt = record["digest"], record["size"], record["format"]
    key = blob_key(digest)
    local = store.open_local(key)
    if local is not None:
        with verified.open(local, digest, what="export blob", size=size) as fh:
            head = fh.read(8)
    else:
        verify_blob(store, digest, size, scratch)
        reader = getattr(store, "get_head", None)  # a ranged GET where the store has one
        head = reader(key, 8) if reader is not None else store.get_bytes(key)[:8]
    if not any(head.startswith(m) for m in MAGIC.get(fmt, ())):
        raise ExportError(f"export blob {digest} does not start as a {fmt} file does "
                          f"({head[:8]!r}); it was not registered")
    return {**record, "versions": {**record["versions"], **CLAIM}}
