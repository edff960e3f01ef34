"""A small fake OCI registry on loopback, for answers the real one never gives: a layer whose
bytes are not its digest, 100 GB declared, an index or an image, a `../` file path, a redirect
to a host that is not loopback, a 500 halfway, a Bearer token dance.

It serves manifests and blobs from dicts, accepts chunked uploads (POST, PATCH, GET status,
PUT ?digest=) and records every request, so a test can say what was (not) asked for.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# A body is bytes, or an iterator of pieces sent as they come (no Content-Length, the end marked
# by closing the connection): a body that never ends, or trickles.
Answer = tuple[int, dict[str, str], "bytes | Iterator[bytes]"]
BLOB_TYPE = "application/octet-stream"


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@dataclass
class FakeOci:
    manifests: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # path -> body, type
    blobs: dict[str, bytes] = field(default_factory=dict)  # digest -> bytes served
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    # (method, path prefix) -> answer, tried before the default behaviour
    overrides: dict[tuple[str, str], Callable[[], Answer | None]] = field(default_factory=dict)
    token: str | None = None  # when set, every /v2/ request needs "Bearer <token>"
    # False: blobs are sent without Content-Length, their end marked by closing the connection
    blob_length: bool = True
    uploads: dict[str, bytearray] = field(default_factory=dict)
    streamed: int = 0  # bytes of iterator bodies the client took before it hung up
    server: Any = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def ref(self, path: str) -> str:
        return f"oci://{self.host}/{path}"

    def add_artifact(self, repo: str, tag: str, layers: list[dict[str, Any]],
                     config: bytes = b"{}", **extra: Any) -> bytes:
        self.blobs[sha(config)] = config
        body = json.dumps({"schemaVersion": 2,
                           "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "artifactType": "application/vnd.cncf.model.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.cncf.model.config.v1+json",
                                      "digest": sha(config), "size": len(config)},
                           "layers": layers, **extra}).encode()
        self.manifests[f"/v2/{repo}/manifests/{tag}"] = (
            body, "application/vnd.oci.image.manifest.v1+json")
        return body

    def start(self) -> FakeOci:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def _answer(self, status: int, headers: dict[str, str],
                        body: bytes | Iterator[bytes]) -> None:
                if not isinstance(body, bytes):
                    return self._stream(status, headers, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if fake.blob_length or headers.get("Content-Type") != BLOB_TYPE:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _stream(self, status: int, headers: dict[str, str],
                        pieces: Iterator[bytes]) -> None:
                self.close_connection = True
                self.send_response(status)
                for k, v in {**headers, "Connection": "close"}.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    for piece in pieces:
                        self.wfile.write(piece)
                        self.wfile.flush()
                        fake.streamed += len(piece)
                except OSError:
                    pass  # the client hung up: what it took is counted

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                data = self.rfile.read(length) if length else b""
                fake.requests.append((self.command, self.path, dict(self.headers)))
                for (method, prefix), make in fake.overrides.items():
                    if method == self.command and self.path.startswith(prefix):
                        answer = make()
                        if answer is not None:
                            return self._answer(*answer)
                path = urllib.parse.urlsplit(self.path).path
                if fake.token is not None and path.startswith("/v2/") and \
                        self.headers.get("authorization") != f"Bearer {fake.token}":
                    challenge = (f'Bearer realm="http://{fake.host}/token",service="fake",'
                                 f'scope="repository:{path.split("/")[2]}:pull"')
                    return self._answer(401, {"WWW-Authenticate": challenge}, b"")
                self._answer(*fake.default(self.command, self.path, data))

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def default(self, method: str, raw: str, data: bytes) -> Answer:
        parts = urllib.parse.urlsplit(raw)
        path, query = parts.path, urllib.parse.parse_qs(parts.query)
        if path == "/token":
            return 200, {}, json.dumps({"token": "issued-token"}).encode()
        if path in self.manifests and method in ("GET", "HEAD"):
            body, kind = self.manifests[path]
            return 200, {"Content-Type": kind}, body
        if method == "PUT" and "/manifests/" in path:
            self.manifests[path] = (data, "application/vnd.oci.image.manifest.v1+json")
            return 201, {}, b""
        if "/blobs/uploads/" in path:
            uid = path.rsplit("/", 1)[-1]
            if method == "POST":
                self.uploads[str(len(self.uploads))] = bytearray()
                return 202, {"Location": f"{path}{len(self.uploads) - 1}"}, b""
            if method == "PATCH":
                self.uploads[uid] += data
                return 202, {"Location": path, "Range": f"0-{len(self.uploads[uid]) - 1}"}, b""
            if method == "GET":
                return 204, {"Range": f"0-{len(self.uploads[uid]) - 1}"}, b""
            if method == "PUT":
                body = bytes(self.uploads.pop(uid)) + data
                if sha(body) != query["digest"][0]:
                    return 400, {}, b'{"errors":[{"code":"DIGEST_INVALID","message":"x"}]}'
                self.blobs[sha(body)] = body
                return 201, {}, b""
        if "/blobs/" in path:
            digest = path.rsplit("/", 1)[-1]
            if digest in self.blobs:
                return 200, {"Content-Type": BLOB_TYPE}, self.blobs[digest]
        return 404, {}, b'{"errors":[{"code":"NOT_FOUND","message":"unknown"}]}'

    def asked(self, method: str, fragment: str) -> list[str]:
        return [p for m, p, _ in self.requests if m == method and fragment in p]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
