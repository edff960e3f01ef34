"""Real services on loopback: an S3-compatible HTTP server (moto) and the local PostgreSQL.

Every S3 test talks to the moto server through boto3 over HTTP, exactly as to MinIO; nothing is
mocked in-process. PostgreSQL tests run in a database created for this test session and dropped
after it. A missing service skips locally and fails under CI=true (``require_service``).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import socket
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import require_service

DUMMY_KEY_ID = "registry-test-key-id"
DUMMY_SECRET = "registry-test-secret-DO-NOT-PRINT"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- S3 (moto server) ---------------------------------------------------------------------------

@dataclass
class MotoEndpoint:
    """A running moto server; ``stop()`` makes it refuse connections (for outage tests)."""

    url: str
    server: Any

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.server.stop()


def start_moto() -> MotoEndpoint:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        require_service("moto S3 server", f"moto[server] is not installed ({exc})")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):  # the server thread binds asynchronously
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            break
    else:
        require_service("moto S3 server", f"it did not start listening on {url}")
    return MotoEndpoint(url, server)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoEndpoint]:
    endpoint = start_moto()
    yield endpoint
    endpoint.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials, the default region, and no ambient AWS configuration."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


@pytest.fixture
def s3_endpoint(moto_server: MotoEndpoint, aws_env: None,
                monkeypatch: pytest.MonkeyPatch) -> str:
    """The moto endpoint, also set as REGISTRY_S3_ENDPOINT_URL."""
    monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", moto_server.url)
    return moto_server.url


def s3_client(endpoint: str) -> Any:
    """A raw boto3 client, for setting up and tampering outside the registry."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=DUMMY_KEY_ID, aws_secret_access_key=DUMMY_SECRET,
                        config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def raw_s3(s3_endpoint: str) -> Any:
    return s3_client(s3_endpoint)


@pytest.fixture
def s3_bucket(raw_s3: Any) -> str:
    """A fresh, empty bucket for one test."""
    name = f"reg-{uuid.uuid4().hex[:12]}"
    raw_s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_store_url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/team"


# -- S3 (s3rver, an independent implementation from npm) ---------------------------------------

@pytest.fixture(scope="session")
def s3rver_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.integration import s3rver

    server = s3rver.start(tmp_path_factory.mktemp("s3rver") / "data", free_port())
    yield server.url
    server.stop()


@pytest.fixture
def s3rver_endpoint(s3rver_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The s3rver endpoint with its fixed credentials in the environment."""
    from tests.integration.s3rver import CREDENTIALS

    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS[1])
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", s3rver_server)
    return s3rver_server


# -- PostgreSQL ---------------------------------------------------------------------------------

PG_HOST = os.environ.get("REGISTRY_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("REGISTRY_TEST_PG_PORT", "5432"))


def _pg_user() -> str | None:
    """The first role that can connect to database ``test`` over trust auth."""
    try:
        import psycopg
    except ImportError:
        return None
    candidates = [os.environ.get("PGUSER"), "postgres", "root", getpass.getuser()]
    for user in dict.fromkeys(c for c in candidates if c):
        try:
            with psycopg.connect(host=PG_HOST, port=PG_PORT, user=user, dbname="test",
                                 connect_timeout=3):
                return user
        except psycopg.Error:
            continue
    return None


@dataclass(frozen=True)
class PostgresServer:
    user: str
    host: str = PG_HOST
    port: int = PG_PORT

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def execute(self, sql: str, database: str = "test") -> None:
        import psycopg

        with psycopg.connect(host=self.host, port=self.port, user=self.user, dbname=database,
                             autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self) -> str:
        name = f"reg_test_{uuid.uuid4().hex[:12]}"
        self.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    user = _pg_user()
    if user is None:
        require_service("PostgreSQL", f"nothing accepts connections at {PG_HOST}:{PG_PORT} "
                        "(database 'test', trust auth)")
    return PostgresServer(user)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pg_database(postgres: PostgresServer) -> Iterator[str]:
    """This test session's own database (a SQLAlchemy URL), dropped at the end."""
    name = postgres.create_database()
    yield postgres.url(name)
    postgres.drop_database(name)


@pytest.fixture
def pg_url(pg_database: str) -> Iterator[str]:
    """The session database, emptied and migrated to head for one test."""
    from registry.catalog.db import make_engine, upgrade

    engine = make_engine(pg_database)
    _drop_registry_tables(engine)
    upgrade(engine)
    engine.dispose()
    yield pg_database


def _drop_registry_tables(engine: Any) -> None:
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS registry_aliases, registry_version_files, "
                          "registry_exports, registry_events, registry_versions, "
                          "registry_webhook_attempts, registry_webhook_deliveries, "
                          "registry_webhooks, "
                          "registry_models, registry_alembic_version CASCADE"))


_METHODS = {b"GET", b"PUT", b"POST", b"HEAD", b"DELETE"}


class CuttingProxy:
    """A TCP proxy in front of an S3 endpoint that can cut blob downloads half way, as a flaky
    network or a dying server does. ``cut_next`` GETs of ``/blobs/`` keys get only the first
    ``keep`` bytes of their response before the connection drops (-1: every GET). With
    ``drop_range`` it removes Range headers on the way, as a proxy that ignores them does: the
    server then answers 200 with the whole blob."""

    def __init__(self, target: str, keep: int = 4096) -> None:
        import threading

        parsed = urllib.parse.urlsplit(target)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.keep = keep
        self.cut_next = 0
        self.cuts = 0
        self.drop_range = False
        self.ranges: list[bytes] = []  # Range header values seen (dropped or not)
        self.requests: list[bytes] = []  # request lines seen, e.g. b"PUT /bucket/key HTTP/1.1"
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def blob_requests(self, method: bytes) -> list[bytes]:
        """Request lines seen for ``/blobs/`` keys with ``method`` (b"GET", b"PUT")."""
        return [r for r in self.requests if r.startswith(method + b" ") and b"/blobs/" in r]

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def _should_cut(self, request: bytes) -> bool:
        if not (request.startswith(b"GET ") and b"/blobs/" in request.split(b"\r\n", 1)[0]):
            return False
        with self._lock:
            if self.cut_next == 0:
                return False
            if self.cut_next > 0:
                self.cut_next -= 1
            self.cuts += 1
            return True

    def _accept(self) -> None:
        import threading

        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        import threading

        upstream = socket.create_connection(self.target)
        state = {"cut": False, "sent": 0}

        def downstream() -> None:
            with contextlib.suppress(OSError):
                while data := upstream.recv(65536):
                    if state["cut"]:
                        room = self.keep - state["sent"]
                        client.sendall(data[:max(room, 0)])
                        state["sent"] += len(data)
                        if state["sent"] >= self.keep:
                            break
                    else:
                        client.sendall(data)
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()

        threading.Thread(target=downstream, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if data.split(b" ", 1)[0] in _METHODS:
                    self.requests.append(data.split(b"\r\n", 1)[0])
                if self._should_cut(data):
                    state["cut"], state["sent"] = True, 0
                self.ranges.extend(re.findall(rb"(?im)^range:\s*([^\r]*)\r$", data))
                if self.drop_range:
                    data = re.sub(rb"(?i)\r\nrange:[^\r]*", b"", data)
                upstream.sendall(data)


@pytest.fixture
def cutting_proxy(moto_server: MotoEndpoint) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(moto_server.url)
    yield proxy
    proxy.close()
