"""Catalog operations on aliases (mixed into :class:`registry.catalog.repository.Catalog`):
read the table, point an alias at a version, remove one; each change appends its event in its
own transaction, under the model's write lock (which serializes alias writers and makes each
event's ``previous`` the version the alias really pointed at)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import AliasProtectedError, NotFoundError
from ..events import current_actor
from .events import append_event
from .models import AliasRow, ModelRow, VersionRow
from .records import VersionRecord


class Aliases:
    """Catalog methods of the alias table."""

    session: Callable[[], AbstractContextManager[Session]]
    _model: Callable[..., ModelRow]
    _row: Callable[..., VersionRow]
    _record: Callable[..., VersionRecord]

    def aliases(self, name: str) -> dict[str, int]:
        with self.session() as s:
            model = self._model(s, name)
            return {a.alias: a.version for a in s.scalars(
                select(AliasRow).where(AliasRow.model_id == model.id).order_by(AliasRow.alias))}

    def set_alias(self, name: str, alias: str, version: int, *,
                  force: bool = False) -> VersionRecord:
        """Point ``name@alias`` at ``version``; a protected alias moves only with ``force``."""
        with self.session() as s:
            model = self._model(s, name, lock=True)  # serializes alias writers, as in commit
            row = self._row(s, model, version)
            refuse_protected(s, model, [alias], force=force, doing="moving")
            previous = self.put_alias(s, model, alias, version)
            append_event(s, kind="alias.set", name=name, version=version, alias=alias,
                         previous=previous, actor=current_actor())
            return self._record(s, model, row)

    def delete_alias(self, name: str, alias: str, *, force: bool = False) -> bool:
        """Remove ``name@alias``; a protected one only with ``force``. Returns whether it
        was protected (the store's copy of the model's governance facts changes then)."""
        with self.session() as s:
            model = self._model(s, name, lock=True)  # serializes with publish
            existing = s.get(AliasRow, (model.id, alias))
            if existing is None:
                raise NotFoundError(f"{name}@{alias} not found: {name} has no alias {alias!r}")
            refuse_protected(s, model, [alias], force=force, doing="deleting")
            protected = bool(existing.protected)
            previous = existing.version
            s.delete(existing)
            append_event(s, kind="alias.deleted", name=name, alias=alias, previous=previous,
                         actor=current_actor())
            return protected

    def put_alias(self, s: Session, model: ModelRow, alias: str, version: int) -> int | None:
        """Point ``alias`` at ``version``; returns the version it pointed at before."""
        existing = s.get(AliasRow, (model.id, alias))
        previous, now = None, datetime.now(timezone.utc)
        if existing is None:
            s.add(AliasRow(model_id=model.id, alias=alias, version=version, updated_at=now))
        else:
            previous = existing.version
            existing.version = version
            existing.updated_at = now
        s.flush()
        return previous



def refuse_protected(s: Session, model: ModelRow, aliases: list[str], *, force: bool,
                     doing: str) -> None:
    """AliasProtectedError if one of ``aliases`` of ``model`` is protected and not ``force``."""
    if force or not aliases:
        return
    protected = s.scalars(select(AliasRow.alias).where(
        AliasRow.model_id == model.id, AliasRow.alias.in_(aliases),
        AliasRow.protected.is_(True)).order_by(AliasRow.alias)).all()
    if protected:
        ref = f"{model.name}@{protected[0]}"
        raise AliasProtectedError(
            f"{ref} is protected; {doing} it needs force=True (--force) in an embedded "
            f"registry, or a token with the admin scope through a server (or unprotect it "
            f"first: registry alias {ref} --unprotect)")
