"""S3 transfers take their part size and concurrency from REGISTRY_S3_PART_SIZE and
REGISTRY_S3_CONCURRENCY (issue 15, item 2): the requests seen on the wire follow them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from registry.errors import SettingsError
from registry.settings import (
    DEFAULT_S3_CONCURRENCY,
    DEFAULT_S3_PART_SIZE,
    MIN_S3_PART_SIZE,
    Settings,
)
from registry.store import open_store
from registry.store.s3 import S3Store
from tests.integration.conftest import CuttingProxy

MiB = 2**20


def test_defaults_and_values_from_the_environment(tmp_path: Path) -> None:
    base = {"REGISTRY_HOME": str(tmp_path)}
    default = Settings.from_env(base)
    assert (default.s3_part_size, default.s3_concurrency) == (DEFAULT_S3_PART_SIZE,
                                                              DEFAULT_S3_CONCURRENCY)
    tuned = Settings.from_env({**base, "REGISTRY_S3_PART_SIZE": "64MiB",
                               "REGISTRY_S3_CONCURRENCY": "32"})
    assert (tuned.s3_part_size, tuned.s3_concurrency) == (64 * MiB, 32)
    store = open_store("s3://bucket/prefix", tuned)
    assert isinstance(store, S3Store)
    assert (store.part_size, store.concurrency) == (64 * MiB, 32)
    config = store._transfer_config()
    assert (config.multipart_chunksize, config.max_concurrency) == (64 * MiB, 32)


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("REGISTRY_S3_PART_SIZE", "1MiB", f"below the minimum of {MIN_S3_PART_SIZE} bytes"),
    ("REGISTRY_S3_PART_SIZE", "lots", "is not a size"),
    ("REGISTRY_S3_CONCURRENCY", "0", "whole number from 1 to 128"),
    ("REGISTRY_S3_CONCURRENCY", "500", "whole number from 1 to 128"),
    ("REGISTRY_S3_CONCURRENCY", "-3", "whole number from 1 to 128"),
])
def test_bad_values_are_refused_by_name(tmp_path: Path, variable: str, value: str,
                                        message: str) -> None:
    with pytest.raises(SettingsError, match=message) as caught:
        Settings.from_env({"REGISTRY_HOME": str(tmp_path), variable: value})
    assert variable in str(caught.value) and value in str(caught.value)


@pytest.mark.s3
def test_the_part_size_shapes_the_requests(cutting_proxy: CuttingProxy, aws_env: None,
                                           s3_bucket: str, tmp_path: Path) -> None:
    proxy = cutting_proxy
    settings = Settings.from_env({
        **os.environ, "REGISTRY_HOME": str(tmp_path / "home"),
        "REGISTRY_S3_ENDPOINT_URL": proxy.url, "REGISTRY_S3_PART_SIZE": "5MiB",
        "REGISTRY_S3_CONCURRENCY": "2"})
    store = open_store(f"s3://{s3_bucket}/team", settings)
    data = os.urandom(12 * MiB + 123)
    src = tmp_path / "src"
    src.write_bytes(data)
    store.put_file("blobs/sha256/big", src)
    parts = [r for r in proxy.blob_requests(b"PUT") if b"partNumber=" in r]
    assert len(parts) == 3, proxy.requests  # 5 + 5 + 2 MiB
    proxy.requests.clear()
    digest = store.get_to_file("blobs/sha256/big", tmp_path / "dl")
    gets = proxy.blob_requests(b"GET")
    assert len(gets) == 3, proxy.requests  # three ranged GETs
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert (tmp_path / "dl").read_bytes() == data
