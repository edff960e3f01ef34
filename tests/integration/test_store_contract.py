"""One contract, every store: the file store and the S3 store (moto over HTTP) behave alike."""

from __future__ import annotations

import hashlib
import os
import time
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from registry.errors import NotFoundError, RefError, RegistryError
from registry.store import ObjectStore, Presigning, open_store
from registry.store.file import FileStore
from registry.store.s3 import PART_SIZE, S3Store

S3_KINDS = [pytest.param("s3", marks=pytest.mark.s3), pytest.param("s3rver", marks=pytest.mark.s3)]


@pytest.fixture(params=["file", *S3_KINDS])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    return _open(request, request.param, tmp_path)


@pytest.fixture(params=S3_KINDS)
def s3_kind_store(request: pytest.FixtureRequest, tmp_path: Path) -> S3Store:
    """The stores that hand out presigned URLs: S3 on moto and on s3rver."""
    opened = _open(request, request.param, tmp_path)
    assert isinstance(opened, S3Store)
    return opened


def _open(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> ObjectStore:
    if kind == "file":
        return FileStore(tmp_path / "objects")
    if kind == "s3rver":
        endpoint = request.getfixturevalue("s3rver_endpoint")
        s3rver = S3Store.from_url(f"s3://reg-{uuid.uuid4().hex[:12]}/team",
                                  endpoint_url=endpoint)
        assert s3rver.create_bucket() is True
        return s3rver
    url = request.getfixturevalue("s3_store_url")
    return S3Store.from_url(url, endpoint_url=request.getfixturevalue("s3_endpoint"))


def _file(tmp_path: Path, size: int, name: str = "src.bin") -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


def test_store_satisfies_the_protocol(store: ObjectStore) -> None:
    assert isinstance(store, ObjectStore)
    assert store.url.startswith(("file://", "s3://"))


def test_missing_object_has_no_size(store: ObjectStore) -> None:
    assert store.has("blobs/sha256/" + "0" * 64) is None


def test_put_bytes_round_trips_and_replaces(store: ObjectStore) -> None:
    store.put_bytes("manifests/m/v1.json", b'{"a": 1}')
    assert store.has("manifests/m/v1.json") == 8
    assert store.get_bytes("manifests/m/v1.json") == b'{"a": 1}'
    store.put_bytes("manifests/m/v1.json", b"{}")
    assert store.get_bytes("manifests/m/v1.json") == b"{}"
    store.put_bytes("aliases/m.json", b"")
    assert store.has("aliases/m.json") == 0
    assert store.get_bytes("aliases/m.json") == b""


def test_put_file_copies_by_default(store: ObjectStore, tmp_path: Path) -> None:
    src = _file(tmp_path, 1000)
    store.put_file("blobs/sha256/aa", src)
    assert src.exists()
    assert store.get_bytes("blobs/sha256/aa") == src.read_bytes()


def test_put_file_move_consumes_the_source(store: ObjectStore, tmp_path: Path) -> None:
    src = _file(tmp_path, 1000)
    data = src.read_bytes()
    store.put_file("blobs/sha256/bb", src, move=True)
    assert not src.exists()
    assert store.get_bytes("blobs/sha256/bb") == data
    assert store.has("blobs/sha256/bb") == 1000


def test_large_file_round_trips_through_get_to_file(store: ObjectStore, tmp_path: Path) -> None:
    # Above the part size, so S3 uploads in concurrent parts and downloads in ranged GETs.
    src = _file(tmp_path, PART_SIZE * 2 + 12345)
    store.put_file("blobs/sha256/big", src)
    assert store.has("blobs/sha256/big") == src.stat().st_size
    target = tmp_path / "dl.tmp"
    target.touch()
    seen: list[int] = []
    reported = store.get_to_file("blobs/sha256/big", target, progress=seen.append)
    expected = hashlib.sha256(src.read_bytes()).hexdigest()
    assert hashlib.sha256(target.read_bytes()).hexdigest() == expected
    assert reported == f"sha256:{expected}", "the digest is computed as the bytes are written"
    assert sum(seen) == src.stat().st_size
    # Nothing but the target is left next to it (no stray partial files).
    assert {p.name for p in tmp_path.iterdir()} - {"objects"} == {"dl.tmp", "src.bin"}

def test_missing_object_raises_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="manifests/m/v9.json") as info:
        store.get_bytes("manifests/m/v9.json")
    assert isinstance(info.value, LookupError)
    target = tmp_path / "dl.tmp"
    target.touch()
    with pytest.raises(NotFoundError, match="blobs/sha256/nope"):
        store.get_to_file("blobs/sha256/nope", target)
    assert [p.name for p in tmp_path.iterdir() if p.name != "objects"] == ["dl.tmp"]


