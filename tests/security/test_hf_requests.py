"""The Hub door's routes (``/hf``) take hostile requests: file paths that climb, encode a slash,
name a store key or an absolute path; revision strings of every odd shape; byte ranges that do
not parse, run backwards, hold several spans or 5000-digit numbers. Each is a 4xx with a short
answer, never a 5xx; a file is served only when the version lists it, never found by path."""

from __future__ import annotations

import hashlib
import http.client
import json
from urllib.parse import urlsplit

import httpx
import pytest

import registry
from registry.refs import parse
from tests.integration.serving import Service

SHORT = 1400


def _raw(server: Service, method: str, path: str,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Send ``path`` exactly as written (httpx would normalize dot segments)."""
    where = urlsplit(server.url)
    conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def _refused(status: int, body: bytes, allowed: tuple[int, ...] = (400, 404, 414, 422)) -> None:
    assert status in allowed, (status, body[:400])
    assert len(body) < SHORT, len(body)
    if body:
        assert set(json.loads(body)["error"]) == {"code", "message"}


@pytest.mark.parametrize("name", [
    "../../../../etc/passwd", "..%2F..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "/etc/passwd",
    "//etc/passwd", "model.safetensors/../config.json", "./config.json", "config.json%00",
    "config.json/", "CONFIG.JSON", "blobs/sha256/" + "ab" * 32, "manifests/seeded/v1.json",
    "..", ".", "%2e%2e/%2e%2e/auth.json", "auth.json", "catalog.db", "a" * 5000,
    "model.safetensors%2F..%2F..%2Fcatalog.db", "\\..\\..\\catalog.db", "m%C3%A4in.json",
])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_file_name_is_looked_up_in_the_version_never_on_disk(server: Service, name: str,
                                                                 method: str) -> None:
    status, headers, body = _raw(server, method, f"/hf/seeded/resolve/main/{name}")
    _refused(status, body, (400, 404, 414))
    if status == 404 and headers.get("x-error-code"):
        assert headers["x-error-code"] in ("EntryNotFound", "RevisionNotFound")
    assert b"root:" not in body and b"SQLite" not in body


@pytest.mark.parametrize("revision", [
    "v0", "v" + "9" * 5000, "9" * 30, "main+float64", "main+", "+float16", "main+float16+",
    "v1+float16+float16", "..", "..%2F..%2Fmain", "main%2F..%2F..", "%00", "m%C3%A4in",
    "sha256:zz", "sha256:" + "a" * 5000, "a" * 39, "f" * 40, "a" * 300, "%20main",
    "refs%2Fpr%2F1", "production%2Bint8", "production%0D%0AX-Evil:%201",
])
def test_odd_revisions_are_a_missing_revision(server: Service, revision: str) -> None:
    for path in (f"/hf/seeded/resolve/{revision}/config.json",
                 f"/hf/api/models/seeded/revision/{revision}",
                 f"/hf/api/models/seeded/tree/{revision}"):
        status, headers, body = _raw(server, "GET", path)
        _refused(status, body)
        assert "x-evil" not in headers
        if status == 404 and headers.get("x-error-code"):
            assert headers["x-error-code"] in ("RevisionNotFound", "EntryNotFound")


@pytest.mark.parametrize("repo", ["..", "SEEDED", "%00", "a" * 300, "seeded%2F..", "-x", "api"])
def test_odd_repositories_are_a_missing_repository(server: Service, repo: str) -> None:
    status, headers, body = _raw(server, "GET", f"/hf/api/models/{repo}/revision/main")
    _refused(status, body)
    status, headers, body = _raw(server, "HEAD", f"/hf/{repo}/resolve/main/config.json")
    assert status in (400, 404), status


@pytest.mark.parametrize("header", [
    "bytes=abc", "bytes=5-2", "bytes=-0", "bytes=0-" + "9" * 5000, "bytes=" + "9" * 5000 + "-",
    "bytes=-" + "9" * 5000, "bytes=0-1,2-3", "items=0-1", "bytes=0-1, 5-", "bytes==0-1",
    "bytes=99999999999999-", "bytes=" + "0-1," * 2000 + "0-1", "bytes= 0-1", "",
])
def test_odd_ranges_get_the_whole_file_a_range_or_416(server: Service, header: str) -> None:
    record = registry.Registry(server.url, home=server.root / "work" / "range").show("seeded")
    digest = record.metadata["files"][0]["digest"]
    whole = httpx.get(f"{server.url}/hf/seeded/resolve/main/model.safetensors")
    assert whole.status_code == 200
    assert "sha256:" + hashlib.sha256(whole.content).hexdigest() == digest
    answer = httpx.get(f"{server.url}/hf/seeded/resolve/main/model.safetensors",
                       headers={"range": header})
    assert answer.status_code in (200, 206, 416), (answer.status_code, answer.text[:300])
    if answer.status_code == 200:
        assert answer.content == whole.content
    elif answer.status_code == 206:
        start, end = answer.headers["content-range"].split()[1].split("/")[0].split("-")
        assert answer.content == whole.content[int(start):int(end) + 1]
    # The same reader answers /api/v1/blobs (a 5000-digit bound was a 500 there too).
    blob = httpx.get(f"{server.url}/api/v1/blobs/{digest}", headers={"range": header})
    assert blob.status_code in (200, 206, 416), blob.status_code
    for name in ("config.json", "model.safetensors"):  # generated files too, for a transformers one
        small = httpx.get(f"{server.url}/hf/seeded/resolve/main/{name}",
                          headers={"range": header})
        assert small.status_code in (200, 206, 404, 416), small.status_code


def test_only_listed_files_are_served(server: Service) -> None:
    client = registry.Registry(server.url, home=server.root / "work" / "listed")
    record = client.backend.resolve(parse("seeded"))
    listed = httpx.get(f"{server.url}/hf/api/models/seeded/tree/main",
                       params={"recursive": True}).json()
    names = sorted(e["path"] for e in listed if e["type"] == "file")
    # A plain module: its weights and its model card (README.md), no attached files.
    assert names == ["README.md", "model.safetensors"]
    # A stored blob by digest, the manifest or the catalog is no file of the version.
    for other in (record.manifest["files"][0]["digest"], "manifest.json", "v1.json",
                  "model-00001-of-00001.safetensors", "model.safetensors.index.json"):
        status, headers, body = _raw(server, "GET", f"/hf/seeded/resolve/main/{other}")
        assert status == 404 and headers["x-error-code"] == "EntryNotFound", other
        assert len(body) < SHORT
    client.close()
