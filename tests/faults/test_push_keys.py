"""A push retried after an unknown outcome never makes a duplicate (docs/reliability.md;
registry/catalog/pushes.py): a real `registry serve` subprocess, on SQLite and on
PostgreSQL, behind a forwarder that lets the server act and loses its answer.

- The commit's answer is lost on every try of the client: it is told the outcome is unknown,
  with the push's idempotency key; the whole push again with that key (a new process's
  Registry, as a script's retry would be) returns the version that commit made. One version.
- The begin's answer is lost: the push again with its key gets the same reservation back, so
  the retry commits the number the first begin reserved and no number is burnt.
- The same key for other weights is a typed conflict, never a silent answer of another push.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import registry
from registry.errors import PushKeyConflictError, ServerUnavailableError
from tests.faults.invariants import rebuild_agrees
from tests.faults.proxy import AnswerDropper
from tests.integration.serving import Service, start_registry_server

pytestmark = [pytest.mark.faults]


def _weights(seed: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((32, 32), float(seed)), "b": torch.arange(8) + seed}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'server' / 'registry.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def served(tmp_path: Path, catalog_url: str) -> Iterator[tuple[Service, AnswerDropper, Path]]:
    home = tmp_path / "server"
    server = start_registry_server(home, tmp_path, env_extra={
        "REGISTRY_CATALOG_URL": catalog_url, "REGISTRY_STORE_URL": f"file://{home / 'objects'}"})
    proxy = AnswerDropper(server.url)
    try:
        yield server, proxy, home
    finally:
        proxy.close()
        server.stop()


def _embedded(home: Path, catalog_url: str) -> registry.Registry:
    """The server's catalog and store, opened in this process for the checks."""
    return registry.Registry(catalog=catalog_url, store=f"file://{home / 'objects'}")


