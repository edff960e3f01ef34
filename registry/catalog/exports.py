"""Catalog rows of exports (``registry_exports``, mixed into
:class:`registry.catalog.repository.Catalog`): a version's ONNX / pt2 / TorchScript artifacts
with their parameters, found again by the key of those parameters. The exports' storage
(registry/exports/local.py) calls these as methods of the catalog it was given, so building it
loads no sqlalchemy (a client of a registry server never needs it)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..errors import ManifestError
from ..events import current_actor
from ..trust import boundedjson
from .events import append_event
from .models import READY, ExportRow, ModelRow, VersionRow, live_version_id


class ExportRows:
    """Catalog methods of the export rows."""

    session: Callable[[], AbstractContextManager[Session]]
    version_row: Callable[[Session, str, int], VersionRow]

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]:
        """The export records of ``name:vN``, oldest first (NotFoundError if there is no such
        version)."""
        with self.session() as s:
            version_id = self.version_row(s, name, version).id
            rows = s.scalars(select(ExportRow).where(ExportRow.version_id == version_id)
                             .order_by(ExportRow.id)).all()
            return [_record(r.record, name, version) for r in rows]

    def add_export(self, name: str, version: int,
                   record: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Record an export of ``name:vN``: (the record kept, whether it is this one). When one
        with the same key exists (two processes exported the same thing at once) it stays."""
        try:
            with self.session() as s:
                version_id = self.version_row(s, name, version).id
                existing = s.scalar(select(ExportRow).where(ExportRow.version_id == version_id,
                                                            ExportRow.key == record["key"]))
                if existing is not None:
                    return dict(json.loads(existing.record)), False
                s.add(_row(version_id, record))
                append_event(s, kind="export.added", name=name, version=version,
                             actor=current_actor(),
                             details={"format": record["format"], "key": record["key"],
                                      "digest": record["digest"]})
                return dict(record), True
        except IntegrityError:  # a concurrent insert of the same key won
            with self.session() as s:
                version_id = self.version_row(s, name, version).id
                row = s.scalar(select(ExportRow).where(ExportRow.version_id == version_id,
                                                       ExportRow.key == record["key"]))
                if row is None:
                    raise
                return dict(json.loads(row.record)), False

    def remove_export(self, name: str, version: int, key: str) -> None:
        """Forget one export of ``name:vN`` (its blob could not be stored)."""
        with self.session() as s:
            s.execute(delete(ExportRow).where(ExportRow.version_id.in_(_ids(name, version)),
                                              ExportRow.key == key))

    def drop_exports(self, name: str, version: int) -> None:
        """Forget every export of ``name:vN`` (its version was deleted)."""
        with self.session() as s:
            s.execute(delete(ExportRow).where(ExportRow.version_id.in_(_ids(name, version))))

    def export_digests(self) -> set[str]:
        """Blobs that exports of live versions reference (gc keeps them)."""
        with self.session() as s:
            rows = s.execute(select(ExportRow.digest)
                             .join(VersionRow, VersionRow.id == ExportRow.version_id)
                             .where(VersionRow.state == READY)).all()
            return {r[0] for r in rows}

    def restore_exports(self,
                        exports: Iterable[tuple[str, int, list[dict[str, Any]]]]) -> int:
        """Replace every export row with ``(name, version, records)`` read from the store
        (``registry db rebuild``); records of versions that are not live are skipped."""
        count = 0
        with self.session() as s:
            s.execute(delete(ExportRow))
            for name, version, records in exports:
                version_id = live_version_id(s, name, version)
                if version_id is None:
                    continue
                seen: set[str] = set()
                for record in records:
                    if record["key"] not in seen:
                        seen.add(record["key"])
                        s.add(_row(version_id, record))
                        count += 1
        return count


def _ids(name: str, version: int) -> Any:
    """The row ids of ``name:vN`` in any state, as a subquery."""
    return select(VersionRow.id).join(ModelRow, ModelRow.id == VersionRow.model_id).where(
        ModelRow.name == name, VersionRow.version == version)


def _record(text: str, name: str, version: int) -> Any:
    try:
        return boundedjson.loads(text)
    except ValueError:
        raise ManifestError(f"an export row of {name}:v{version} in the catalog is not valid "
                            "JSON; remove it (or delete the version's exports) and export "
                            "again") from None


def _row(version_id: int, record: Mapping[str, Any]) -> ExportRow:
    created = record.get("created_at") or ""
    try:
        moment = datetime.fromisoformat(created)
    except ValueError:
        moment = datetime.now(timezone.utc)
    return ExportRow(version_id=version_id, format=record["format"], key=record["key"],
                     digest=record["digest"], size=int(record["size"]),
                     record=json.dumps(dict(record), sort_keys=True), created_at=moment)
