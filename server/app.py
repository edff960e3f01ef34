"""The registry's HTTP service: REST under /api/v1, translated to calls of the registry library.

Every name, ref, alias, version and tag is checked by ``registry.refs`` / the facade's validators
before it reaches the catalog or a store key; storage and catalog logic live in ``LocalBackend``.
The server adds only what HTTP needs: auth, two-phase pushes, blob transfer and error bodies

    {"error": {"code": "<RegistryError.code>", "message": "<str(exc)>"}}

that ``registry.remote`` turns back into the same exception class.

Pushes run in two phases so nothing is visible before it is complete:
``POST /models/{name}/pushes`` reserves a number (and says where to upload the blob if the store
lacks it), the client uploads, then ``POST /models/{name}/pushes/{n}/commit`` sends the manifest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, cast

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry import manifest as mf
from registry.backends import LocalBackend
from registry.digests import HashingWriter, check_digest
from registry.direct_uploads import verify_blobs
from registry.errors import (
    DigestMismatchError,
    NotFoundError,
    RefError,
    RegistryError,
    SettingsError,
    UnexpectedUploadError,
)
from registry.files import (
    MAX_FILE_BYTES,
    ROLES,
    VersionFile,
    check_file_name,
    check_push_files,
)
from registry.refs import (
    MAX_VERSION,
    parse,
    validate_alias,
    validate_aliases,
    validate_name,
    validate_tags,
    validate_version,
)
from registry.settings import Settings
from registry.validate import DEFAULT_PAGE, MAX_BLOB_BYTES, MAX_PAGE
from registry.versions import refuse_deleting_a_base
from registry.wire import API, record_to_wire, status_for

from .auth import AuthPolicy, Scope
from .boundary import AsciiJSONResponse, BodyLimit, error_response
from .commits import checked_manifest, repeated_commit
from .exports import add_export_routes
from .signatures import add_signature_routes

log = logging.getLogger("registry.server")

_bearer = HTTPBearer(auto_error=False, description="A token from `registry token create`.")
# -- request bodies --------------------------------------------------------------------------

class _Body(BaseModel):
    # Strict: JSON true is not version 1 and "3" is not the integer 3; unknown fields are
    # refused rather than ignored.
    model_config = ConfigDict(strict=True, extra="forbid")


class PushFile(_Body):
    role: str = Field(default="weights", description="'weights' (a safetensors shard) or "
                                                     "'file' (an attached file).")
    name: str = Field(description="The file's name within the version.")
    digest: str = Field(description="sha256:<64 hex> of the file's bytes.")
    size: int = Field(ge=0, le=MAX_BLOB_BYTES)


class PushBegin(_Body):
    version: int | None = Field(default=None, description="Claim this number (None: next one).")
    files: list[PushFile] = Field(min_length=1, max_length=mf.MAX_FILES,
                                  description="Every blob the version will own.")


class PushCommit(_Body):
    manifest: dict[str, Any]
    tags: dict[str, str] = Field(default_factory=dict)
    aliases: list[str] = Field(default_factory=list)
    signature: dict[str, Any] | None = Field(default=None, description="A signature of the "
                                             "version (server/signatures.py).")


class AliasTarget(_Body):
    version: int | str


class TagChanges(_Body):
    tags: dict[str, str | None]


PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Items per page.")]


# -- the app ---------------------------------------------------------------------------------

def create_app(settings: Settings | None = None, *, auth: AuthPolicy | None = None,
               backend: LocalBackend | None = None, mirror: Any = None) -> FastAPI:
    """The registry server over ``LocalBackend.from_settings(settings)``.

    ``auth`` defaults to the tokens in ``REGISTRY_AUTH_FILE`` if that is set, else an open
    server (``registry serve`` chooses and enforces the policy for its host). ``mirror`` is an
    object with ``poke()`` called after each change (the MLflow mirror); by default one is
    started when ``MLFLOW_TRACKING_URI`` is set.
    """
    settings = settings or Settings.from_env()
    if auth is None:
        named = settings.auth_file if settings.auth_file_named else None
        if named is not None and not named.exists():
            raise SettingsError(f"REGISTRY_AUTH_FILE {named} does not exist; create it with "
                                "`registry token create NAME --scopes admin`")
        auth = AuthPolicy.for_server("127.0.0.1", auth_file=named, allow_anonymous=False)
    policy = auth
    local = backend or LocalBackend.from_settings(settings)
    if mirror is None and settings.mlflow_tracking_uri:
        from registry.mirror_mlflow import MirrorWorker

        mirror = MirrorWorker(local, settings.mlflow_tracking_uri)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if policy.mode == "open":
            log.warning("no auth file: this server is open to anyone who can reach it "
                        "(loopback only); create tokens with `registry token create`")
        if mirror is not None:
            mirror.start()
        try:
            yield
        finally:
            if mirror is not None:
                mirror.stop()
            local.close()

    app = FastAPI(title="registry", version="1", lifespan=lifespan,
                  default_response_class=AsciiJSONResponse,
                  description="A model registry for PyTorch: push any checkpoint, pull it on "
                              "any device.")
    app.add_middleware(BodyLimit)
    app.state.backend = local
    app.state.mirror = mirror
    def need(scope: Scope) -> Any:
        def dependency(credentials: Annotated[HTTPAuthorizationCredentials | None,
                                              Depends(_bearer)]) -> str:
            header = f"Bearer {credentials.credentials}" if credentials else None
            return policy.authorize(header, scope)

        return Depends(dependency)

    read, write, admin = need("read"), need("write"), need("admin")

    def changed() -> None:
        if mirror is not None:
            mirror.poke()

    signing = add_signature_routes(app, local, settings, read, write, changed)

    @app.exception_handler(RegistryError)
    async def registry_error(_request: Request, exc: RegistryError) -> JSONResponse:
        status = status_for(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return error_response(status, exc.code, str(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p)[:60] for p in first.get("loc", ()))
        return error_response(422, "invalid_request",
                              f"invalid request at {where[:200] or 'body'}: "
                              f"{str(first.get('msg', 'malformed'))[:200]}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "invalid_request"
        return error_response(exc.status_code, code,
                              f"{str(exc.detail)[:200]}: see /docs for the API", exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return error_response(500, "internal_error", "the registry server failed; see its log")

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    # -- reads ----------------------------------------------------------------------------

    @app.get(API + "/models", tags=["models"])
    def list_models(limit: PageSize = DEFAULT_PAGE,
                    after: Annotated[str | None, Query(
                        max_length=128, description="The `next` of the previous page.")] = None,
                    _caller: str = read) -> dict[str, Any]:
        """Model names, sorted, one page at a time: pass ``next`` back as ``after``."""
        start = None if after is None else validate_name(after)
        names = local.list_models(limit=limit + 1, after=start)
        return {"models": names[:limit], "next": names[limit - 1] if len(names) > limit else None}

    @app.get(API + "/models/{name}/versions", tags=["models"])
    def list_versions(name: str, limit: PageSize = DEFAULT_PAGE,
                      after: Annotated[int | None, Query(
                          ge=0, le=MAX_VERSION,
                          description="The `next` of the previous page.")] = None,
                      _caller: str = read) -> dict[str, Any]:
        """Live versions, oldest first, one page at a time: pass ``next`` back as ``after``."""
        records = local.list_versions(validate_name(name), limit=limit + 1, after=after)
        return {"versions": [record_to_wire(r) for r in records[:limit]],
                "next": records[limit - 1].version if len(records) > limit else None}

    @app.get(API + "/models/{name}/versions/{version}", tags=["models"])
    def show_version(name: str, version: str, _caller: str = read) -> dict[str, Any]:
        ref = parse(f"{validate_name(name)}:v{validate_version(version)}")
        return record_to_wire(local.resolve(ref))

    @app.get(API + "/resolve", tags=["models"])
    def resolve(ref: Annotated[str, Query(description="name, name:vN, name@alias, "
                                                      "name@sha256:<hex>")],
                _caller: str = read) -> dict[str, Any]:
        return record_to_wire(local.resolve(parse(ref)))

    # -- push -----------------------------------------------------------------------------

    @app.post(API + "/models/{name}/pushes", tags=["push"])
    def begin_push(name: str, body: PushBegin, caller: str = write) -> dict[str, Any]:
        name = validate_name(name)
        claim = None if body.version is None else validate_version(body.version)
        files = check_push_files([_version_file(f) for f in body.files])
        number, missing = local.begin_push(name, claim, files)
        log.info("push %s:v%d begun by %s (%d of %d files to upload)", name, number, caller,
                 len(missing), len(files))
        return {"version": number, "uploads": [_upload_target(local, f) for f in missing]}

    @app.put(API + "/blobs/{digest}", tags=["blobs"], status_code=201, openapi_extra={
        "requestBody": {"required": True,
                        "content": {"application/octet-stream": {"schema": {
                            "type": "string", "format": "binary"}}}}})
    async def upload_blob(digest: str, request: Request, _caller: str = write) -> dict[str, Any]:
        digest = check_digest(digest)
        limit = await run_in_threadpool(local.expect_upload, digest)
        return await receive_blob(local, digest, request, limit)

    @app.post(API + "/models/{name}/pushes/{version}/commit", tags=["push"])
    def commit_push(name: str, version: str, body: PushCommit,
                    caller: str = write) -> dict[str, Any]:
        name, number = validate_name(name), validate_version(version)
        tags = cast(dict[str, str], validate_tags(body.tags))
        aliases = validate_aliases(body.aliases)
        try:
            reserved = local.reservation(name, number)
        except NotFoundError:
            # A retry of a commit that went through (its answer was lost): the same answer.
            done = repeated_commit(local, name, number, body.manifest, tags)
            if done is None:
                raise
            return record_to_wire(done)
        manifest = checked_manifest(body.manifest, name, number, reserved, tags)
        signed = signing.admit(body.signature, manifest)  # refused before it is visible
        # Blobs uploaded straight to the store (presigned URLs) are hashed here first.
        verify_blobs(local.store, reserved.files, local.staging_dir())
        record = local.commit_push(name, number, manifest, tags, aliases)
        signing.store(name, number, signed)
        log.info("push %s:v%d committed by %s", name, number, caller)
        changed()
        return record_to_wire(record)

    @app.delete(API + "/models/{name}/pushes/{version}", tags=["push"], status_code=204)
    def abort_push(name: str, version: str, _caller: str = write) -> Response:
        name, number = validate_name(name), validate_version(version)
        local.reservation(name, number)  # NotFoundError when no such push is in progress
        local.abort_push(name, number)
        return Response(status_code=204)

    # -- blobs ----------------------------------------------------------------------------

    @app.get(API + "/blobs/{digest}/link", tags=["blobs"])
    def blob_link(digest: str, _caller: str = read) -> dict[str, Any]:
        digest = check_digest(digest)
        size = local.stored_size(digest)
        url = local.blob_url(digest, "GET")
        if url is not None:
            return {"url": url, "direct": True, "size": size}
        return {"url": f"{API}/blobs/{digest}", "direct": False, "size": size}

    @app.api_route(API + "/blobs/{digest}", methods=["GET", "HEAD"], tags=["blobs"],
                   response_class=FileResponse)
    def download_blob(digest: str, _caller: str = read) -> Response:
        digest = check_digest(digest)
        size = local.stored_size(digest)
        url = local.blob_url(digest, "GET")
        if url is not None:
            return RedirectResponse(url, status_code=307)
        # blob_path verifies the bytes (memoized) before a single one is served.
        path = local.blob_path(digest, size)
        return FileResponse(path, media_type="application/octet-stream",
                            headers={"Cache-Control": "public, max-age=31536000, immutable"})

    # -- changes --------------------------------------------------------------------------

    @app.put(API + "/models/{name}/aliases/{alias}", tags=["aliases"])
    def set_alias(name: str, alias: str, body: AliasTarget,
                  _caller: str = write) -> dict[str, Any]:
        record = local.set_alias(validate_name(name), validate_alias(alias),
                                 validate_version(body.version))
        changed()
        return record_to_wire(record)

    @app.delete(API + "/models/{name}/aliases/{alias}", tags=["aliases"], status_code=204)
    def delete_alias(name: str, alias: str, _caller: str = write) -> Response:
        local.delete_alias(validate_name(name), validate_alias(alias))
        changed()
        return Response(status_code=204)

    @app.patch(API + "/models/{name}/versions/{version}/tags", tags=["models"])
    def set_tags(name: str, version: str, body: TagChanges,
                 _caller: str = write) -> dict[str, Any]:
        name, number = validate_name(name), validate_version(version)
        record = local.set_tags(name, number, validate_tags(body.tags, removals=True))
        changed()
        return record_to_wire(record)

    @app.delete(API + "/models/{name}/versions/{version}", tags=["models"])
    def delete_version(name: str, version: str, caller: str = write,
                       force: Annotated[bool, Query(description="Delete even if aliases or "
                                                    "adapters point at the version.")] = False,
                       ) -> dict[str, Any]:
        name, number = validate_name(name), validate_version(version)
        if not force:  # adapters over it keep their base (409, names them and `force`)
            refuse_deleting_a_base(local, name, number)
        record = local.delete_version(name, number, force=force)
        log.info("%s:v%d deleted by %s", name, number, caller)
        changed()
        return record_to_wire(record)

    @app.post(API + "/gc", tags=["admin"])
    def gc(caller: str = admin) -> dict[str, Any]:
        report = local.gc()
        log.info("gc by %s deleted %d blobs", caller, len(report.deleted))
        return {"deleted": report.deleted, "freed_bytes": report.freed_bytes,
                "kept": report.kept, "stale_pushes": report.stale_pushes,
                "young": report.young, "temporary_files": report.temporary_files,
                "temporary_bytes": report.temporary_bytes, "unknown": report.unknown}

    @app.post(API + "/mlflow/sync", tags=["admin"])
    def mlflow_sync(full: bool = False, _caller: str = admin) -> dict[str, Any]:
        from registry.mirror_mlflow import sync, tracking_uri_for

        report = sync(local, tracking_uri_for(settings), full=full)
        return report.to_dict()

    add_export_routes(app, local, read, write, changed, _upload_target, receive_blob)
    return app


# -- helpers ---------------------------------------------------------------------------------

def _version_file(f: PushFile) -> VersionFile:
    """A file of a push request, checked before it reaches the catalog or a store key."""
    if f.role not in ROLES:
        raise RefError(f"invalid file role {f.role[:40]!r}: use one of {', '.join(ROLES)}")
    if f.role == "file" and f.size > MAX_FILE_BYTES:
        raise RefError(f"file {f.name[:120]!r} is {f.size} bytes, over the limit of "
                       f"{MAX_FILE_BYTES} bytes for a file attached to a version")
    return VersionFile(f.role, check_file_name(f.name), check_digest(f.digest),  # type: ignore[arg-type]
                       f.size)


def _upload_target(local: LocalBackend, f: VersionFile) -> dict[str, Any]:
    headers = {"Content-Type": "application/octet-stream"}
    url = local.blob_url(f.digest, "PUT")
    if url is not None:
        return {"digest": f.digest, "size": f.size, "url": url, "method": "PUT",
                "direct": True, "headers": headers}
    return {"digest": f.digest, "size": f.size, "url": f"{API}/blobs/{f.digest}",
            "method": "PUT", "direct": False, "headers": headers}


async def receive_blob(local: LocalBackend, digest: str, request: Request,
                       limit: int) -> dict[str, Any]:
    """Stream the body to a staging file, hashing as it arrives; place it only if it matches.
    More than ``limit`` bytes (the size the push declared) is refused before or as they come."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise UnexpectedUploadError(f"upload of {digest} declares {declared} bytes, but its push "
                                    f"reserved {limit}; upload the file the push listed")
    fd, name = tempfile.mkstemp(dir=local.staging_dir(), prefix=".upload-")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb", buffering=0) as fh, HashingWriter(fh) as out:
            async for chunk in request.stream():
                out.write(chunk)
                if out.written > limit:
                    raise UnexpectedUploadError(f"upload of {digest} sent more than the {limit} "
                                                "bytes its push reserved; nothing was stored")
        size = out.written
        actual = out.digest()
        if actual != digest:
            raise DigestMismatchError(f"uploaded bytes hash to {actual}, not {digest}; nothing "
                                      "was stored: upload the file the digest was computed on")
        await run_in_threadpool(local.store_verified, digest, tmp)
        return {"digest": digest, "size": size}
    finally:
        tmp.unlink(missing_ok=True)