def test_a_push_retried_after_its_commit_answer_was_lost_makes_one_version(
        served: tuple[Service, AnswerDropper, Path], catalog_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, proxy, home = served
    monkeypatch.setattr("registry.http.remote._COMMIT_RETRY_PAUSES", (0.0,))  # two tries, both lost
    proxy.lose("POST", "/commit", 2)
    first = registry.Registry(proxy.url)
    with pytest.raises(ServerUnavailableError, match="may have gone through") as lost:
        first.push(_weights(1), "kept", aliases=["prod"], tags={"run": "a"},
                   idempotency_key="run-a-push-1")
    first.close()
    assert proxy.lost == 2 and "idempotency_key='run-a-push-1'" in str(lost.value)
    # The server did commit (the answers were lost, not the requests).
    local = _embedded(home, catalog_url)
    try:
        assert [v.version for v in local.list_versions("kept")] == [1]
        # The whole push again, in a fresh client, with the same key: that version, not v2.
        before = len(proxy.seen)
        again = registry.Registry(proxy.url)
        v = again.push(_weights(1), "kept", aliases=["prod"], tags={"run": "a"},
                       idempotency_key="run-a-push-1")
        again.close()
        assert (v.ref, v.tags, v.aliases) == ("kept:v1", {"run": "a"}, ["prod"])
        assert [r.version for r in local.list_versions("kept")] == [1]
        assert not any(line.endswith("/commit") for line in proxy.seen[before:]), \
            "the retry committed again instead of being answered by its begin"
        # Without the key the same weights are a new push, as they always were.
        fresh = registry.Registry(proxy.url)
        assert fresh.push(_weights(1), "kept").version == 2
        fresh.close()
        pulled = local.pull_state_dict("kept:v1", device="cpu")
        assert torch.equal(pulled["w"], _weights(1)["w"])
        assert rebuild_agrees(local.backend) == []  # type: ignore[arg-type]
    finally:
        local.close()


def test_a_push_retried_after_its_begin_answer_was_lost_commits_the_reserved_number(
        served: tuple[Service, AnswerDropper, Path], catalog_url: str) -> None:
    _, proxy, home = served
    proxy.lose("POST", "/pushes", 1)
    first = registry.Registry(proxy.url)
    with pytest.raises(ServerUnavailableError):
        first.push(_weights(2), "begun", idempotency_key="begin-lost")
    first.close()
    assert proxy.lost == 1
    again = registry.Registry(proxy.url)
    v = again.push(_weights(2), "begun", idempotency_key="begin-lost")
    again.close()
    assert v.ref == "begun:v1"  # the first begin's reservation, not a second number
    local = _embedded(home, catalog_url)
    try:
        assert [r.version for r in local.list_versions("begun")] == [1]
        assert rebuild_agrees(local.backend) == []  # type: ignore[arg-type]
    finally:
        local.close()


def test_one_key_for_two_pushes_is_a_typed_conflict(
        served: tuple[Service, AnswerDropper, Path], catalog_url: str) -> None:
    server, _, home = served
    reg = registry.Registry(server.url)
    try:
        assert reg.push(_weights(3), "keyed", idempotency_key="k-3").version == 1
        with pytest.raises(PushKeyConflictError, match=r"'k-3' is the push of keyed:v1"):
            reg.push(_weights(4), "keyed", idempotency_key="k-3")
        with pytest.raises(registry.RefError, match="invalid idempotency key"):
            reg.push(_weights(4), "keyed", idempotency_key="../k 3")
        # The same key names a push per model: another model may use it.
        assert reg.push(_weights(4), "other", idempotency_key="k-3").version == 1
        reg.delete_version("keyed:v1")
        with pytest.raises(PushKeyConflictError, match="deleted since"):
            reg.push(_weights(3), "keyed", idempotency_key="k-3")
    finally:
        reg.close()
    local = _embedded(home, catalog_url)
    try:
        assert [r.version for r in local.list_versions("other")] == [1]
    finally:
        local.close()


# -- embedded: the same catalog rules, in process ------------------------------------------------

def test_an_embedded_push_again_with_its_key_returns_its_version(home: Path) -> None:
    reg = registry.Registry(home=home)
    try:
        v1 = reg.push(_weights(5), "solo", aliases=["prod"], idempotency_key="solo-1")
        again = reg.push(_weights(5), "solo", aliases=["prod"], idempotency_key="solo-1")
        assert (again.ref, again.digest) == (v1.ref, v1.digest) == ("solo:v1", v1.digest)
        assert [r.version for r in reg.list_versions("solo")] == [1]
        with pytest.raises(PushKeyConflictError, match="other files"):
            reg.push(_weights(6), "solo", idempotency_key="solo-1")
        with pytest.raises(PushKeyConflictError, match="claims v7"):
            reg.push(_weights(5), "solo:v7", idempotency_key="solo-1")
        assert [r.version for r in reg.list_versions("solo")] == [1]
    finally:
        reg.close()


def test_an_embedded_push_again_with_its_key_takes_over_its_killed_reservation(
        home: Path) -> None:
    """A push killed after its begin left a reservation: the same push again with its key
    commits that number instead of leaving it to the lease and taking the next."""
    reg = registry.Registry(home=home)
    try:
        reg.push(_weights(7), "taken")  # v1
        backend = reg.backend
        seen: list[int] = []
        real_begin = backend.begin_push  # type: ignore[attr-defined]

        def killed(*args: object, **kwargs: object) -> object:
            number, missing = real_begin(*args, **kwargs)
            seen.append(number)
            raise KeyboardInterrupt  # the process dies right after its begin

        backend.begin_push = killed  # type: ignore[attr-defined]
        with pytest.raises(KeyboardInterrupt):
            reg.push(_weights(8), "taken", idempotency_key="taken-2")
        del backend.begin_push  # type: ignore[attr-defined]
        v = reg.push(_weights(8), "taken", idempotency_key="taken-2")
        assert seen == [2] and v.ref == "taken:v2"
        assert [r.version for r in reg.list_versions("taken")] == [1, 2]
    finally:
        reg.close()
