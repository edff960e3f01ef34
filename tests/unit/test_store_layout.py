"""The store's keys are an on-disk format: each is spelled exactly as every release wrote it,
and each parser reads back exactly what its writer wrote (and nothing a stray object could be)."""

from __future__ import annotations

import pytest

from registry.errors import CheckpointError
from registry.store import layout

HEX = "ab" * 32
DIGEST = f"sha256:{HEX}"


def test_every_key_is_spelled_as_stores_already_hold_it() -> None:
    assert layout.blob_key(DIGEST) == f"blobs/sha256/{HEX}"
    assert layout.manifest_key("m", 3) == "manifests/m/v3.json"
    assert layout.tombstone_key("m", 3) == "manifests/m/v3.deleted"
    assert layout.exports_key("m", 3) == "manifests/m/v3.exports.json"
    assert layout.signatures_key("m", 3) == "manifests/m/v3.signatures.json"
    assert layout.aliases_key("m") == "aliases/m.json"
    assert layout.checked_key(DIGEST) == f"checked/sha256/{HEX}"
    assert layout.pending_export_key(DIGEST) == f"exports-pending/sha256/{HEX}"
    assert layout.proved_key(DIGEST) == f"proved/sha256/{HEX}"
    assert layout.touched_key(f"blobs/sha256/{HEX}") == f"touched/sha256/{HEX}"


@pytest.mark.parametrize(("key", "suffix"), [
    (layout.manifest_key("org.m-1", 12), layout.MANIFEST),
    (layout.tombstone_key("org.m-1", 12), layout.TOMBSTONE),
    (layout.exports_key("org.m-1", 12), layout.EXPORTS),
    (layout.signatures_key("org.m-1", 12), layout.SIGNATURES),
])
def test_a_version_key_reads_back_as_what_wrote_it(key: str, suffix: str) -> None:
    assert layout.parse_manifest_key(key) == ("org.m-1", 12, suffix)


def test_blob_and_alias_keys_read_back() -> None:
    key = layout.blob_key(DIGEST)
    assert layout.parse_blob_key(key) == DIGEST
    assert layout.blob_digest(key) == DIGEST
    assert layout.parse_aliases_key(layout.aliases_key("m")) == "m"


@pytest.mark.parametrize("key", ["manifests/../../evil/v1.json", "manifests/m/v0.json",
                                 "manifests/m/v1", "manifests/M/v1.json", 7,
                                 "manifests/m/v1.json" + "x" * 1100])
def test_a_key_no_writer_makes_names_no_version(key: object) -> None:
    with pytest.raises(CheckpointError, match="db rebuild"):
        layout.parse_manifest_key(key)


@pytest.mark.parametrize("key", ["aliases/../x.json", "aliases/m.yaml", "aliases/m/n.json"])
def test_a_key_no_writer_makes_names_no_alias_table(key: str) -> None:
    with pytest.raises(CheckpointError, match="aliases/<name>.json"):
        layout.parse_aliases_key(key)


@pytest.mark.parametrize("key", ["blobs/sha256/xyz", "blobs/md5/" + HEX, "blobs/sha256/a/b",
                                 "manifests/m/v1.json"])
def test_anything_but_a_blob_key_names_no_blob(key: str) -> None:
    assert layout.parse_blob_key(key) is None
