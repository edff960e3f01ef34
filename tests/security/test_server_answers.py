"""A server's answers are untrusted: the client checks every field before it becomes a path, a
key or a return value, against a real (hostile) HTTP server on loopback."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import registry
from registry.errors import DigestMismatchError, RegistryError
from registry.http.wire import record_from_wire
from tests.helpers import clean_env, run_cli

from .hostile import HostileServer

DIGEST = "sha256:" + "a" * 64


def _record(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "name": "m", "version": 1, "digest": DIGEST, "size_bytes": 4,
        # A manifest that passes every check of its own, so the answers around it are tested.
        "manifest": {"format_version": 2, "name": "m", "version": 1, "digest": DIGEST,
                     "created_at": "2026-01-01T00:00:00+00:00",
                     "files": [{"digest": DIGEST, "size": 4, "format": "safetensors",
                                "tensors": ["w"]}],
                     "tensors": {"w": {"dtype": "float32", "shape": [1]}},
                     "source": {"size_bytes": 4, "tied": {}}},
        "tags": {}, "aliases": [],
    }
    record.update(changes)
    return {k: v for k, v in record.items() if v is not _MISSING}


_MISSING = object()

BAD_RECORDS = {
    "traversal digest": _record(digest="sha256:../../../../victim"),
    "digest not hex": _record(digest="sha256:" + "g" * 64),
    "version true": _record(version=True),
    "version string": _record(version="1"),
    "version zero": _record(version=0),
    "version huge": _record(version=2**31),
    "version float": _record(version=1.5),
    "size negative": _record(size_bytes=-1),
    "size huge": _record(size_bytes=2**60),
    "name traversal": _record(name="../../evil"),
    "name upper": _record(name="EVIL"),
    "tags a list": _record(tags=["a"]),
    "tag value int": _record(tags={"k": 1}),
    "aliases a dict": _record(aliases={"a": 1}),
    "alias reserved": _record(aliases=["latest"]),
    "manifest a list": _record(manifest=[]),
    "tags missing": _record(tags=_MISSING),
    "name missing": _record(name=_MISSING),
    "a list": [],
    "null": None,
    "a string": "resnet18:v1",
}


@pytest.mark.parametrize("answer", list(BAD_RECORDS.values()), ids=list(BAD_RECORDS))
def test_malformed_version_records_are_registry_errors(answer: object) -> None:
    with pytest.raises(RegistryError) as caught:
        record_from_wire(answer)
    assert type(caught.value) is RegistryError  # not KeyError/TypeError/ValueError dressed up
    assert "malformed" in str(caught.value) and len(str(caught.value)) < 800


@settings(max_examples=400, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["name", "version", "digest", "size_bytes",
                                                       "manifest", "tags", "aliases", "x"]),
                                      inner, max_size=8),
                    max_leaves=20))
def test_record_from_wire_is_total(answer: object) -> None:
    try:
        record = record_from_wire(answer)
    except RegistryError:
        return
    assert record.digest.startswith("sha256:") and len(record.digest) == 71


def test_a_traversal_digest_from_the_server_touches_nothing(hostile: HostileServer,
                                                            hostile_client: registry.Registry,
                                                            tmp_path: Path) -> None:
    """The issue's case: a server answering digest sha256:../../../../victim would have made the
    client chmod and delete a file outside its home. The sentinel fixture checks the victim."""
    bad = "sha256:../../../../victim"
    hostile.answer("GET", "/api/v1/resolve", _record(digest=bad))
    with pytest.raises(RegistryError):
        hostile_client.pull_state_dict("m", device="cpu")
    # The same digest inside the manifest's files only (the record itself well-formed).
    manifest = _record()["manifest"]
    manifest["files"] = [{"digest": bad, "size": 4, "format": "safetensors"}]
    hostile.answer("GET", "/api/v1/resolve", _record(manifest=manifest))
    with pytest.raises(RegistryError):
        hostile_client.pull_state_dict("m", device="cpu")
    assert (tmp_path / "victim").exists()
    assert not any("victim" in path for _, path in hostile.requests)


@pytest.mark.parametrize("body,ctype", [(b"<html>proxy login</html>", "text/html"),
                                        (b"", "application/json"),
                                        (b"[1, 2", "application/json"),
                                        (b"\xff\xfe", "application/json")])
def test_answers_that_are_not_json_objects_are_registry_errors(
        hostile: HostileServer, hostile_client: registry.Registry, body: bytes,
        ctype: str) -> None:
    hostile.answer("GET", "/api/v1/resolve", body, raw=True, content_type=ctype)
    with pytest.raises(RegistryError) as caught:
        hostile_client.show("m")
    assert not isinstance(caught.value, (KeyError, TypeError))


def test_list_answers_are_checked(hostile: HostileServer,
                                  hostile_client: registry.Registry) -> None:
    for answer in ({"models": ["../../evil"]}, {"models": "abc"}, {"models": [1]}, {},
                   {"models": ["a"] * 1001}, {"models": ["a"], "next": "../x"}):
        hostile.answer("GET", "/api/v1/models", answer)
        with pytest.raises(RegistryError):
            hostile_client.list_models()
    hostile.answer("GET", "/api/v1/models/m/versions", {"versions": [_record(version=True)]})
    with pytest.raises(RegistryError):
        hostile_client.list_versions("m")


def test_a_cursor_that_does_not_advance_stops(hostile: HostileServer,
                                              hostile_client: registry.Registry) -> None:
    hostile.answer("GET", "/api/v1/models", {"models": ["a"], "next": "a"})
    with pytest.raises(RegistryError, match="does not advance"):
        hostile_client.list_models()
    assert len(hostile.requests) == 2


def test_the_client_follows_cursors_to_the_end(hostile: HostileServer,
                                               hostile_client: registry.Registry) -> None:
    # The fake server ignores ?after=, so it answers page 1 then, re-asked, the same page: the
    # first answer sends a cursor, the next says there is no more.
    pages = iter([{"models": ["a", "b"], "next": "b"}, {"models": ["c"], "next": None}])
    original = hostile.routes

    class Pager(dict):  # type: ignore[type-arg]
        def get(self, key: Any, default: Any = None) -> Any:
            if key == ("GET", "/api/v1/models"):
                return 200, json.dumps(next(pages)).encode(), "application/json"
            return original.get(key, default)

    hostile.routes = Pager()
    assert hostile_client.list_models() == ["a", "b", "c"]
    assert [p for _, p in hostile.requests] == ["/api/v1/models?limit=1000",
                                                "/api/v1/models?limit=1000&after=b"]


def test_huge_error_messages_are_cut(hostile: HostileServer,
                                     hostile_client: registry.Registry) -> None:
    message = "x" * (8 * 2**20)
    hostile.answer("GET", "/api/v1/resolve",
                   {"error": {"code": "not_found", "message": message}}, status=404)
    with pytest.raises(registry.NotFoundError) as caught:
        hostile_client.show("m")
    assert len(str(caught.value)) < 2100


def test_unknown_error_codes_are_the_root_error(hostile: HostileServer,
                                                hostile_client: registry.Registry) -> None:
    hostile.answer("GET", "/api/v1/resolve",
                   {"error": {"code": "__class__", "message": "hi"}}, status=400)
    with pytest.raises(RegistryError) as caught:
        hostile_client.show("m")
    assert type(caught.value) is RegistryError


@pytest.mark.parametrize("link", [
    {"url": "//evil.invalid/steal", "direct": False},
    {"url": "http://evil.invalid/steal", "direct": False},
    {"url": "/api/v1/../../steal", "direct": False},
    {"url": "file:///etc/passwd", "direct": True},
    {"direct": False},
    {"url": 3, "direct": False},
])
def test_blob_links_that_could_leak_the_token_are_refused(
        hostile: HostileServer, home: Path, link: dict[str, Any]) -> None:
    client = registry.Registry(hostile.url, home=home, token="reg_secret")
    try:
        hostile.answer("GET", "/api/v1/resolve", _record())
        hostile.answer("GET", f"/api/v1/blobs/{DIGEST}/link", link)
        with pytest.raises(RegistryError):
            client.pull_state_dict("m", device="cpu")
    finally:
        client.close()
    assert [p for _, p in hostile.requests if "steal" in p] == []


def test_a_blob_that_does_not_match_its_digest_is_never_cached(
        hostile: HostileServer, hostile_client: registry.Registry, home: Path) -> None:
    hostile.answer("GET", "/api/v1/resolve", _record())
    hostile.answer("GET", f"/api/v1/blobs/{DIGEST}/link",
                   {"url": f"/api/v1/blobs/{DIGEST}", "direct": False})
    hostile.answer("GET", f"/api/v1/blobs/{DIGEST}", b"evil", raw=True,
                   content_type="application/octet-stream")
    with pytest.raises(DigestMismatchError):
        hostile_client.pull_state_dict("m", device="cpu")
    cached = home / "cache" / "blobs"
    assert not cached.exists() or not any(p.is_file() for p in cached.rglob("*"))
    assert hashlib.sha256(b"evil").hexdigest() != DIGEST[7:]


def test_gc_and_push_answers_are_checked(hostile: HostileServer,
                                         hostile_client: registry.Registry) -> None:
    hostile.answer("POST", "/api/v1/gc", {"deleted": ["sha256:../../victim"], "freed_bytes": 1,
                                          "kept": 0, "stale_pushes": 0})
    with pytest.raises(RegistryError, match="malformed gc report"):
        hostile_client.gc()
    hostile.answer("POST", "/api/v1/models/m/pushes", {"version": True, "upload": None})
    with pytest.raises(RegistryError, match="malformed push answer"):
        from tests.helpers import trained_mlp

        hostile_client.push(trained_mlp(), "m")


def test_cli_against_a_hostile_server_prints_one_line(hostile: HostileServer,
                                                      home: Path) -> None:
    hostile.answer("GET", "/api/v1/models", {"models": ["../../evil"]})
    result = run_cli("ls", env=clean_env(home, REGISTRY_URI=hostile.url))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
