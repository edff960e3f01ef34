"""Leases of pushes in progress (mixed into :class:`registry.catalog.repository.Catalog`).

A reservation (a ``pending`` version row) is held by a lease: its ``created_at`` is the moment
the lease was last renewed, and every sign of life of the push (an upload finished, a blob
accepted by a server, the commit) renews it. A push that was killed stops renewing, and the
next reservation of the same model releases it once ``REGISTRY_PUSH_LEASE`` (default 15m) has
passed, without waiting for a gc: its blobs are no longer kept for it, a server no longer
accepts uploads for it, and the MLflow mirror no longer waits for it. gc releases the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from .models import PENDING, ModelRow, VersionFileRow, VersionRow, aware


class Leases:
    """Catalog methods that renew and release the leases of pushes in progress."""

    session: Callable[[], AbstractContextManager[Session]]

    def release_expired(self, s: Session, model_id: int, lease: timedelta) -> int:
        """In session ``s``: drop the reservations of model ``model_id`` whose lease expired
        (their numbers stay retired); returns how many."""
        cutoff = datetime.now(timezone.utc) - lease
        expired = [i for i, renewed in s.execute(
            select(VersionRow.id, VersionRow.created_at).where(
                VersionRow.model_id == model_id, VersionRow.state == PENDING))
            if aware(renewed) < cutoff]
        if not expired:
            return 0
        gone = s.execute(delete(VersionRow).where(VersionRow.id.in_(expired),
                                                  VersionRow.state == PENDING))
        return int(gone.rowcount or 0)  # type: ignore[attr-defined]

    def renew(self, name: str, version: int) -> bool:
        """Renew the lease of the push of ``name:vN``; False if it is not in progress."""
        with self.session() as s:
            model_id = select(ModelRow.id).where(ModelRow.name == name).scalar_subquery()
            done = s.execute(update(VersionRow).where(
                VersionRow.model_id == model_id, VersionRow.version == version,
                VersionRow.state == PENDING).values(created_at=datetime.now(timezone.utc)))
            return bool(done.rowcount)  # type: ignore[attr-defined]

    def renew_listing(self, digest: str) -> None:
        """Renew the leases of the pushes in progress that list blob ``digest`` (a server
        receiving its upload)."""
        with self.session() as s:
            listing = select(VersionFileRow.version_id).where(VersionFileRow.digest == digest)
            s.execute(update(VersionRow).where(VersionRow.id.in_(listing),
                                               VersionRow.state == PENDING)
                      .values(created_at=datetime.now(timezone.utc)))
