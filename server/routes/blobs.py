"""Blob routes: the upload of a push's blob (streamed, hashed, placed only if it matches), and
links and downloads of stored blobs (a presigned URL where the store gives one, else the very
file that was verified: :class:`OpenFileResponse`).

A blob is named by its digest, not by a model, so a caller whose token is limited to some
models (server/auth.py) gets a blob only if a model it may see owns it (a file or an export of
a live version; for an upload, a file of a push in progress): any other answers exactly as a
blob the store lacks. Knowing a digest is not enough to read another team's weights.

:func:`upload_target` and :func:`receive_blob` are shared with the push and export routes.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import anyio
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.types import Receive, Scope, Send

from registry.backends import LocalBackend
from registry.errors import DigestMismatchError, NotFoundError, UnexpectedUploadError
from registry.files import VersionFile
from registry.http.wire import API
from registry.io.digests import HashingWriter, check_digest

from .. import proofs
from ..auth import Principal
from ..dependencies import Backend, read, write

router = APIRouter(prefix=API)


@router.put("/blobs/{digest}", tags=["blobs"], status_code=201, openapi_extra={
    "requestBody": {"required": True,
                    "content": {"application/octet-stream": {"schema": {
                        "type": "string", "format": "binary"}}}}})
async def upload_blob(digest: str, request: Request, local: Backend,
                      caller: Principal = write) -> dict[str, Any]:
    digest = check_digest(digest)
    if not caller.restricted:
        limit = await run_in_threadpool(local.expect_upload, digest)
        return await receive_blob(local, digest, request, limit)
    pushes = await run_in_threadpool(lambda: local.catalog.blob_owners([digest],
                                                                        state="pending"))
    mine = caller.visible(sorted(pushes[digest]))
    if not mine:
        raise unexpected_upload(digest)
    limit = await run_in_threadpool(local.expect_upload, digest)
    received = await receive_blob(local, digest, request, limit)
    listed = await run_in_threadpool(lambda: local.catalog.blob_owners([digest], state="any"))
    if len(caller.visible(listed[digest])) < len(listed[digest]):
        # Bytes models it may not see list too: the proof its pushes' commits need
        # (server/proofs.py).
        await run_in_threadpool(proofs.record, local.store, digest, mine)
    return received


@router.get("/blobs/{digest}/link", tags=["blobs"])
def blob_link(digest: str, local: Backend, caller: Principal = read) -> dict[str, Any]:
    digest = check_digest(digest)
    if not owned_by_visible(local, caller, digest):
        raise blob_not_found(digest)
    size = local.stored_size(digest)
    url = local.blob_url(digest, "GET")
    if url is not None:
        return {"url": url, "direct": True, "size": size}
    return {"url": f"{API}/blobs/{digest}", "direct": False, "size": size}


@router.api_route("/blobs/{digest}", methods=["GET", "HEAD"], tags=["blobs"],
                  response_class=FileResponse)
def download_blob(digest: str, request: Request, local: Backend,
                  caller: Principal = read) -> Response:
    digest = check_digest(digest)
    if not owned_by_visible(local, caller, digest):
        raise blob_not_found(digest)
    size = local.stored_size(digest)
    url = local.blob_url(digest, "GET")
    if url is not None:
        return RedirectResponse(url, status_code=307)
    # open_blob verifies the bytes (memoized) on the open file that is then served.
    return OpenFileResponse(local.open_blob(digest, size), size,
                            range_header=request.headers.get("range"),
                            headers={"Cache-Control": "public, max-age=31536000, immutable"})


def owned_by_visible(local: LocalBackend, caller: Principal, digest: str) -> bool:
    """Whether a live version of a model ``caller`` may see owns blob ``digest`` (always, for a
    token over every model: no query then)."""
    if not caller.restricted:
        return True
    return bool(caller.visible(sorted(local.catalog.blob_owners([digest])[digest])))


# The answers of LocalBackend.stored_size / expect_upload for a blob the store lacks or no push
# lists, word for word (tests/security/test_model_scopes.py compares them): a blob of a model
# the caller may not see gets these.
def blob_not_found(digest: str) -> NotFoundError:
    return NotFoundError(f"blob {digest} not found in the store")


def unexpected_upload(digest: str) -> UnexpectedUploadError:
    return UnexpectedUploadError(
        f"no push in progress lists blob {digest}: begin the push first (POST "
        "/api/v1/models/NAME/pushes) and upload only the files it asks for")


def upload_target(local: LocalBackend, f: VersionFile) -> dict[str, Any]:
    """Where and how the client uploads ``f``: a presigned URL, else this server's /blobs."""
    headers = {"Content-Type": "application/octet-stream"}
    url = local.blob_url(f.digest, "PUT")
    if url is not None:
        return {"digest": f.digest, "size": f.size, "url": url, "method": "PUT",
                "direct": True, "headers": headers}
    return {"digest": f.digest, "size": f.size, "url": f"{API}/blobs/{f.digest}",
            "method": "PUT", "direct": False, "headers": headers}


