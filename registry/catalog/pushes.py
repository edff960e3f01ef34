"""Pushes in progress and the pushes their idempotency keys name (mixed into
:class:`registry.catalog.repository.Catalog`).

A reservation (a ``pending`` version row, held by its lease: catalog/leases.py) lists the blobs
the push will own, which a server accepts uploads of and checks the commit against. It records
its push's key (``registry_versions.push_key``, unique per model). A begin with a key the model
already holds is the same push retried: it gets that push's version back, still reserved or
already committed, provided it lists the very same files (and claims the same number, if it
claims one); anything else is :class:`PushKeyConflictError`, as is the key of a version deleted
since. These run in the begin's transaction, under the model's row lock, so two begins with one
key cannot both reserve.

The key comes from the client: one per ``push()`` call (or the caller's ``idempotency_key``),
sent with the begin and every try of the commit as the ``Idempotency-Key`` header (a header, so
servers and clients that know nothing of keys keep working: ``registry.http.wire``). Versions pushed
without one, or restored by ``db rebuild``, have none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import PushKeyConflictError
from ..files import VersionFile
from .models import DELETED, PENDING, READY, TRASHED, ModelRow, VersionFileRow, VersionRow
from .records import VersionRecord


@dataclass(frozen=True)
class Reservation:
    """A push in progress: the version's weights digest, total size, and every blob it owns."""

    digest: str
    size_bytes: int
    files: list[VersionFile]


class Pushes:
    """Catalog methods that find a push in progress, or the push an idempotency key names."""

    session: Callable[[], AbstractContextManager[Session]]
    _record: Callable[..., VersionRecord]

    def keyed(self, s: Session, model: ModelRow, key: str | None, files: Sequence[VersionFile],
              version: int | None, committed: list[VersionRecord] | None) -> int | None:
        """In a reservation's session ``s``: the number of the push with ``key`` (None: no
        such push), its lease renewed while it is in progress, its record added to
        ``committed`` once it is committed; :meth:`keyed_row` refuses another push."""
        row = self.keyed_row(s, model, key, files, version)
        if row is None:
            return None
        if row.state == PENDING:
            row.created_at = datetime.now(timezone.utc)  # a sign of life: the lease holds
        elif committed is not None:
            committed.append(self._record(s, model, row))
        return row.version

    def keyed_row(self, s: Session, model: ModelRow, key: str | None,
                  files: Sequence[VersionFile], version: int | None) -> VersionRow | None:
        """In session ``s``: the version row the push with ``key`` reserved, if any (None for
        no key); refused if this begin is not that push (other files, another claimed number,
        deleted since)."""
        if key is None:
            return None
        row = s.scalar(select(VersionRow).where(VersionRow.model_id == model.id,
                                                VersionRow.push_key == key))
        if row is None:
            return None
        origin = f"{model.name}:v{row.version}"
        if row.state in (DELETED, TRASHED):
            raise PushKeyConflictError(
                f"idempotency key {key!r} is the push of {origin}, which was deleted since; "
                "push with a new key (or none) to make a new version")
        listed = {(f.role, f.name, f.digest, int(f.size)) for f in s.scalars(
            select(VersionFileRow).where(VersionFileRow.version_id == row.id))}
        asked = {(f.role, f.name, f.digest, int(f.size)) for f in files}
        if listed != asked or (version is not None and version != row.version):
            raise PushKeyConflictError(
                f"idempotency key {key!r} is the push of {origin}, with other files"
                + (f" (this push claims v{version})" if version not in (None, row.version)
                   else "") + "; a key names one push: use a new key for another push")
        return row

    def reservation(self, name: str, version: int) -> Reservation | None:
        """The push in progress for ``name:vN``, or None if there is none."""
        with self.session() as s:
            row = s.scalar(select(VersionRow)
                           .join(ModelRow, ModelRow.id == VersionRow.model_id)
                           .where(ModelRow.name == name, VersionRow.version == version,
                                  VersionRow.state == PENDING))
            if row is None:
                return None
            files = s.scalars(select(VersionFileRow).where(VersionFileRow.version_id == row.id)
                              .order_by(VersionFileRow.id)).all()
            return Reservation(row.digest, int(row.size_bytes),
                               [VersionFile(f.role, f.name, f.digest, int(f.size))  # type: ignore[arg-type]
                                for f in files])

    def keyed_version(self, name: str, key: str) -> VersionRecord | None:
        """The committed version the push with ``key`` made visible, or None."""
        with self.session() as s:
            model = s.scalar(select(ModelRow).where(ModelRow.name == name))
            if model is None:
                return None
            row = s.scalar(select(VersionRow).where(
                VersionRow.model_id == model.id, VersionRow.push_key == key,
                VersionRow.state == READY))
            return None if row is None else self._record(s, model, row)
