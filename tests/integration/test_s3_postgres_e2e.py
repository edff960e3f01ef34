"""The team deployment end to end: weights on S3 (moto over HTTP), catalog on PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import registry
from registry.errors import DigestMismatchError, StoreUnavailableError
from registry.store.s3 import S3Store
from tests.helpers import MLP, assert_same_state, trained_mlp

from .conftest import DUMMY_KEY_ID, DUMMY_SECRET, s3_client, start_moto

pytestmark = [pytest.mark.s3, pytest.mark.postgres]


def _requests(reg: registry.Registry) -> list[str]:
    """Record every request the registry's S3 client sends from now on."""
    sent: list[str] = []
    store = reg.backend.store  # type: ignore[attr-defined]
    store.client.meta.events.register(
        "before-send.s3", lambda request, **_: sent.append(f"{request.method} {request.url}"))
    return sent


def _cache_files(home: Path) -> list[Path]:
    cache = home / "cache"
    return sorted(p for sub in ("blobs", "tmp") for p in (cache / sub).rglob("*") if p.is_file())


def test_push_pull_gc_on_s3_and_postgres(pg_url: str, s3_store_url: str, s3_bucket: str,
                                         raw_s3: Any, home: Path) -> None:
    reg = registry.Registry(catalog=pg_url, store=s3_store_url)
    try:
        first, second = trained_mlp(seed=0), trained_mlp(seed=1)
        v1 = reg.push(first, "mlp", tags={"dataset": "toy"}, aliases=["staging"],
                      factory="tests.helpers:MLP")
        v2 = reg.push(second, "mlp", factory="tests.helpers:MLP")
        keys = {o["Key"] for o in raw_s3.list_objects_v2(Bucket=s3_bucket)["Contents"]}
        assert {f"team/blobs/sha256/{v1.digest[7:]}", f"team/blobs/sha256/{v2.digest[7:]}",
                "team/manifests/mlp/v1.json", "team/manifests/mlp/v2.json"} <= keys

        # First pull downloads into the verified cache; the second reads nothing from S3.
        module = reg.pull("mlp@staging", device="cpu")
        assert isinstance(module, MLP)
        assert_same_state(module.state_dict(), first.state_dict())
        sent = _requests(reg)
        again = reg.pull_state_dict("mlp:v1", device="cpu")
        assert_same_state(again, first.state_dict())
        assert sent == []

        # gc after deleting v1 removes its blob from the bucket and from the cache, keeps v2's.
        blob_size = raw_s3.head_object(Bucket=s3_bucket,
                                       Key=f"team/blobs/sha256/{v1.digest[7:]}")["ContentLength"]
        reg.delete_version("mlp:v1", force=True)  # @staging points there
        report = reg.gc()
        assert report.deleted == [v1.digest]
        assert report.freed_bytes == blob_size
        keys = {o["Key"] for o in raw_s3.list_objects_v2(Bucket=s3_bucket)["Contents"]}
        assert f"team/blobs/sha256/{v1.digest[7:]}" not in keys
        assert f"team/blobs/sha256/{v2.digest[7:]}" in keys
        assert not (home / "cache" / "blobs" / "sha256" / v1.digest[7:]).exists()
        assert_same_state(reg.pull_state_dict("mlp"), second.state_dict())
    finally:
        reg.close()


def test_catalog_rebuilds_from_the_bucket_alone(postgres: Any, pg_url: str, s3_store_url: str,
                                                home: Path) -> None:
    reg = registry.Registry(catalog=pg_url, store=s3_store_url)
    try:
        v1 = reg.push({"w": torch.ones(4)}, "rebuilt", aliases=["prod"], tags={"k": "v"})
        reg.push({"w": torch.zeros(4)}, "rebuilt")
        reg.delete_version("rebuilt:v2")
    finally:
        reg.close()
    from registry.catalog.db import make_engine, upgrade

    fresh = postgres.create_database()
    try:
        url = postgres.url(fresh)
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        reg = registry.Registry(catalog=url, store=s3_store_url)
        try:
            assert reg.backend.rebuild() == 1
            shown = reg.show("rebuilt@prod")
            assert (shown.version, shown.digest, shown.tags) == (1, v1.digest, {"k": "v"})
            assert reg.push({"w": torch.ones(1)}, "rebuilt").version == 3  # v2 stays retired
        finally:
            reg.close()
    finally:
        postgres.drop_database(fresh)


