"""An S3 object is whatever a writer of the bucket put there: the embedded S3 pull (ranged GETs)
and the server's check of a presigned upload read no more than the manifest's size. An object
of another size is refused before a byte of it is read (no GetObject at all); one that grows
after the size check is cut off at the size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import registry
from registry import manifest as mf
from registry.direct_uploads import verify_blob
from registry.errors import DigestMismatchError
from registry.files import VersionFile, weight_files
from registry.refs import parse
from registry.store.s3 import S3Store
from tests.helpers import trained_mlp

pytestmark = pytest.mark.s3


def _gets(store: S3Store) -> list[dict[str, Any]]:
    """Every GetObject the store's client makes from now on, with its parameters."""
    calls: list[dict[str, Any]] = []
    store.client.meta.events.register(
        "before-call.s3.GetObject", lambda params, **_kw: calls.append(dict(params)))
    return calls


def _shard(reg: registry.Registry, ref: str) -> VersionFile:
    (shard,) = weight_files(reg.backend.resolve(parse(ref)).manifest)  # type: ignore[attr-defined]
    return shard


def _grow(raw_s3: Any, bucket: str, key: str, extra: int) -> bytes:
    data = raw_s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    raw_s3.put_object(Bucket=bucket, Key=key, Body=data + b"\0" * extra)
    return bytes(data)


def test_an_object_larger_than_its_manifest_is_refused_before_it_is_read(
        s3_endpoint: str, s3_store_url: str, s3_bucket: str, raw_s3: Any, home: Path) -> None:
    reg = registry.Registry(store=s3_store_url)
    reg.push(trained_mlp(), "m")
    shard = _shard(reg, "m")
    size = shard.size
    _grow(raw_s3, s3_bucket, f"team/{mf.blob_key(shard.digest)}", 8 * 2**20)
    fresh = registry.Registry(home=home / "fresh", catalog=reg.settings.catalog_url,
                              store=s3_store_url)  # the same catalog, an empty cache
    gets = _gets(fresh.backend.store)  # type: ignore[attr-defined]
    with pytest.raises(DigestMismatchError, match=f"holds {size + 8 * 2**20} bytes where its "
                                                  f"manifest lists {size}"):
        fresh.pull_state_dict("m", device="cpu")
    assert gets == [], "the object was read"
    reg.close()
    fresh.close()


def test_an_object_that_grew_after_the_size_check_is_cut_off_at_the_size(
        s3_endpoint: str, s3_store_url: str, s3_bucket: str, raw_s3: Any, home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    reg = registry.Registry(store=s3_store_url)
    reg.push(trained_mlp(), "m")
    shard = _shard(reg, "m")
    key = mf.blob_key(shard.digest)
    true = _grow(raw_s3, s3_bucket, f"team/{key}", 8 * 2**20)
    store: S3Store = reg.backend.store  # type: ignore[attr-defined]
    monkeypatch.setattr(store, "has", lambda _key: len(true))  # the HEAD saw the old size
    gets = _gets(store)
    target = home / "dl"
    try:
        digest = store.get_to_file(key, target, size=len(true))
    except DigestMismatchError as exc:  # the whole object was sent: refused at the size
        assert "sent more than" in str(exc)
    else:  # only the size was asked for: exactly the true bytes
        assert digest == shard.digest and target.read_bytes() == true
    assert gets  # it was read, and never kept past the size
    assert not target.exists() or target.stat().st_size <= len(true)
    reg.close()


def test_a_presigned_upload_of_another_size_is_deleted_unread(
        s3_endpoint: str, s3_store_url: str, s3_bucket: str, raw_s3: Any, tmp_path: Path) -> None:
    store = S3Store.from_url(s3_store_url, s3_endpoint)
    digest = "sha256:" + "ab" * 32
    key = mf.blob_key(digest)
    raw_s3.put_object(Bucket=s3_bucket, Key=f"team/{key}", Body=b"x" * (4 * 2**20))
    gets = _gets(store)
    with pytest.raises(DigestMismatchError, match="its push reserved 100"):
        verify_blob(store, digest, 100, tmp_path)
    assert gets == [] and store.has(key) is None
