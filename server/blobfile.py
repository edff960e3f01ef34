"""A blob served from the very file that was verified (``LocalBackend.open_blob``), never from
its path opened again: a file put at the blob's path after the check is not what a client gets.

:class:`OpenFileResponse` sends an open file (at offset 0) of a known size: GET and HEAD, and one
byte range (``Range: bytes=a-b``, ``bytes=a-``, ``bytes=-n``) answered 206 as a client resuming a
download asks; several ranges, or a header it cannot read, get the whole file (a server may
ignore a Range), and a range past the end 416. The file is closed when the answer ends.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import BinaryIO

import anyio
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

_CHUNK = 1 << 20
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


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
    """Send the open file ``fh`` of ``size`` bytes (see the module docstring)."""

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