def test_delete_removes_and_tolerates_missing(store: ObjectStore) -> None:
    store.put_bytes("manifests/m/v1.json", b"x")
    store.delete("manifests/m/v1.json")
    assert store.has("manifests/m/v1.json") is None
    store.delete("manifests/m/v1.json")
    store.delete("blobs/sha256/never-existed")


def test_list_has_directory_semantics(store: ObjectStore) -> None:
    for key in ("manifests/m1/v1.json", "manifests/m1/v2.json", "manifests/m10/v1.json",
                "blobs/sha256/aa", "aliases/m1.json"):
        store.put_bytes(key, b"x")
    assert sorted(store.list("manifests/m1")) == ["manifests/m1/v1.json", "manifests/m1/v2.json"]
    assert sorted(store.list("manifests/")) == [
        "manifests/m1/v1.json", "manifests/m1/v2.json", "manifests/m10/v1.json"]
    assert list(store.list("blobs/")) == ["blobs/sha256/aa"]
    assert list(store.list("nothing/")) == []
    assert len(list(store.list(""))) == 5


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/.", "a\\b", "a/"])
def test_invalid_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(RefError, match="invalid store key"):
        store.put_bytes(key, b"x")
    with pytest.raises(RegistryError):
        store.has(key)


def test_uri_names_the_object(store: ObjectStore) -> None:
    uri = store.uri("blobs/sha256/aa")
    assert uri.endswith("/blobs/sha256/aa")
    assert uri.startswith(store.url)


def test_open_local_only_for_local_stores(store: ObjectStore) -> None:
    store.put_bytes("blobs/sha256/cc", b"abc")
    local = store.open_local("blobs/sha256/cc")
    if isinstance(store, S3Store):
        assert local is None
    else:
        assert local is not None and local.read_bytes() == b"abc"


def test_open_store_dispatches_on_the_url(store: ObjectStore) -> None:
    from registry.settings import Settings

    settings = Settings.from_env()
    endpoint = getattr(store, "endpoint_url", None)
    reopened = open_store(store.url, settings.with_overrides(s3_endpoint_url=endpoint))
    assert type(reopened) is type(store)
    assert reopened.url == store.url


def test_modified_is_when_written_and_touch_makes_it_now(store: ObjectStore,
                                                         tmp_path: Path) -> None:
    """gc's age rule reads ``modified``; a push that reuses a blob ``touch``es it."""
    assert store.modified("blobs/sha256/none") is None
    store.touch("blobs/sha256/none")  # a missing object stays missing
    assert store.has("blobs/sha256/none") is None
    source = tmp_path / "blob"
    source.write_bytes(b"q" * (3 * 2**20))
    before = datetime.now(timezone.utc) - timedelta(seconds=5)
    store.put_file("blobs/sha256/aged", source)
    written = store.modified("blobs/sha256/aged")
    assert written is not None and written.tzinfo is not None
    assert before <= written <= datetime.now(timezone.utc) + timedelta(seconds=5)
    time.sleep(1.1)  # S3 LastModified has one-second resolution
    store.touch("blobs/sha256/aged")
    touched = store.modified("blobs/sha256/aged")
    assert touched is not None and touched > written
    assert store.get_bytes("blobs/sha256/aged") == source.read_bytes()  # bytes unchanged


def test_presigned_urls_move_bytes_without_credentials(s3_kind_store: S3Store) -> None:
    """What the server hands its clients: a URL to PUT, then GET, one object, no keys."""
    store = s3_kind_store
    assert isinstance(store, Presigning)
    data = os.urandom(70_000)
    put = urllib.request.Request(store.presign("blobs/sha256/pre", "PUT"), data=data,
                                 method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(put, timeout=30) as response:
        assert response.status == 200
    assert store.has("blobs/sha256/pre") == len(data)
    with urllib.request.urlopen(store.presign("blobs/sha256/pre", "GET"), timeout=30) as got:
        assert got.read() == data
