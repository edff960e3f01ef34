"""The server's HTTP boundary: request bodies are bounded before a route reads them, and every
JSON answer (errors included) is encoded so that no stored value can make it fail.

- :class:`BodyLimit` refuses a request body over its route's bound with 413 and a short message,
  reading at most the bound into memory. The blob upload routes are left alone: they stream to
  disk, a push's blob bounded by the size its push reserved, an export's by MAX_BLOB_BYTES.
- :class:`AsciiJSONResponse` escapes non-ASCII, so a lone surrogate in a tag or a manifest (valid
  in JSON, invalid in UTF-8) cannot turn every later read into a 500.
- :class:`Body` is the base of every JSON request body: strict types, no unknown fields.
- :func:`error_response` sends ``{"error": {"code", "message"}}`` with the message cut to
  :data:`MAX_MESSAGE` characters: an error names the bad value, never echoes a body whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from registry.http.wire import API, error_body

# A commit carries a manifest (16 MiB holds ~150,000 tensors); every other JSON body is small.
MAX_COMMIT_BODY = 16 * 2**20
MAX_BODY = 2**20
# Past this much, a refused body is not read to the end: the connection is simply closed.
_DRAIN = 64 * 2**20
MAX_MESSAGE = 1000

_COMMIT_PATH = re.compile(rf"{re.escape(API)}/models/[^/]+/pushes/[^/]+/commit")
_BLOB_PATH = re.compile(rf"{re.escape(API)}(?:/models/[^/]+/versions/[^/]+/exports)?/blobs/[^/]+")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Body(BaseModel):
    """A JSON request body, read strictly: JSON true is not version 1 and "3" is not the
    integer 3; unknown fields are refused rather than ignored."""

    model_config = ConfigDict(strict=True, extra="forbid")


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped (and NaN written as JSON readers take it)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=True,
                          separators=(",", ":")).encode("ascii")


def error_response(status: int, code: str, message: str,
                   headers: Mapping[str, str] | None = None) -> AsciiJSONResponse:
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}… (cut from {len(message)} characters)"
    return AsciiJSONResponse(error_body(code, message), status_code=status,
                             headers=dict(headers) if headers else None)


def body_limit(method: str, path: str) -> int | None:
    """The most bytes a request body may hold on this route (None: the route bounds it)."""
    if method == "PUT" and _BLOB_PATH.fullmatch(path):
        return None
    return MAX_COMMIT_BODY if method == "POST" and _COMMIT_PATH.fullmatch(path) else MAX_BODY


class BodyLimit:
    """ASGI middleware: a body over its route's limit gets 413 before the route sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = body_limit(scope.get("method", ""), scope.get("path", "")) \
            if scope["type"] == "http" else None
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or len(declared) > 18):
            await _refuse(send, 400, "invalid Content-Length header")
            return
        if declared is not None and int(declared) > _DRAIN:
            await _refuse(send, 413, _too_large(limit, int(declared)))
            return
        body = bytearray()
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen <= limit:
                body += chunk
            elif seen > _DRAIN:
                break
            if not message.get("more_body", False):
                break
        if seen > limit:
            # Read to the end (up to _DRAIN) first, so the client reads the 413 rather than a
            # connection reset in the middle of its upload.
            await _refuse(send, 413, _too_large(limit, seen))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _too_large(limit: int, size: int) -> str:
    return (f"request body of {size} bytes exceeds the {limit} bytes this route accepts; "
            "send less (tags, aliases and manifests have bounded sizes)")


async def _refuse(send: Send, status: int, message: str) -> None:
    response = error_response(status, "request_too_large" if status == 413
                              else "invalid_request", message)
    await send({"type": "http.response.start", "status": status,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})
