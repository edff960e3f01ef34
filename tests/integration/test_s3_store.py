"""What only the S3 store does: URL parsing, client configuration, transfers, errors, store init."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import registry
from registry.errors import NotFoundError, SettingsError, StoreUnavailableError
from registry.store.s3 import CONCURRENCY, PART_SIZE, S3Store
from tests.helpers import clean_env, run_cli

from .conftest import DUMMY_KEY_ID, DUMMY_SECRET, start_moto

pytestmark = pytest.mark.s3


class Requests:
    """Every HTTP request the store's boto3 client sends, as (method, path, headers)."""

    def __init__(self, store: S3Store) -> None:
        self.sent: list[tuple[str, str, dict[str, str]]] = []
        store.client.meta.events.register("before-send.s3", self._record)

    def _record(self, request: Any, **_kwargs: Any) -> None:
        from urllib.parse import urlsplit

        self.sent.append((request.method, urlsplit(request.url).path, dict(request.headers)))

    def count(self, method: str, contains: str = "") -> int:
        return sum(1 for m, path, _ in self.sent if m == method and contains in path)


# -- URLs and configuration ---------------------------------------------------------------

@pytest.mark.parametrize("url, bucket, prefix", [
    ("s3://models", "models", ""),
    ("s3://models/", "models", ""),
    ("s3://models/team/vision", "models", "team/vision"),
    ("s3://my.bucket-1/p/", "my.bucket-1", "p"),
])
def test_from_url_parses_bucket_and_prefix(url: str, bucket: str, prefix: str) -> None:
    store = S3Store.from_url(url)
    assert (store.bucket, store.prefix) == (bucket, prefix)
    assert store.uri("blobs/sha256/ab") == "s3://" + "/".join(
        p for p in (bucket, prefix, "blobs/sha256/ab") if p)


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3://UpperCase/p", "s3://ab",
                                 "s3://under_score", "s3://b..b/x", "s3://bucket/a//b",
                                 "s3://bucket/a/../b", "s3://bucket/p?versionId=1"])
def test_from_url_refuses_bad_urls_naming_them(url: str) -> None:
    with pytest.raises(SettingsError) as info:
        S3Store.from_url(url)
    assert repr(url) in str(info.value)


def test_endpoint_must_be_http() -> None:
    with pytest.raises(SettingsError, match="REGISTRY_S3_ENDPOINT_URL"):
        S3Store.from_url("s3://bucket", endpoint_url="localhost:9000")


def test_importing_registry_does_not_import_boto3() -> None:
    import subprocess
    import sys

    code = "import sys, registry; print('boto3' in sys.modules, 'botocore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]


def test_client_uses_path_style_standard_retries_and_default_region(s3_endpoint: str) -> None:
    store = S3Store.from_url("s3://bucket/p", endpoint_url=s3_endpoint)
    config = store.client.meta.config
    assert config.s3["addressing_style"] == "path"
    assert config.retries["mode"] == "standard"
    assert 1 < config.retries["total_max_attempts"] <= 5
    assert store.client.meta.region_name == "us-east-1"
    assert config.max_pool_connections >= CONCURRENCY


