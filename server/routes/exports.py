"""Export routes: a client exports and verifies an artifact, then registers it here.

``POST /models/{name}/versions/{n}/exports`` with ``{"record": {...}}`` answers
``{"export": null, "uploads": [target]}`` while the store lacks the blob (the client uploads by
presigned URL or through ``PUT .../exports/blobs/{digest}`` and posts again), then
``{"export": record, "uploads": []}`` once it is recorded. ``GET`` on the same path lists them;
blobs download like weights (``/blobs/{digest}/link``, ``/blobs/{digest}``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from registry.exports import checks, records
from registry.exports import local as exports
from registry.files import VersionFile
from registry.http.wire import API, EXPORTS_ROUTE
from registry.io.digests import check_digest
from registry.refs import validate_name, validate_version
from registry.store.layout import blob_key

from ..auth import Principal
from ..dependencies import Backend, Changed, read, write
from .blobs import owned_by_visible, proof_target, receive_blob, upload_target

PATH = API + EXPORTS_ROUTE
router = APIRouter(prefix=PATH)


class ExportRegistration(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    record: dict[str, Any]


@router.get("", tags=["exports"])
def list_exports(name: str, version: str, local: Backend,
                 _caller: Principal = read) -> dict[str, Any]:
    """The exports of a version (format, parameters, digest, size, max_abs_diff)."""
    return {"exports": exports.list_exports(local, validate_name(name),
                                            validate_version(version))}


@router.post("", tags=["exports"])
def register_export(name: str, version: str, body: ExportRegistration, local: Backend,
                    changed: Changed, caller: Principal = write) -> dict[str, Any]:
    """Record an export the client made and verified; asks for the blob first if the
    store lacks it (or, for a token limited to some models, holds it only for others)."""
    name, number = validate_name(name), validate_version(version)
    record = records.check(body.record, f"export request for {name}:v{number}")
    exports.list_exports(local, name, number)  # NotFoundError for an unknown version
    digest, size = record["digest"], record["size"]
    held = local.store.has(blob_key(digest)) == size
    if held and not owned_by_visible(local, caller, digest) \
            and not checks.proved(local.store, digest):
        # As if absent: the caller proves it has the bytes, through this server (hashed before
        # anything is kept; a presigned PUT would overwrite the stored object unchecked).
        checks.expect(local.store, digest, size)
        target = proof_target(VersionFile("export", record["format"], digest, size))
        target["url"] = PATH.format(name=name, version=number) + f"/blobs/{digest}"
        return {"export": None, "uploads": [target]}
    if not held:
        checks.expect(local.store, record["digest"], record["size"])
        file = VersionFile("export", record["format"], record["digest"], record["size"])
        target = upload_target(local, file)
        if not target["direct"]:
            # Through this server: the exports' own upload route, since /blobs takes only
            # the files of a push in progress.
            target["url"] = PATH.format(name=name, version=number) + f"/blobs/{record['digest']}"
        return {"export": None, "uploads": [target]}
    # Hash, size and format checked here; max_abs_diff stays the uploader's claim.
    record = checks.check_blob(local.store, local.verified, record, local.staging_dir())
    checks.done(local.store, record["digest"])
    kept = exports.register(local, name, number, record)
    changed()
    return {"export": kept, "uploads": []}


@router.put("/blobs/{digest}", tags=["exports"], status_code=201)
async def upload_export_blob(name: str, version: str, digest: str, request: Request,
                             local: Backend, _caller: Principal = write) -> dict[str, Any]:
    """The blob of an export of an existing version, sent through this server; only one a
    registration asked for, of at most the size it declared."""
    name, number = validate_name(name), validate_version(version)
    exports.list_exports(local, name, number)  # NotFoundError for an unknown version
    digest = check_digest(digest)
    limit = checks.expected_size(local.store, digest)
    received = await receive_blob(local, digest, request, limit)
    checks.prove(local.store, digest, received["size"])
    return received
