"""Bounds: version numbers stop at 2**31-1 on every database, with the same error; and the
outside-the-home sentinel itself can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import registry
from registry.errors import RefError, VersionExistsError
from registry.refs import MAX_VERSION

from .outside import Outside


def _exhaust(reg: registry.Registry) -> None:
    weights = {"w": torch.ones(2)}
    assert reg.push(weights, f"m:v{MAX_VERSION}").version == MAX_VERSION
    with pytest.raises(VersionExistsError, match=f"every version number up to v{MAX_VERSION}"):
        reg.push(weights, "m")
    with pytest.raises(RefError, match="versions run from 1 to"):
        reg.push(weights, f"m:v{MAX_VERSION + 1}")
    with pytest.raises(RefError):
        reg.backend.catalog.reserve("m", MAX_VERSION + 1, "sha256:" + "0" * 64, 0, [])  # type: ignore[attr-defined]
    # Nothing half-made: the one version is reachable by every ref form.
    assert [v.version for v in reg.list_versions("m")] == [MAX_VERSION]
    assert reg.show("m").version == reg.show(f"m:v{MAX_VERSION}").version == MAX_VERSION


def test_versions_stop_at_2_31_minus_1_on_sqlite(reg: registry.Registry) -> None:
    _exhaust(reg)


@pytest.mark.postgres
def test_versions_stop_at_2_31_minus_1_on_postgres(pg_url: str, home: Path) -> None:
    reg = registry.Registry(home=home, catalog=pg_url)
    try:
        _exhaust(reg)
    finally:
        reg.close()


def test_the_sentinel_sees_a_change_outside_the_home(tmp_path: Path) -> None:
    """The guard every test here runs under must be able to fail: change, create and remove a
    path outside a (separate) watched root, and each is reported."""
    root = tmp_path / "work" / "watched"
    root.mkdir(parents=True)
    watched = Outside()
    watched.watch(root, {"home"})
    before = watched.snapshot()
    (root / "home").mkdir()
    (root / "home" / "inside").write_text("allowed")
    assert watched.check(before) == []
    (root / "victim").write_bytes(b"changed")
    (root / "outside" / "new").write_text("created")
    (root / "outside" / "secret.txt").unlink()
    found = "\n".join(watched.check(before))
    assert "changed victim" in found and "created outside/new" in found
    assert "removed outside/secret.txt" in found
