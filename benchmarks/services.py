"""Services the benchmark starts on loopback and tears down: a moto S3 server, a PostgreSQL
database of its own."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"

# moto runs in its own interpreter: in-process, its request handling would compete for the
# GIL with the client being measured.
_MOTO = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]))
server.start()
print("ready", flush=True)
sys.stdin.read()  # until the parent closes our stdin
server.stop()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Endpoint:
    url: str
    pid: int


@contextlib.contextmanager
def moto_server() -> Iterator[Endpoint]:
    """An S3 endpoint served by moto on 127.0.0.1, with fake credentials in the env."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _MOTO, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # moto announces itself first
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError("moto server did not start")
        endpoint = f"http://127.0.0.1:{port}"
        _wait_for_port(port)
        saved = {k: os.environ.get(k) for k in _FAKE_AWS}
        os.environ.update(_FAKE_AWS)
        try:
            yield Endpoint(endpoint, proc.pid)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database on the local PostgreSQL server (dropped afterwards), as a SQLAlchemy URL.

    Raises ``RuntimeError`` if the server cannot be reached."""
    import psycopg

    name = f"registry_bench_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise RuntimeError(f"PostgreSQL at 127.0.0.1:5432 unavailable: {exc}") from None
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
