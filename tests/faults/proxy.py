"""A loopback TCP forwarder in front of an S3 endpoint that cuts or stalls the connections of
blob transfers after N bytes, as a dying link or a hung server does.

``fault("cut" | "stall", "up" | "down", after)``: every connection that carries a request for a
``/blobs/`` key (a PUT for "up", a GET for "down") forwards ``after`` bytes in that direction,
then is closed ("cut") or stops moving bytes without closing ("stall"). ``heal()`` ends the
fault for new connections and closes the stalled ones.

``outage()``: the endpoint is gone for every request (not only blob transfers): new
connections are closed as they are accepted and open ones are cut at their next bytes, until
``heal()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse


class Forwarder:
    """A loopback listener in front of ``target`` whose connections ``_serve`` forwards; the
    subclasses set their state before calling ``__init__``, which starts accepting."""

    def __init__(self, target: str) -> None:
        parsed = urllib.parse.urlsplit(target)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        raise NotImplementedError


class FaultProxy(Forwarder):
    def __init__(self, target: str) -> None:
        self.mode: str | None = None
        self.direction = "up"
        self.after = 0
        self.hits = 0  # connections the fault struck (cut or stalled)
        self.down = False  # an outage: every connection refused or cut
        self.refused = 0  # connections the outage refused or cut
        super().__init__(target)

    def fault(self, mode: str, direction: str, after: int) -> None:
        assert mode in ("cut", "stall") and direction in ("up", "down")
        with self._lock:
            self.mode, self.direction, self.after, self.hits = mode, direction, after, 0

    def outage(self) -> None:
        with self._lock:
            self.down = True

    def heal(self) -> None:
        with self._lock:
            self.mode = None
            self.down = False

    def close(self) -> None:
        self.heal()
        super().close()

    def _struck(self, request: bytes, direction: str) -> tuple[str, int] | None:
        """The fault for a connection that just sent ``request``, if it applies."""
        method = b"PUT " if direction == "up" else b"GET "
        first = request.split(b"\r\n", 1)[0]
        with self._lock:
            if self.mode is None or self.direction != direction:
                return None
            if not (first.startswith(method) and b"/blobs/" in first):
                return None
            return self.mode, self.after

    def _serve(self, client: socket.socket) -> None:
        if self.down:
            with self._lock:
                self.refused += 1
            _close(client)
            return
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            _close(client)
            return
        # Per direction: the fault that struck this connection, and the bytes forwarded since.
        struck: dict[str, tuple[str, int] | None] = {"up": None, "down": None}
        sent = {"up": 0, "down": 0}

        def pump(src: socket.socket, dst: socket.socket, direction: str) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    if self.down:
                        with self._lock:
                            self.refused += 1
                        break
                    if direction == "up":
                        for d in ("up", "down"):
                            if struck[d] is None:
                                struck[d] = self._struck(data, d)
                    fault = struck[direction]
                    if fault is None:
                        dst.sendall(data)
                        continue
                    mode, after = fault
                    room = max(after - sent[direction], 0)
                    dst.sendall(data[:room])
                    sent[direction] += min(len(data), room)
                    if len(data) > room:
                        with self._lock:
                            self.hits += 1
                        if mode == "stall":
                            self._stall()
                        break
            for sock in (client, upstream):
                _close(sock)

        threading.Thread(target=pump, args=(upstream, client, "down"), daemon=True).start()
        pump(client, upstream, "up")

    def _stall(self) -> None:
        """Hold the connection open, moving nothing, until heal() or close()."""
        while not self._closed and self.mode is not None:
            time.sleep(0.05)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class AnswerDropper(Forwarder):
    """A loopback forwarder in front of a registry server that lets chosen requests through
    and loses their answers, as a connection cut after the server acted does.

    ``lose(method, suffix, count)``: the next ``count`` requests ``method`` to a path ending
    in ``suffix`` reach the server; once its answer starts to come back, the connection is
    closed instead, so the server has acted (committed, reserved) and the client never knows.
    ``lost`` counts the answers dropped, ``seen`` every request line forwarded.
    """

    def __init__(self, target: str) -> None:
        self.rules: dict[tuple[bytes, bytes], int] = {}
        self.lost = 0
        self.seen: list[str] = []
        super().__init__(target)

    def lose(self, method: str, suffix: str, count: int) -> None:
        with self._lock:
            self.rules[(method.encode(), suffix.encode())] = count

    def _doomed(self, data: bytes) -> bool:
        """Whether the request starting in ``data`` is one whose answer is to be lost."""
        parts = data.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return False
        path = parts[1].split(b"?", 1)[0]
        with self._lock:
            self.seen.append(f"{parts[0].decode()} {path.decode()}")
            for (method, suffix), count in self.rules.items():
                if count > 0 and parts[0] == method and path.endswith(suffix):
                    self.rules[(method, suffix)] = count - 1
                    return True
        return False

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            _close(client)
            return
        doomed = threading.Event()  # the request in flight on this connection loses its answer

        def down() -> None:
            with contextlib.suppress(OSError):
                while data := upstream.recv(65536):
                    if doomed.is_set():  # the server acted and answers: nobody hears it
                        with self._lock:
                            self.lost += 1
                        break
                    client.sendall(data)
            for sock in (client, upstream):
                _close(sock)

        threading.Thread(target=down, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self._doomed(data):
                    doomed.set()
                upstream.sendall(data)
        for sock in (client, upstream):
            _close(sock)