def test_region_comes_from_the_environment(s3_endpoint: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    store = S3Store.from_url("s3://bucket/p", endpoint_url=s3_endpoint)
    assert store.client.meta.region_name == "eu-west-3"


def test_settings_pick_up_the_standard_endpoint_variable(
        moto_server: Any, aws_env: None, s3_bucket: str, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.delenv("REGISTRY_S3_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_server.url)
    reg = registry.Registry(store=f"s3://{s3_bucket}/std")
    try:
        mv = reg.push({"w": torch.ones(3)}, "std")
        assert reg.pull_state_dict(mv.ref)["w"].tolist() == [1.0, 1.0, 1.0]
    finally:
        reg.close()


# -- transfers ----------------------------------------------------------------------------

def test_large_upload_is_multipart_and_download_is_ranged(
        s3_endpoint: str, s3_store_url: str, tmp_path: Path) -> None:
    store = S3Store.from_url(s3_store_url, endpoint_url=s3_endpoint)
    requests = Requests(store)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(PART_SIZE * 3))
    store.put_file("blobs/sha256/big", src)
    assert requests.count("PUT", "/blobs/sha256/big") == 3  # three UploadPart calls
    assert requests.count("POST", "/blobs/sha256/big") == 2  # create + complete

    requests.sent.clear()
    target = tmp_path / "out.tmp"
    target.touch()
    store.get_to_file("blobs/sha256/big", target)
    ranges = sorted(h.get("Range", b"").decode() if isinstance(h.get("Range"), bytes)
                    else str(h.get("Range", "")) for m, _, h in requests.sent if m == "GET")
    assert len(ranges) == 3 and all(r.startswith("bytes=") for r in ranges)
    assert target.read_bytes() == src.read_bytes()


def test_push_skips_upload_of_a_blob_the_store_already_has(
        s3_endpoint: str, s3_store_url: str) -> None:
    store = S3Store.from_url(s3_store_url, endpoint_url=s3_endpoint)
    requests = Requests(store)
    reg = registry.Registry(store=store)
    try:
        weights = {"w": torch.arange(1000, dtype=torch.float32)}
        first = reg.push(weights, "dedup")
        blob_puts = requests.count("PUT", "/blobs/")
        assert blob_puts == 1
        second = reg.push(weights, "dedup-other-name")
        assert first.digest == second.digest
        assert requests.count("PUT", "/blobs/") == blob_puts  # not uploaded again
        assert [k for k in store.list("blobs/")] == [f"blobs/sha256/{first.digest[7:]}"]
    finally:
        reg.close()


# -- errors -------------------------------------------------------------------------------

def test_missing_bucket_says_to_run_store_init(s3_endpoint: str, tmp_path: Path) -> None:
    store = S3Store.from_url("s3://no-such-bucket-here/p", endpoint_url=s3_endpoint)
    for call in (lambda: store.has("blobs/sha256/aa"),
                 lambda: store.get_bytes("manifests/m/v1.json"),
                 lambda: store.put_bytes("manifests/m/v1.json", b"{}"),
                 lambda: list(store.list("blobs/"))):
        with pytest.raises(StoreUnavailableError) as info:
            call()
        message = str(info.value)
        assert "no-such-bucket-here" in message
        assert "registry store init" in message
        assert s3_endpoint in message
        assert DUMMY_SECRET not in message and DUMMY_KEY_ID not in message


def test_missing_object_in_existing_bucket_is_not_found(
        s3_endpoint: str, s3_store_url: str) -> None:
    store = S3Store.from_url(s3_store_url, endpoint_url=s3_endpoint)
    with pytest.raises(NotFoundError, match="manifests/x/v1.json"):
        store.get_bytes("manifests/x/v1.json")


def test_stopped_endpoint_is_unavailable_naming_endpoint_and_bucket(
        aws_env: None, tmp_path: Path) -> None:
    moto = start_moto()
    store = S3Store.from_url("s3://outage-bucket/p", endpoint_url=moto.url)
    assert store.create_bucket() is True
    store.put_bytes("manifests/m/v1.json", b"{}")
    moto.stop()
    with pytest.raises(StoreUnavailableError) as info:
        store.get_bytes("manifests/m/v1.json")
    message = str(info.value)
    assert moto.url in message and "outage-bucket" in message
    assert DUMMY_SECRET not in message and DUMMY_KEY_ID not in message
    assert isinstance(info.value, ConnectionError)
    target = tmp_path / "dl.tmp"
    target.touch()
    with pytest.raises(StoreUnavailableError):
        store.get_to_file("blobs/sha256/aa", target)
    assert [p.name for p in tmp_path.iterdir()] == ["dl.tmp"]


def test_wrong_credentials_are_refused_without_echoing_them(
        s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # moto accepts any key by default; the missing-credentials path is what we can check here.
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = S3Store.from_url(f"s3://{s3_bucket}/p", endpoint_url=s3_endpoint)
    with pytest.raises(StoreUnavailableError, match="AWS_ACCESS_KEY_ID"):
        store.put_bytes("manifests/m/v1.json", b"{}")


# -- registry store init ------------------------------------------------------------------

@pytest.mark.slow
def test_store_init_creates_the_bucket_through_the_cli(
        s3_endpoint: str, raw_s3: Any, tmp_path: Path) -> None:
    env = clean_env(tmp_path / "home", REGISTRY_STORE_URL="s3://fresh-bucket-init/models",
                    REGISTRY_S3_ENDPOINT_URL=s3_endpoint)
    before = run_cli("push", "m", str(_checkpoint(tmp_path)), env=env)
    assert before.returncode != 0
    assert before.stderr.count("\n") == 1 and "registry store init" in before.stderr
    assert DUMMY_SECRET not in before.stderr

    first = run_cli("store", "init", env=env, check=True)
    assert "created" in first.stdout
    assert "fresh-bucket-init" in {b["Name"] for b in raw_s3.list_buckets()["Buckets"]}

    pushed = run_cli("push", "m", str(_checkpoint(tmp_path)), env=env, check=True)
    # The failed push asked the store before reserving a number, so it spent none.
    assert "pushed m:v1 " in pushed.stdout
    keys = [o["Key"] for o in raw_s3.list_objects_v2(Bucket="fresh-bucket-init")["Contents"]]
    assert any(k.startswith("models/blobs/sha256/") for k in keys)
    assert "models/manifests/m/v1.json" in keys


def test_create_bucket_is_idempotent(s3_endpoint: str, raw_s3: Any) -> None:
    store = S3Store.from_url("s3://made-twice/p", endpoint_url=s3_endpoint)
    assert store.create_bucket() is True
    assert store.create_bucket() is False
    assert "made-twice" in {b["Name"] for b in raw_s3.list_buckets()["Buckets"]}


def test_store_init_on_a_file_store_needs_nothing(tmp_path: Path) -> None:
    result = run_cli("store", "init", env=clean_env(tmp_path / "home"), check=True)
    assert "local directory" in result.stdout


def _checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "w.pt"
    torch.save({"w": torch.ones(4)}, path)
    return path


def test_presigned_urls_move_bytes_without_credentials(s3_endpoint: str,
                                                       s3_store_url: str) -> None:
    import urllib.request

    store = S3Store.from_url(s3_store_url, endpoint_url=s3_endpoint)
    data = os.urandom(4096)
    put = urllib.request.Request(store.presign("blobs/sha256/pre", "PUT"), data=data,
                                 method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(put) as response:
        assert response.status == 200
    assert store.get_bytes("blobs/sha256/pre") == data
    url = store.presign("blobs/sha256/pre", "GET")
    assert url.startswith(s3_endpoint) and DUMMY_SECRET not in url
    with urllib.request.urlopen(url) as response:
        assert response.read() == data
    with pytest.raises(ValueError, match="DELETE"):
        store.presign("blobs/sha256/pre", "DELETE")
