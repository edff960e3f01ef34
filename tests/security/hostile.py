"""A hostile registry server: a real HTTP server on loopback that answers whatever a test tells
it to, so the client's checks of server answers run against real HTTP."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


class HostileServer:
    """``answer(method, path, body)`` sets what a route returns; every request is recorded."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], tuple[int, bytes, str]] = {}
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                parts = urlsplit(self.path)
                outer.requests.append((self.command, self.path))
                route = outer.routes.get((self.command, parts.path)) or outer.routes.get(
                    (self.command, "*"))
                status, body, ctype = route or (404, json.dumps({"error": {
                    "code": "not_found", "message": "no such route"}}).encode(),
                    "application/json")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

            def log_message(self, *_args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, body: Any, *, status: int = 200,
               raw: bool = False, content_type: str = "application/json") -> None:
        data = body if raw else json.dumps(body).encode()
        self.routes[(method, path)] = (status, data, content_type)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
