"""A real webhook receiver on loopback for the webhook tests: it records every POST (headers,
raw body), answers the status it is told to, and can go down and come back on its port."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from registry.webhooks import verify


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data


class Receiver:
    """``url`` takes POSTs; ``status`` is what it answers; ``down()``/``up()`` close and
    reopen its port (connections are refused meanwhile)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.status = 200
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = 0
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    status = receiver.status
                    if 200 <= status < 300:
                        receiver.received.append(Received(dict(self.headers.items()), body))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"thanks" if status < 300 else b"not now")

            def log_message(self, *_: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events(self, secret: str) -> list[dict[str, Any]]:
        """Every event received so far, each checked against ``secret``."""
        with self.lock:
            got = list(self.received)
        for r in got:
            verify(secret, r.headers, r.body)
            assert r.headers["X-Registry-Event"] == r.event["kind"]
            assert r.headers["X-Registry-Delivery"] == r.event["delivery_id"]
            assert r.headers["Content-Type"] == "application/json"
        return [r.event for r in got]

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return
            time.sleep(0.05)
        raise AssertionError(f"the receiver got {len(self.received)} of {count} deliveries "
                             f"within {timeout:.0f}s")
