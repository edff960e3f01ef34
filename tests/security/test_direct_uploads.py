"""A presigned S3 upload pins neither content nor checksum: a write token can begin a push of a
digest it predicts (shards are deterministic), PUT other bytes of the right size, and commit.
The server hashes every blob that reached the store without passing through it before the
commit makes it visible; a blob that fails is deleted, never reused by an honest push."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import registry
from registry.errors import DigestMismatchError
from registry.http import transport
from tests.helpers import trained_mlp
from tests.integration.serving import Service, registry_server

pytestmark = pytest.mark.s3


@pytest.fixture
def s3_server(s3_endpoint: str, s3_store_url: str, home: Path, work: Path) -> Iterator[Service]:
    from tests.integration.conftest import DUMMY_KEY_ID, DUMMY_SECRET

    with registry_server(home / "server", work, env_extra={
            "REGISTRY_STORE_URL": s3_store_url, "REGISTRY_S3_ENDPOINT_URL": s3_endpoint,
            "AWS_ACCESS_KEY_ID": DUMMY_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}) as service:
        yield service


def test_bytes_put_at_a_presigned_url_under_a_predicted_digest_are_refused_and_deleted(
        s3_server: Service, home: Path, raw_s3: Any, s3_bucket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = trained_mlp()
    real_open = open

    def poisoned(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        size = Path(path).stat().st_size
        return io.BytesIO(os.urandom(size)) if mode == "rb" else real_open(path, mode, *args,
                                                                            **kwargs)

    attacker = registry.Registry(s3_server.url, home=home / "attacker")
    monkeypatch.setattr(transport, "open", poisoned, raising=False)
    with pytest.raises(DigestMismatchError, match="deleted"):
        attacker.push(model, "victim-model")
    monkeypatch.delattr(transport, "open")
    attacker.close()
    keys = [o["Key"] for o in raw_s3.list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert not [k for k in keys if k.startswith("team/blobs/")], keys

    honest = registry.Registry(s3_server.url, home=home / "honest")
    mv = honest.push(model, "victim-model")
    assert mv.metadata["push"]["shards_uploaded"] == 1
    pulled = honest.pull_state_dict(mv.ref, device="cpu")
    assert all(torch.equal(pulled[k], v) for k, v in model.state_dict().items())
    # A later push of the same weights reuses the checked blob without reading it again.
    assert honest.push(model, "victim-model").metadata["push"]["shards_uploaded"] == 0
    honest.close()
