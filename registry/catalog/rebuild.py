"""Writing catalog rows from what the store holds: the file rows of a version, and the whole
catalog again from the store's manifests (``registry db rebuild``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..files import VersionFile, version_files
from .models import DELETED, READY, TRASHED, AliasRow, ModelRow, VersionFileRow, VersionRow


def add_version_files(s: Session, version_id: int, files: Iterable[VersionFile]) -> None:
    """One row per blob the version owns (weights shards, attached files)."""
    for f in files:
        s.add(VersionFileRow(version_id=version_id, role=f.role, name=f.name, digest=f.digest,
                             size=f.size))


def restore(s: Session, manifests: Iterable[dict[str, Any]], retired: Iterable[tuple[str, int]],
            aliases: dict[str, dict[str, int]],
            governance: dict[str, dict[str, Any]] | None = None) -> int:
    """Replace every model, version, file and alias row with what ``manifests`` say.

    ``retired`` are the (name, version) pairs of deleted versions, kept as tombstones so their
    numbers are never reused; an alias whose version is not live is dropped. ``governance``
    (by model name, as ``publish.stored_governance`` reads it) puts versions back in the trash
    and restores holds, protected aliases and retention policies. Returns how many live
    versions were restored.
    """
    now = datetime.now(timezone.utc)
    s.execute(delete(AliasRow))
    s.execute(delete(VersionFileRow))
    s.execute(delete(VersionRow))
    s.execute(delete(ModelRow))
    models: dict[str, ModelRow] = {}

    def model_row(name: str) -> ModelRow:
        if name not in models:
            models[name] = ModelRow(name=name, last_version=0, created_at=now)
            s.add(models[name])
            s.flush()
        return models[name]

    count = 0
    for manifest in manifests:
        model = model_row(manifest["name"])
        model.last_version = max(model.last_version, manifest["version"])
        row = VersionRow(
            model_id=model.id, version=manifest["version"], state=READY,
            digest=manifest["digest"], size_bytes=manifest["source"]["size_bytes"],
            manifest=json.dumps(manifest, sort_keys=True),
            tags=json.dumps(manifest.get("tags") or {}, sort_keys=True),
            created_at=datetime.fromisoformat(manifest["created_at"]))
        s.add(row)
        s.flush()
        add_version_files(s, row.id, version_files(manifest))
        count += 1
    s.flush()
    for name, version in retired:
        model = model_row(name)
        model.last_version = max(model.last_version, version)
        s.add(VersionRow(model_id=model.id, version=version, state=DELETED, digest="",
                         size_bytes=0, tags="{}", created_at=now, deleted_at=now))
    s.flush()
    for name, table in aliases.items():
        if name not in models:
            continue
        for alias, version in table.items():
            live = s.scalar(select(VersionRow.id).where(
                VersionRow.model_id == models[name].id, VersionRow.version == version,
                VersionRow.state == READY))
            if live is not None:
                protected = alias in (governance or {}).get(name, {}).get("protected", ())
                s.add(AliasRow(model_id=models[name].id, alias=alias, version=version,
                               updated_at=now, protected=protected))
    s.flush()
    for name, facts in (governance or {}).items():
        if name not in models:
            continue
        model = models[name]
        if facts.get("retention") is not None:
            model.retention = json.dumps(facts["retention"])
        rows = {r.version: r for r in s.scalars(select(VersionRow).where(
            VersionRow.model_id == model.id, VersionRow.state == READY)).all()}
        for version, at in facts.get("trashed", {}).items():
            if version in rows:
                count -= 1  # restored, but into the trash
                rows[version].state = TRASHED
                rows[version].deleted_at = datetime.fromisoformat(at)
        for version, hold in facts.get("holds", {}).items():
            if int(version) in rows:
                rows[int(version)].hold = json.dumps(hold)
    return count
