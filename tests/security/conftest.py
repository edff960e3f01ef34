"""Fixtures of the hostile-input suite: the outside-the-home sentinel around every test, a real
registry server, a hostile server, and the PostgreSQL and S3 services of the integration suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import registry
from tests.helpers import trained_mlp
from tests.integration.conftest import (  # noqa: F401  (fixtures shared with the integration suite)
    aws_env,
    moto_server,
    pg_database,
    pg_url,
    postgres,
    raw_s3,
    s3_bucket,
    s3_endpoint,
    s3_store_url,
)
from tests.integration.serving import Service, registry_server

from .hostile import HostileServer
from .outside import SHARED, Outside


@pytest.fixture(autouse=True)
def outside_untouched(tmp_path: Path) -> Iterator[Outside]:
    """Fail the test if any path outside a registry home changed while it ran."""
    watched = Outside({**SHARED.roots})
    watched.watch(tmp_path, {"home", "work"})
    before = watched.snapshot()
    yield watched
    changed = watched.check(before)
    assert not changed, "paths outside the registry home changed:\n" + "\n".join(changed)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """Where a test writes its own inputs (checkpoints, scripts): not watched."""
    path = tmp_path / "work"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A real `registry serve` whose root (outside its home and logs) is watched by every test,
    holding model ``seeded`` (v1, v2, alias production)."""
    root = tmp_path_factory.mktemp("server")
    SHARED.watch(root, {"home", "logs", "work"})
    (root / "logs").mkdir()
    with registry_server(root / "home", root / "logs") as service:
        service.home = root / "home"  # type: ignore[attr-defined]
        service.root = root  # type: ignore[attr-defined]
        client = registry.Registry(service.url, home=root / "work" / "client")
        client.push(trained_mlp(), "seeded", aliases=["production"])
        client.push(trained_mlp(1), "seeded")
        client.close()
        yield service
    del SHARED.roots[root]


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    fake = HostileServer()
    yield fake
    fake.close()


@pytest.fixture
def hostile_client(hostile: HostileServer, home: Path) -> Iterator[registry.Registry]:
    client = registry.Registry(hostile.url, home=home)
    yield client
    client.close()
