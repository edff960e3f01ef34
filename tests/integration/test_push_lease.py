"""Pushes in progress hold their reservation by a lease (registry/catalog/leases.py): a push
that was killed is released by the next push of the model once REGISTRY_PUSH_LEASE has passed
since its last sign of life, without waiting for a gc; a push still uploading renews it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

import registry
from registry.catalog.models import ModelRow, VersionRow
from registry.files import VersionFile
from tests.helpers import trained_mlp

_DEAD = VersionFile("weights", "model.safetensors", "sha256:" + "ab" * 32, 10)


def _silent_for(backend: Any, name: str, version: int, minutes: float) -> None:
    """Move the lease of ``name:vN`` back, as if its push had been silent that long."""
    then = datetime.now(timezone.utc) - timedelta(minutes=minutes)
    with backend.catalog.engine.begin() as conn:
        model_id = conn.scalar(ModelRow.__table__.select().with_only_columns(ModelRow.id)
                               .where(ModelRow.name == name))
        conn.execute(update(VersionRow).where(VersionRow.model_id == model_id,
                                              VersionRow.version == version)
                     .values(created_at=then))


@pytest.fixture
def reg(home: Path, monkeypatch: pytest.MonkeyPatch) -> registry.Registry:
    monkeypatch.setenv("REGISTRY_GC_GRACE", "6h")  # no gc releases anything here
    return registry.Registry(home=home)


def test_a_killed_push_is_released_by_the_next_push_once_its_lease_expired(
        reg: registry.Registry) -> None:
    reg.push(trained_mlp(), "leased")
    backend: Any = reg.backend
    number, _ = backend.begin_push("leased", None, [_DEAD])  # ... and then the process died
    assert backend.catalog.pending_upload(_DEAD.digest) == 10
    _silent_for(backend, "leased", number, minutes=14)  # the default lease is 15m
    reg.push(trained_mlp(1), "leased")
    assert backend.catalog.reservation("leased", number) is not None  # still leased
    _silent_for(backend, "leased", number, minutes=16)
    v = reg.push(trained_mlp(2), "leased")
    assert backend.catalog.reservation("leased", number) is None
    assert backend.catalog.pending_upload(_DEAD.digest) is None  # no upload accepted for it
    assert v.version == number + 2  # its number stays retired


def test_a_push_that_shows_signs_of_life_keeps_its_lease(reg: registry.Registry) -> None:
    reg.push(trained_mlp(), "alive")
    backend: Any = reg.backend
    number, _ = backend.begin_push("alive", None, [_DEAD])
    _silent_for(backend, "alive", number, minutes=16)
    assert backend.expect_upload(_DEAD.digest) == 10  # a server receiving its blob renews it
    reg.push(trained_mlp(1), "alive")
    assert backend.catalog.reservation("alive", number) is not None


def test_the_lease_is_a_setting(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_PUSH_LEASE", "30s")
    assert registry.Registry(home=home).backend.lease == timedelta(seconds=30)  # type: ignore[attr-defined]
    monkeypatch.setenv("REGISTRY_PUSH_LEASE", "soon")
    with pytest.raises(registry.SettingsError, match="REGISTRY_PUSH_LEASE"):
        registry.Registry(home=home)
