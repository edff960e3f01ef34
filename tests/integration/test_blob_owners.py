"""The catalog's answer to "which models own this blob" (what a server with per-model token scopes
asks before it serves or accepts a blob by digest), on SQLite and PostgreSQL alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import Registry
from registry.catalog.repository import Catalog
from registry.files import VersionFile
from registry.refs import parse
from tests.helpers import MLP, trained_mlp


def _check(catalog_url: str | None, home: Path) -> None:
    reg = Registry(catalog=catalog_url, home=home)
    try:
        a = reg.push(trained_mlp(), "team-a-x", factory=MLP)
        reg.push(trained_mlp(), "team-b-y", factory=MLP)  # the same weights: one blob, two owners
        other = reg.push(trained_mlp(1), "team-b-z", factory=MLP)
        catalog: Catalog = reg.backend.catalog  # type: ignore[attr-defined]
        shard = reg.backend.resolve(parse(a.ref)).manifest["files"][0]["digest"]
        lone = reg.backend.resolve(parse(other.ref)).manifest["files"][0]["digest"]
        absent = "sha256:" + "0" * 64
        assert catalog.blob_owners([shard, lone, absent]) == {
            shard: {"team-a-x", "team-b-y"}, lone: {"team-b-z"}, absent: set()}
        assert catalog.blob_owners([]) == {}
        # A push in progress lists its files: pending owners, not live ones.
        pending = "sha256:" + "1" * 64
        number = catalog.reserve("team-c-w", None, pending, 5,
                                 [VersionFile("weights", "model.safetensors", pending, 5)])
        assert catalog.blob_owners([pending]) == {pending: set()}
        assert catalog.blob_owners([pending], state="pending") == {pending: {"team-c-w"}}
        assert catalog.blob_owners([pending, shard], state="any") == {
            pending: {"team-c-w"}, shard: {"team-a-x", "team-b-y"}}
        catalog.abort("team-c-w", number)
        # A deleted version owns nothing any more.
        reg.delete_version("team-b-z:v1")
        assert catalog.blob_owners([lone]) == {lone: set()}
        assert catalog.model_exists("team-b-z") and catalog.model_exists("team-c-w")
        assert not catalog.model_exists("team-d")
    finally:
        reg.close()


def test_blob_owners_on_sqlite(home: Path) -> None:
    _check(None, home)


@pytest.mark.postgres
def test_blob_owners_on_postgres(pg_url: str, home: Path) -> None:
    _check(pg_url, home)
