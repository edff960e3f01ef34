"""A push's outcome is exact and retry-safe (docs/reliability.md): once the
catalog commit succeeded the push reports success, and a retried commit whose answer was lost
returns the committed version instead of failing or making a duplicate. Embedded and through a
server (in process: the app behind httpx's transport, so failures are injected exactly)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import registry
from registry import manifest as mf
from registry.backends import LocalBackend
from registry.errors import ServerUnavailableError, StoreUnavailableError
from registry.settings import Settings
from server.app import create_app
from tests.faults.invariants import rebuild_agrees
from tests.helpers import assert_same_state, trained_mlp
from tests.integration.test_gc_race import SteppedStore, on


class LostAnswers(httpx.BaseTransport):
    """Forwards to the app; the first ``lose`` commit requests are handled by the server, then
    their answer is dropped as a cut connection would."""

    def __init__(self, inner: httpx.BaseTransport, lose: int) -> None:
        self.inner, self.lose, self.commits = inner, lose, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.inner.handle_request(request)
        response = httpx.Response(answer.status_code, headers=answer.headers,
                                  content=answer.read(), request=request)
        if request.method == "POST" and request.url.path.endswith("/commit"):
            self.commits += 1
            if self.lose > 0:
                self.lose -= 1
                raise httpx.ReadError("connection reset by peer", request=request)
        return response


@pytest.fixture
def served(home: Path) -> Iterator[tuple[LocalBackend, TestClient]]:
    settings = Settings.from_env(home=home)
    backend = LocalBackend.from_settings(settings)
    backend.store = SteppedStore(backend.store)  # type: ignore[assignment]
    app = create_app(settings, backend=backend)
    with TestClient(app) as client:
        yield backend, client
    backend.close()


def _client(client: TestClient, lose: int = 0) -> tuple[registry.Registry, LostAnswers]:
    reg = registry.Registry("http://testserver")
    transport = LostAnswers(client._transport, lose)  # the app, in this process
    reg.backend.transport.httpx_transport = transport  # type: ignore[attr-defined]
    return reg, transport


def _outage(key: str) -> None:
    raise StoreUnavailableError(f"store unreachable writing {key}")


def test_a_store_failure_after_the_commit_is_a_success_through_the_server(
        served: tuple[LocalBackend, TestClient], home: Path) -> None:
    backend, client = served
    reg, _ = _client(client)
    store: Any = backend.store
    store.hooks["put_bytes"] = on("manifests/", _outage)
    v1 = reg.push(trained_mlp(), "after", aliases=["prod"])
    assert v1.ref == "after:v1" and reg.show("after@prod").version == 1
    assert mf.manifest_key("after", 1) in backend.copies.owed()
    assert backend.gc().reconciled  # written now
    assert rebuild_agrees(backend) == []
    assert_same_state(reg.pull_state_dict("after:v1", device="cpu"), trained_mlp().state_dict())


@pytest.mark.parametrize("lost", [1, 3])
def test_a_commit_whose_answer_was_lost_returns_the_committed_version(
        served: tuple[LocalBackend, TestClient], lost: int) -> None:
    """The server committed, the answer never arrived: the client commits again with the
    same manifest and gets the same version; no duplicate, no error."""
    backend, client = served
    reg, transport = _client(client, lose=lost)
    v1 = reg.push(trained_mlp(), "lost", aliases=["prod"], tags={"run": "a"})
    assert transport.commits == lost + 1
    assert v1.ref == "lost:v1" and v1.tags == {"run": "a"} and "prod" in v1.aliases
    assert [r.version for r in backend.list_versions("lost")] == [1]
    assert rebuild_agrees(backend) == []


def test_a_server_that_never_answers_the_commit_is_a_server_error_naming_the_check(
        served: tuple[LocalBackend, TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    backend, client = served
    monkeypatch.setattr("registry.http.remote._COMMIT_RETRY_PAUSES", (0.0,))
    reg, _ = _client(client, lose=5)
    with pytest.raises(ServerUnavailableError, match=r"registry show lost:v1"):
        reg.push(trained_mlp(), "lost")
    # It did commit (the answers were lost, not the requests), and the client's abort of a
    # committed push removed nothing.
    assert [r.version for r in backend.list_versions("lost")] == [1]
    assert rebuild_agrees(backend) == []


def test_a_retried_commit_with_another_manifest_is_refused(home: Path) -> None:
    """Idempotency is for the same commit only: another manifest for a committed number is
    not this push, and is refused as before."""
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(), "once")
    backend: Any = reg.backend
    stored = mf.loads((home / "objects" / mf.manifest_key("once", 1)).read_bytes(),
                      origin="test")
    assert backend.committed_push("once", 1, stored) is not None
    other = {**stored, "created_at": "2001-01-01T00:00:00+00:00"}
    assert backend.committed_push("once", 1, other) is None
    with pytest.raises(registry.NotFoundError):
        backend.commit_push("once", 1, other, {}, [])
