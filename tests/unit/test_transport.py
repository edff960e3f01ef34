"""The transport a RemoteBackend builds is the one its exports and signatures talk through: one
client, the token on the server's own URLs, the server's errors raised as the same classes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from registry.errors import NotFoundError, RegistryError
from registry.http.remote import RemoteBackend
from registry.http.transport import target_url


def _backend(tmp_path: Path, seen: list[httpx.Request]) -> RemoteBackend:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/signatures"):
            return httpx.Response(404, json={"error": {"code": "not_found",
                                                       "message": "no signature routes"}})
        if request.url.path == "/api/v1/models/gone/versions/1/exports":
            return httpx.Response(404, json={"error": {"code": "not_found",
                                                       "message": "gone:v1 not found"}})
        return httpx.Response(200, json={"exports": []})

    return RemoteBackend("http://registry.example", token="s3cret", cache_dir=tmp_path,
                         transport=httpx.MockTransport(answer))


def test_exports_and_signatures_share_the_backends_transport(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    backend = _backend(tmp_path, seen)
    assert backend.exports.transport is backend.transport
    assert backend.signatures.transport is backend.transport
    assert backend.list_exports("a b", 2) == []
    assert backend.signatures.listed("a b", 2) == []  # a server without signature routes
    assert [r.url.raw_path.decode() for r in seen] == ["/api/v1/models/a%20b/versions/2/exports",
                                          "/api/v1/models/a%20b/versions/2/signatures"]
    assert {r.headers["Authorization"] for r in seen} == {"Bearer s3cret"}
    assert "s3cret" not in repr(backend.transport)
    backend.close()


def test_an_error_body_is_raised_as_the_servers_class(tmp_path: Path) -> None:
    backend = _backend(tmp_path, [])
    with pytest.raises(NotFoundError, match="gone:v1 not found"):
        backend.exports.list_exports("gone", 1)
    backend.close()


@pytest.mark.parametrize("url", ["http://elsewhere.example/api/v1/blobs/x", "//elsewhere/x",
                                 "/api/v1/../../x"])
def test_a_transfer_url_that_could_carry_the_token_away_is_refused(url: str) -> None:
    with pytest.raises(RegistryError, match="refusing to send the token"):
        target_url("http://registry.example", {"url": url})
