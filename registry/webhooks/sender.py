"""One POST of a delivery, bounded: to the address the SSRF guard checked (``targets.py``), no
redirect followed, 10 seconds for the whole attempt, at most 64 KB of the answer read (as it
streams in; the first KB is kept for the attempt's record).

The standard library's ``http.client`` does it: it lets the connection go to an address of our
choosing while the Host header and TLS (SNI, certificate check) use the URL's host name, which
is what defeats DNS rebinding; httpx resolves names itself, inside its transport.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from ..errors import WebhookTargetError
from .records import ANSWER_KEPT, Attempt
from .targets import Target, check

TIMEOUT_S = 10.0
MAX_ANSWER = 64 * 1024


@dataclass(frozen=True)
class Sender:
    """How deliveries are sent: whether private addresses may be called, the time bound."""

    allow_private: bool = False
    timeout: float = TIMEOUT_S

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
        """POST ``body`` to ``url``; the attempt as it went (never raises for the receiver's
        failures: no answer is ``status=None`` with the reason in ``error``)."""
        at, start = datetime.now(timezone.utc), time.monotonic()

        def done(status: int | None, answer: bytes = b"", error: str | None = None) -> Attempt:
            return Attempt(at, status, int((time.monotonic() - start) * 1000),
                           answer[:ANSWER_KEPT].decode("utf-8", "replace"), error)

        try:
            target = check(url, allow_private=self.allow_private)
        except WebhookTargetError as exc:
            return done(None, error=str(exc))
        deadline = start + self.timeout
        connection = _connection(target, self.timeout)
        try:
            connection.request("POST", target.path, body=body,
                               headers={**headers, "User-Agent": "torch-registry-webhook"})
            response = connection.getresponse()
            answer = _read(response, connection, deadline)
            return done(response.status, answer)
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            reason = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) \
                else f"{type(exc).__name__}: {exc}"
            return done(None, error=f"{target.host}:{target.port} ({target.address}): "
                                    f"{reason}"[:500])
        finally:
            connection.close()


def _connection(target: Target, timeout: float) -> http.client.HTTPConnection:
    if target.scheme == "https":
        return _PinnedHTTPS(target.host, target.port, timeout=timeout,
                            context=ssl.create_default_context(), address=target.address)
    return _PinnedHTTP(target.host, target.port, timeout=timeout, address=target.address)


def _read(response: http.client.HTTPResponse, connection: http.client.HTTPConnection,
          deadline: float) -> bytes:
    """At most :data:`MAX_ANSWER` bytes of the answer, each read bounded by what is left of the
    attempt's time (a receiver dripping bytes cannot hold the worker)."""
    chunks: list[bytes] = []
    have = 0
    while have < MAX_ANSWER:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer took longer than the attempt's time bound")
        if connection.sock is not None:
            connection.sock.settimeout(left)
        chunk = response.read1(min(16384, MAX_ANSWER - have))
        if not chunk:
            break
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


class _PinnedHTTP(http.client.HTTPConnection):
    """A connection to ``address`` that speaks HTTP for ``host``."""

    def __init__(self, host: str, port: int, *, timeout: float, address: str) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """A TLS connection to ``address``, its certificate checked for ``host``."""

    def __init__(self, host: str, port: int, *, timeout: float, context: ssl.SSLContext,
                 address: str) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self.address = address
        self.tls = context

    def connect(self) -> None:
        raw = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(raw, server_hostname=self.host)