def test_corrupt_s3_object_is_refused_and_never_cached(pg_url: str, s3_store_url: str,
                                                       s3_bucket: str, raw_s3: Any,
                                                       home: Path) -> None:
    reg = registry.Registry(catalog=pg_url, store=s3_store_url)
    try:
        mv = reg.push({"w": torch.arange(64, dtype=torch.float32)}, "fragile")
        key = f"team/blobs/sha256/{mv.digest[7:]}"
        body = bytearray(raw_s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
        body[-1] ^= 0xFF  # same size, one flipped byte: only the hash can tell
        raw_s3.put_object(Bucket=s3_bucket, Key=key, Body=bytes(body))
        with pytest.raises(DigestMismatchError, match=mv.digest):
            reg.pull_state_dict("fragile")
        assert _cache_files(home) == []
    finally:
        reg.close()


def test_stopped_endpoint_raises_unavailable_and_leaves_no_partial_file(
        pg_url: str, aws_env: None, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moto = start_moto()
    try:
        monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", moto.url)
        s3_client(moto.url).create_bucket(Bucket="outage")
        reg = registry.Registry(catalog=pg_url, store="s3://outage/m")
        mv = reg.push({"w": torch.ones(256)}, "offline")
        moto.stop()
        with pytest.raises(StoreUnavailableError) as info:
            reg.pull_state_dict(mv.ref)
        message = str(info.value)
        assert moto.url in message and "outage" in message
        assert DUMMY_KEY_ID not in message and DUMMY_SECRET not in message
        assert _cache_files(home) == []
        with pytest.raises(StoreUnavailableError):
            reg.push({"w": torch.zeros(3)}, "offline")
        assert [v.version for v in reg.list_versions("offline")] == [1]  # nothing half-made
        reg.close()
    finally:
        moto.stop()


def test_s3_store_object_can_be_handed_to_the_registry(pg_url: str, s3_store_url: str,
                                                       s3_endpoint: str, home: Path) -> None:
    store = S3Store.from_url(s3_store_url, endpoint_url=s3_endpoint)
    reg = registry.Registry(catalog=pg_url, store=store)
    try:
        mv = reg.push({"w": torch.ones(2, dtype=torch.float16)}, "handed")
        assert reg.pull_state_dict(mv.ref, dtype="float32")["w"].dtype == torch.float32
        assert "s3://" in repr(reg)
    finally:
        reg.close()


def _big_weights() -> dict[str, torch.Tensor]:
    # ~40 MiB: several ranged GETs, each of which the proxy can cut half way.
    return {"w": torch.randn(10 * 2**20)}


@pytest.mark.slow
def test_downloads_cut_half_way_are_retried(pg_url: str, s3_bucket: str, cutting_proxy: Any,
                                            home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", cutting_proxy.url)
    reg = registry.Registry(catalog=pg_url, store=f"s3://{s3_bucket}/team")
    try:
        weights = _big_weights()
        mv = reg.push(weights, "flaky")
        cutting_proxy.cut_next = 2  # two responses die mid-body, then the network recovers
        assert torch.equal(reg.pull_state_dict(mv.ref, device="cpu")["w"], weights["w"])
        assert cutting_proxy.cuts == 2
    finally:
        reg.close()


@pytest.mark.slow
def test_download_that_keeps_failing_leaves_no_partial_file(
        pg_url: str, s3_bucket: str, cutting_proxy: Any, home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", cutting_proxy.url)
    # The bound below counts s3transfer's attempts of one download; the store's own window of
    # retries (REGISTRY_STORE_RETRY_SECONDS, tests/faults/test_outage.py) would repeat them.
    monkeypatch.setenv("REGISTRY_STORE_RETRY_SECONDS", "0")
    reg = registry.Registry(catalog=pg_url, store=f"s3://{s3_bucket}/team")
    try:
        mv = reg.push(_big_weights(), "doomed")
        cutting_proxy.cut_next = -1  # every blob GET dies half way, for good
        with pytest.raises(StoreUnavailableError) as info:
            reg.pull_state_dict(mv.ref)
        assert cutting_proxy.url in str(info.value) and s3_bucket in str(info.value)
        assert 1 < cutting_proxy.cuts <= 3 * 5  # retried: 3 ranges x 5 attempts at most
        assert _cache_files(home) == []
    finally:
        reg.close()
