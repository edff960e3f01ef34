"""Digests: checked before they become paths or keys; the version digest of several shards."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from registry import manifest as mf
from registry.cache import BlobCache
from registry.digests import check_digest, sha256_file, version_digest
from registry.errors import RefError

GOOD = "sha256:" + "ab" * 32


@pytest.mark.parametrize("bad", [
    "sha256:../../../../victim", "sha256:" + "AB" * 32, "sha256:" + "ab" * 31, "md5:" + "ab" * 16,
    GOOD + "\n", "", None, 7, "sha256:" + "a" * 10_000,
])
def test_malformed_digests_never_become_paths_or_keys(bad: object, tmp_path: Path) -> None:
    with pytest.raises(RefError, match="expected 'sha256:' followed by 64 lowercase hex"):
        check_digest(bad)
    with pytest.raises(RefError):
        BlobCache(tmp_path).path(bad)  # type: ignore[arg-type]
    with pytest.raises(RefError):
        mf.blob_key(bad)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_long_bad_digest_is_quoted_short() -> None:
    with pytest.raises(RefError) as info:
        check_digest("sha256:" + "z" * 5000)
    assert len(str(info.value)) < 250


def test_good_digests_pass_and_address_the_cache(tmp_path: Path) -> None:
    assert check_digest(GOOD) == GOOD
    assert BlobCache(tmp_path).path(GOOD) == tmp_path / "blobs" / "sha256" / ("ab" * 32)
    assert mf.blob_key(GOOD) == f"blobs/sha256/{'ab' * 32}"


def test_version_digest_of_one_and_several_shards(tmp_path: Path) -> None:
    other = "sha256:" + "cd" * 32
    assert version_digest([GOOD]) == GOOD
    canonical = json.dumps([GOOD, other], separators=(",", ":")).encode()
    assert version_digest([GOOD, other]) == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert version_digest([other, GOOD]) != version_digest([GOOD, other])
    with pytest.raises(RefError):
        version_digest([GOOD, "sha256:nope"])
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert sha256_file(path) == "sha256:" + hashlib.sha256(b"x" * 10).hexdigest()