def proof_target(f: VersionFile) -> dict[str, Any]:
    """An upload through this server of a blob the store already holds: the bytes are hashed
    before anything is placed (never a presigned URL, which would overwrite the stored object
    unchecked), and the stored blob is kept."""
    return {"digest": f.digest, "size": f.size, "url": f"{API}/blobs/{f.digest}",
            "method": "PUT", "direct": False, "headers": {"Content-Type":
                                                          "application/octet-stream"}}


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


# -- a blob served from the very file that was verified ---------------------------------------
# ``LocalBackend.open_blob`` checks the bytes on the file it returns; that open file is what is
# sent, never its path opened again, so a file put at the blob's path after the check is not
# what a client gets. One byte range (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) is answered 206
# as a client resuming a download asks; several, or a header it cannot read, get the whole
# file (a server may ignore a Range), and a range past the end 416.

_CHUNK = 1 << 20
# At most 19 digits each (no file is larger): int() of a 5000-digit number raises ValueError.
_RANGE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The ``[start, end)`` a Range header asks of ``size`` bytes; None for the whole file;
    ``(size, size)`` for a range that starts past the end (416)."""
    found = _RANGE.fullmatch(header.strip()) if header else None
    if found is None or found.group(1) == found.group(2) == "":
        return None
    first, last = found.groups()
    if first == "":  # the last n bytes
        return max(size - int(last), 0), size
    start = int(first)
    end = size if last == "" else min(int(last) + 1, size)
    if start >= size:
        return size, size
    return (start, end) if start < end else None


class OpenFileResponse(Response):
    """Send the open file ``fh`` (at offset 0) of ``size`` bytes; it is closed at the end."""

    def __init__(self, fh: BinaryIO, size: int, *, range_header: str | None,
                 headers: Mapping[str, str] | None = None,
                 media_type: str = "application/octet-stream") -> None:
        self.fh = fh
        span = byte_range(range_header, size)
        self.start, self.end = span or (0, size)
        status = 200 if span is None else 416 if self.start >= size else 206
        super().__init__(status_code=status, headers=headers, media_type=media_type)
        self.headers["accept-ranges"] = "bytes"
        if status == 416:
            self.start = self.end = 0
            self.headers["content-range"] = f"bytes */{size}"
        elif status == 206:
            self.headers["content-range"] = f"bytes {self.start}-{self.end - 1}/{size}"
        self.headers["content-length"] = str(self.end - self.start)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            position, fd = self.start, self.fh.fileno()
            while scope.get("method") != "HEAD" and position < self.end:
                chunk = await anyio.to_thread.run_sync(
                    os.pread, fd, min(_CHUNK, self.end - position), position)
                if not chunk:  # cannot happen to a verified blob; never hang on it
                    break
                position += len(chunk)
                await send({"type": "http.response.body", "body": chunk,
                            "more_body": position < self.end})
            if scope.get("method") == "HEAD" or position < self.end or self.start == self.end:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.fh.close()
