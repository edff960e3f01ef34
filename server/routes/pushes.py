"""Push routes: a push runs in two phases so nothing is visible before it is complete.

``POST /models/{name}/pushes`` reserves a number (and says where to upload each blob the store
lacks), the client uploads, then ``POST /models/{name}/pushes/{n}/commit`` sends the manifest,
which must describe exactly the reserved push (``server/commits.py``); a repeat of a commit
that went through (its answer lost) gets the same answer. ``DELETE .../pushes/{n}`` gives the
number back.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from fastapi import APIRouter, Header
from fastapi.responses import Response
from pydantic import Field

from registry import manifest as mf
from registry.backends import LocalBackend
from registry.direct_uploads import verify_blobs
from registry.errors import MissingBlobError, NotFoundError, RefError
from registry.files import (
    MAX_FILE_BYTES,
    ROLES,
    VersionFile,
    check_file_name,
    check_push_files,
)
from registry.http.wire import API, IDEMPOTENCY_HEADER, record_to_wire
from registry.io.digests import check_digest
from registry.refs import validate_aliases, validate_name, validate_tags, validate_version
from registry.trust.validate import MAX_BLOB_BYTES

from .. import proofs
from ..auth import Principal
from ..boundary import Body
from ..commits import checked_manifest, push_key, repeated_commit
from ..dependencies import Backend, Changed, Signing, write
from .blobs import proof_target, upload_target

log = logging.getLogger("registry.server")
router = APIRouter(prefix=API)


class PushFile(Body):
    role: str = Field(default="weights", description="'weights' (a safetensors shard) or "
                                                     "'file' (an attached file).")
    name: str = Field(description="The file's name within the version.")
    digest: str = Field(description="sha256:<64 hex> of the file's bytes.")
    size: int = Field(ge=0, le=MAX_BLOB_BYTES)


class PushBegin(Body):
    version: int | None = Field(default=None, description="Claim this number (None: next one).")
    files: list[PushFile] = Field(min_length=1, max_length=mf.MAX_FILES,
                                  description="Every blob the version will own.")


class PushCommit(Body):
    manifest: dict[str, Any]
    tags: dict[str, str] = Field(default_factory=dict)
    aliases: list[str] = Field(default_factory=list)
    signature: dict[str, Any] | None = Field(default=None, description="A signature of the "
                                             "version (server/signatures.py).")


@router.post("/models/{name}/pushes", tags=["push"])
def begin_push(name: str, body: PushBegin, local: Backend, caller: Principal = write,
               key: str | None = Header(None, alias=IDEMPOTENCY_HEADER)) -> dict[str, Any]:
    name = validate_name(name)
    claim = None if body.version is None else validate_version(body.version)
    files = check_push_files([_version_file(f) for f in body.files])
    done: list[Any] = []  # this push, retried after its commit (catalog/pushes.py)
    number, missing = local.begin_push(name, claim, files, key=push_key(key), committed=done)
    if done:
        return {"version": number, "uploads": [], "committed": record_to_wire(done[0])}
    uploads = [upload_target(local, f) for f in missing]
    if caller.restricted:  # blobs only models it may not see hold: it proves it has the bytes
        uploads += [proof_target(f) for f in _unproven(local, caller, files, missing)]
    log.info("push %s:v%d begun by %s (%d of %d files to upload)", name, number, caller,
             len(uploads), len(files))
    return {"version": number, "uploads": uploads}


@router.post("/models/{name}/pushes/{version}/commit", tags=["push"])
def commit_push(name: str, version: str, body: PushCommit, local: Backend, signing: Signing,
                changed: Changed, caller: Principal = write,
                key: str | None = Header(None, alias=IDEMPOTENCY_HEADER)) -> dict[str, Any]:
    name, number = validate_name(name), validate_version(version)
    tags = cast(dict[str, str], validate_tags(body.tags))
    aliases = validate_aliases(body.aliases)
    try:
        reserved = local.reservation(name, number)
    except NotFoundError:
        # A retry of a commit that went through (its answer was lost): the same answer.
        done = repeated_commit(local, name, number, body.manifest, tags, push_key(key))
        if done is None:
            raise
        return record_to_wire(done)
    manifest = checked_manifest(body.manifest, name, number, reserved, tags)
    proven = _proven(local, caller, name, number, reserved.files)
    signed = signing.admit(body.signature, manifest)  # refused before it is visible
    # Blobs uploaded straight to the store (presigned URLs) are hashed here first.
    verify_blobs(local.store, reserved.files, local.staging_dir())
    record = local.commit_push(name, number, manifest, tags, aliases,
                               force="admin" in caller.scopes)  # a protected alias: admin
    for digest in proven:
        proofs.clear(local.store, digest)
    signing.store(name, number, signed)
    log.info("push %s:v%d committed by %s", name, number, caller)
    changed()
    return record_to_wire(record)


@router.delete("/models/{name}/pushes/{version}", tags=["push"], status_code=204)
def abort_push(name: str, version: str, local: Backend, _caller: Principal = write) -> Response:
    name, number = validate_name(name), validate_version(version)
    local.reservation(name, number)  # NotFoundError when no such push is in progress
    local.abort_push(name, number)
    return Response(status_code=204)


def _unproven(local: LocalBackend, caller: Principal, files: list[VersionFile],
              missing: list[VersionFile]) -> list[VersionFile]:
    """The files of a push the store holds but no model ``caller`` may see owns: a token limited
    to some models uploads those too, so a push cannot tell it which digests other models hold
    (nor let it claim their bytes without having them)."""
    asked = {f.digest for f in missing}
    held = list({f.digest: f for f in files if f.digest not in asked}.values())
    owners = local.catalog.blob_owners([f.digest for f in held])
    return [f for f in held if not caller.visible(sorted(owners[f.digest]))]


def _proven(local: LocalBackend, caller: Principal, name: str, number: int,
            files: list[VersionFile]) -> list[str]:
    """The digests of ``files`` a limited caller had to upload (server/proofs.py): those no
    live version of a model it may see owns but a version of one it may not see lists. Each
    must have been uploaded for this model's push; else the MissingBlobError of a blob never
    uploaded."""
    if not caller.restricted:
        return []
    digests = [f.digest for f in files]
    live, listed = local.catalog.blob_owners(digests), local.catalog.blob_owners(digests,
                                                                                state="any")
    needed = [f for f in {f.digest: f for f in files}.values()
              if not caller.visible(sorted(live[f.digest]))
              and len(caller.visible(listed[f.digest])) < len(listed[f.digest])]
    for f in needed:
        if not proofs.proved(local.store, f.digest, name):
            raise MissingBlobError(
                f"{f.role} file {f.name} ({f.digest}) of {name}:v{number} is not in the store "
                f"(0 of {f.size} bytes); upload it before committing", files=[f])
    return [f.digest for f in needed]


# -- what a push request must be -------------------------------------------------------------

def _version_file(f: PushFile) -> VersionFile:
    """A file of a push request, checked before it reaches the catalog or a store key."""
    if f.role not in ROLES:
        raise RefError(f"invalid file role {f.role[:40]!r}: use one of {', '.join(ROLES)}")
    if f.role == "file" and f.size > MAX_FILE_BYTES:
        raise RefError(f"file {f.name[:120]!r} is {f.size} bytes, over the limit of "
                       f"{MAX_FILE_BYTES} bytes for a file attached to a version")
    return VersionFile(f.role, check_file_name(f.name), check_digest(f.digest),  # type: ignore[arg-type]
                       f.size)
