"""Two server replicas on one catalog, each running the delivery worker: every delivery is
attempted by one replica at a time, so in normal operation a receiver gets each exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from cryptography.fernet import Fernet

import registry
from registry.catalog.repository import Catalog
from tests.integration.serving import registry_server
from tests.integration.webhook_receiver import Receiver

PUSHES_PER_REPLICA = 10


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.down()


@pytest.mark.parametrize("returning", [True, False], ids=["update-returning", "update-then-read"])
def test_of_two_workers_that_see_the_same_due_delivery_exactly_one_claims_it(
        catalog_url: str, home: Path, monkeypatch: pytest.MonkeyPatch,
        receiver: Receiver, returning: bool) -> None:
    monkeypatch.setenv("REGISTRY_WEBHOOK_ALLOW_PRIVATE", "1")
    reg = registry.Registry(catalog=catalog_url)
    reg.add_webhook(receiver.url, "*")
    reg.push({"w": torch.ones(3)}, "claimed")
    reg.push({"w": torch.zeros(3)}, "claimed")
    reg.close()
    first, second = Catalog(catalog_url, auto_migrate=True), Catalog(catalog_url)
    for catalog in (first, second):  # a database without UPDATE ... RETURNING claims alike
        catalog.engine.dialect.update_returning = returning and \
            catalog.engine.dialect.update_returning
    try:
        lease = timedelta(seconds=60)
        mine = first.webhooks.claim("worker-a", lease)
        assert [c.payload["version"] for c in mine] == [1]  # v2 waits for v1 (same model)
        assert second.webhooks.claim("worker-b", lease) == []
        # A lease that ran out (its worker died) is taken over.
        later = mine[0].created_at + timedelta(seconds=120)
        taken = second.webhooks.claim("worker-b", lease, now=later)
        assert [c.delivery_id for c in taken] == [mine[0].delivery_id]
    finally:
        first.close()
        second.close()


@pytest.mark.postgres
@pytest.mark.slow
def test_two_replicas_deliver_every_event_once(pg_url: str, tmp_path: Path,
                                               receiver: Receiver) -> None:
    env = {"REGISTRY_CATALOG_URL": pg_url,
           "REGISTRY_STORE_URL": (tmp_path / "objects").as_uri(),
           "REGISTRY_WEBHOOK_ALLOW_PRIVATE": "1",
           "REGISTRY_WEBHOOK_KEY": Fernet.generate_key().decode()}
    with registry_server(tmp_path / "a", tmp_path, env_extra=env) as a, \
            registry_server(tmp_path / "b", tmp_path, env_extra=env) as b:
        admin = registry.Registry(a.url)
        hook = admin.add_webhook(receiver.url, ["version.created"])
        admin.close()
        errors: list[BaseException] = []

        def push_through(url: str, offset: int) -> None:
            reg = registry.Registry(url)
            try:
                for i in range(PUSHES_PER_REPLICA):
                    reg.push({"w": torch.full((4,), float(offset + i))}, f"model-{i % 3}")
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)
            finally:
                reg.close()

        threads = [threading.Thread(target=push_through, args=(a.url, 0)),
                   threading.Thread(target=push_through, args=(b.url, 1000))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        total = 2 * PUSHES_PER_REPLICA
        receiver.wait_for(total, timeout=120)
        time.sleep(3)  # a duplicate would arrive within a few of the workers' polls
        events = receiver.events(hook.secret or "")
        counts = Counter(e["delivery_id"] for e in events)
        assert len(counts) == total and set(counts.values()) == {1}, counts
        for name in ("model-0", "model-1", "model-2"):
            # In the log's order per model (two pushes of one model may commit out of their
            # numbers' order: the log, and its deliveries, follow the commits).
            ids = [e["id"] for e in events if e["name"] == name]
            assert ids == sorted(ids) and len(ids) > 1
