"""The Hub door's routes under ``/hf``: the read API of the Hugging Face Hub that
``huggingface_hub`` calls when ``HF_ENDPOINT=http://HOST:PORT/hf`` (registry/doors/hf.py holds
the logic; this module translates HTTP).

    GET       /hf/api/models/{repo}[/revision/{rev}]       model_info, repo_info
    GET       /hf/api/models/{repo}/tree/{rev}[/{path}]    list_repo_tree, list_repo_files
    GET/HEAD  /hf/{repo}/resolve/{rev}/{file}              hf_hub_download (one Range)

Every route applies the caller's model scope through the one check (``Principal.may_see``): a
model the token may not see is a missing repository, answered exactly as one.
What the door lacks answers 404 with the Hub's ``X-Error-Code`` (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``), which the client raises as its own error classes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from registry.doors.hf import HubDoor, HubFile, HubRevision
from registry.errors import HubNotFoundError

from ..auth import Principal
from ..boundary import error_response
from ..dependencies import Hub, read
from .blobs import OpenFileResponse, byte_range

router = APIRouter(prefix="/hf", tags=["hub"])

Revision = Annotated[str, Query(max_length=300)]


def _not_found(exc: HubNotFoundError) -> JSONResponse:
    message = str(exc)
    # A header carries ASCII only: a hostile name in the message is escaped there.
    shown = message[:300].encode("ascii", "backslashreplace").decode()
    headers = {"X-Error-Code": exc.hub_code, "X-Error-Message": shown.replace("\r", " ")
               .replace("\n", " ")}
    if exc.commit is not None:
        headers["X-Repo-Commit"] = exc.commit
    return error_response(404, exc.code, message, headers)


@router.get("/api/models/{repo}")
@router.get("/api/models/{repo}/revision/{revision}")
def model_info(repo: str, door: Hub, revision: str | None = None,
               caller: Principal = read) -> Any:
    """What ``HfApi.model_info`` / ``repo_info`` read: the commit and the files."""
    try:
        return door.model_info(door.revision(repo, revision, may_see=caller.may_see))
    except HubNotFoundError as exc:
        return _not_found(exc)


@router.get("/api/models/{repo}/tree/{revision}")
@router.get("/api/models/{repo}/tree/{revision}/{path:path}")
def tree(repo: str, revision: str, door: Hub, path: str = "",
         recursive: Annotated[bool, Query()] = False,
         expand: Annotated[bool, Query()] = False, caller: Principal = read) -> Any:
    """What ``HfApi.list_repo_tree`` reads: one page holding every entry."""
    del expand  # no last-commit or security facts to add
    try:
        return door.tree(door.revision(repo, revision, may_see=caller.may_see), path,
                         recursive=recursive)
    except HubNotFoundError as exc:
        return _not_found(exc)


@router.api_route("/{repo}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
async def resolve(repo: str, revision: str, path: str, request: Request, door: Hub,
                  caller: Principal = read) -> Response:
    """A file of a revision, with the headers ``hf_hub_download`` needs."""
    try:
        rev = await run_in_threadpool(
            lambda: door.revision(repo, revision, may_see=caller.may_see))
        f = rev.file(path)
    except HubNotFoundError as exc:
        return _not_found(exc)
    headers = _file_headers(rev, f)
    if request.method == "HEAD":
        return Response(status_code=200, headers={**headers, "Content-Length": str(f.size)},
                        media_type="application/octet-stream")
    return await run_in_threadpool(_send, door, rev, f, request.headers.get("range"), headers)


def _file_headers(rev: HubRevision, f: HubFile) -> dict[str, str]:
    etag = f'"{f.sha256}"'
    return {"X-Repo-Commit": rev.commit, "ETag": etag, "X-Linked-Etag": etag,
            "X-Linked-Size": str(f.size), "Accept-Ranges": "bytes"}


def _send(door: HubDoor, rev: HubRevision, f: HubFile, range_header: str | None,
          headers: dict[str, str]) -> Response:
    opened = door.open(rev, f)
    if not isinstance(opened, bytes):
        return OpenFileResponse(opened, f.size, range_header=range_header, headers=headers)
    size = len(opened)
    span = byte_range(range_header, size)
    if span is None:
        return Response(opened, headers=headers, media_type="application/octet-stream")
    start, end = span
    if start >= size:
        return Response(b"", status_code=416, media_type="application/octet-stream",
                        headers={**headers, "Content-Range": f"bytes */{size}"})
    return Response(opened[start:end], status_code=206, media_type="application/octet-stream",
                    headers={**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"})
