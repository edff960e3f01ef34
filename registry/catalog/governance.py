"""Catalog operations of governance (mixed into :class:`registry.catalog.repository.Catalog`):
protected aliases, holds, retention policies, and the trash (restore, expire, purge).

Each is a change made under the model's write lock with its event appended in the same
transaction (catalog/events.py), so the server, the CLI and the embedded API get the same checks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, delete, select
from sqlalchemy.orm import Session

from ..errors import NotFoundError, RefError, VersionHeldError
from ..events import current_actor, iso
from ..governance import Hold, ModelGovernance, Retention, Trashed
from .events import append_event
from .models import (
    DELETED,
    READY,
    TRASHED,
    AliasRow,
    EventRow,
    ModelRow,
    VersionFileRow,
    VersionRow,
    aware,
)
from .records import VersionRecord


def refuse_held(name: str, row: VersionRow, what: str) -> None:
    """VersionHeldError if ``row`` is held: nobody may ``what`` it (delete, trash, expire)."""
    if row.hold is not None:
        hold = json.loads(row.hold)
        raise VersionHeldError(
            f"{name}:v{row.version} is held ({hold.get('reason')!r}, by {hold.get('actor')} "
            f"since {hold.get('at', '?')[:19]}); nobody may {what} it until the hold is "
            f"released (registry release {name}:v{row.version}, admin scope on a server)")


class GovernanceRows:
    """Catalog methods of protected aliases, holds, retention and the trash."""

    session: Callable[[], AbstractContextManager[Session]]
    _snapshot: Callable[[], AbstractContextManager[Connection]]
    _model: Callable[..., ModelRow]
    _row: Callable[..., VersionRow]
    _record: Callable[..., VersionRecord]

    def protect_alias(self, name: str, alias: str, protected: bool) -> bool:
        """Protect (or unprotect) ``name@alias``; whether that changed anything."""
        with self.session() as s:
            model = self._model(s, name, lock=True)
            row = s.get(AliasRow, (model.id, alias))
            if row is None:
                raise NotFoundError(f"{name}@{alias} not found: set the alias first "
                                    f"(registry alias {name}@{alias} VERSION), then protect it")
            if bool(row.protected) == protected:
                return False
            row.protected = protected
            append_event(s, kind="alias.protected" if protected else "alias.unprotected",
                         name=name, version=row.version, alias=alias, actor=current_actor())
            return True

    def hold(self, name: str, version: int, reason: str) -> VersionRecord:
        """Put ``name:vN`` on hold: nobody may delete, trash or expire it until released."""
        with self.session() as s:
            model = self._model(s, name, lock=True)
            row = self._row(s, model, version)
            if row.hold is None or json.loads(row.hold).get("reason") != reason:
                actor = current_actor()
                row.hold = json.dumps({"reason": reason, "actor": actor,
                                       "at": iso(datetime.now(timezone.utc))})
                append_event(s, kind="version.held", name=name, version=version, actor=actor,
                             details={"reason": reason})
            return self._record(s, model, row)

    def release(self, name: str, version: int) -> VersionRecord:
        """Lift the hold on ``name:vN``."""
        with self.session() as s:
            model = self._model(s, name, lock=True)
            row = self._row(s, model, version)
            if row.hold is None:
                raise NotFoundError(f"{name}:v{version} is not held; nothing to release")
            reason = json.loads(row.hold).get("reason")
            row.hold = None
            append_event(s, kind="version.released", name=name, version=version,
                         actor=current_actor(), details={"reason": reason})
            return self._record(s, model, row)

    def set_retention(self, name: str, policy: Retention | None) -> None:
        """Set (or, with None, clear) ``name``'s retention policy, applied by gc."""
        with self.session() as s:
            model = self._model(s, name, lock=True)
            model.retention = None if policy is None else json.dumps(policy.to_dict())
            append_event(s, kind="retention.set", name=name, actor=current_actor(),
                         details=policy.to_dict() if policy is not None else {"cleared": True})

    def restore_version(self, name: str, version: int, window: timedelta) -> VersionRecord:
        """Bring ``name:vN`` back from the trash (within ``window`` of its deletion)."""
        with self.session() as s:
            model = self._model(s, name, live=False, lock=True)
            row = s.scalar(select(VersionRow).where(VersionRow.model_id == model.id,
                                                    VersionRow.version == version))
            if row is not None and row.state == READY:
                raise RefError(f"{name}:v{version} is not deleted; there is nothing to restore")
            if row is None or row.state != TRASHED or row.deleted_at is None:
                why = " and purged from the trash" if row is not None and row.state == DELETED \
                    else ""
                raise NotFoundError(f"{name}:v{version} not found in the trash (it was never "
                                    f"pushed{why}); `registry ls --trash` lists what can be "
                                    "restored" if not why else
                                    f"{name}:v{version} was deleted{why}; it cannot be "
                                    "restored")
            until = aware(row.deleted_at) + window
            if datetime.now(timezone.utc) > until:
                raise NotFoundError(
                    f"{name}:v{version} was deleted at {iso(aware(row.deleted_at))[:19]} and "
                    f"its trash window ({window.total_seconds() / 86400:g} days, "
                    "REGISTRY_TRASH_DAYS) has passed; gc purges it")
            row.state, row.deleted_at, row.mlflow_synced = READY, None, None
            append_event(s, kind="version.restored", name=name, version=version,
                         actor=current_actor(), details={"digest": row.digest})
            return self._record(s, model, row)

    def trashed(self, name: str | None, window: timedelta) -> list[Trashed]:
        """Versions in the trash (of ``name``, or of every model), by name and version."""
        with self.session() as s:
            query = (select(ModelRow.name, VersionRow)
                     .join(ModelRow, ModelRow.id == VersionRow.model_id)
                     .where(VersionRow.state == TRASHED)
                     .order_by(ModelRow.name, VersionRow.version))
            if name is not None:
                self._model(s, name, live=False)
                query = query.where(ModelRow.name == name)
            found = []
            for model_name, row in s.execute(query).all():
                at = aware(row.deleted_at or row.created_at)
                last = s.scalar(select(EventRow.kind).where(
                    EventRow.name == model_name, EventRow.version == row.version,
                    EventRow.kind.in_(("version.deleted", "version.expired")))
                    .order_by(EventRow.id.desc()).limit(1))
                found.append(Trashed(model_name, row.version, row.digest, iso(at),
                                     iso(at + window), expired=last == "version.expired"))
            return found

    def governance(self, name: str) -> ModelGovernance:
        """``name``'s protected aliases, holds and retention policy, read in a snapshot that
        takes no write lock (``show`` asks, and must not wait for a writer)."""
        with self._snapshot() as conn:
            s = Session(bind=conn)
            try:
                return _governance(s, self._model(s, name, live=False))
            finally:
                s.close()

    def governance_facts(self, s: Session, model: ModelRow) -> dict[str, Any]:
        """In session ``s``: what the store's ``governance/<name>.json`` holds for ``model``
        (what ``db rebuild`` restores beyond manifests and aliases)."""
        trashed = {str(v): iso(aware(at or created)) for v, at, created in s.execute(
            select(VersionRow.version, VersionRow.deleted_at, VersionRow.created_at).where(
                VersionRow.model_id == model.id, VersionRow.state == TRASHED)).all()}
        return {**_governance(s, model).to_dict(), "trashed": trashed}

    def expire(self) -> list[tuple[str, int]]:
        """Trash what retention policies expire (gc's first step), each a ``version.expired``
        event; never a version an alias points at, a held one, or an adapter's base."""
        done: list[tuple[str, int]] = []
        with self.session() as s:
            names = s.scalars(select(ModelRow.name).where(ModelRow.retention.is_not(None))
                              .order_by(ModelRow.name)).all()
            bases = _adapter_bases(s) if names else set()
        for name in names:
            with self.session() as s:
                model = self._model(s, name, live=False, lock=True)
                if model.retention is None:
                    continue
                policy = Retention.from_dict(json.loads(model.retention))
                aliased = set(s.scalars(select(AliasRow.version).where(
                    AliasRow.model_id == model.id)).all())
                rows = s.scalars(select(VersionRow).where(
                    VersionRow.model_id == model.id, VersionRow.state == READY)
                    .order_by(VersionRow.version.desc())).all()
                now = datetime.now(timezone.utc)
                for rank, row in enumerate(rows):
                    if policy.keep_last is not None and rank < policy.keep_last:
                        continue
                    if policy.max_age is not None and now - aware(row.created_at) < \
                            policy.max_age:
                        continue
                    if row.version in aliased or row.hold is not None or \
                            (name, row.digest) in bases:
                        continue
                    row.state, row.deleted_at = TRASHED, now
                    append_event(s, kind="version.expired", name=name, version=row.version,
                                 actor=current_actor(),
                                 details={"policy": policy.to_dict(), "digest": row.digest})
                    done.append((name, row.version))
        return sorted(done)

    def purge_trash(self, window: timedelta) -> list[tuple[str, int]]:
        """Turn versions trashed longer than ``window`` ago into tombstones (their numbers stay
        retired, their files are no longer kept); each a ``version.deleted`` event with
        ``details.purged``."""
        cutoff = datetime.now(timezone.utc) - window
        with self.session() as s:
            rows = s.execute(select(ModelRow.name, VersionRow.version, VersionRow.deleted_at)
                             .join(ModelRow, ModelRow.id == VersionRow.model_id)
                             .where(VersionRow.state == TRASHED)).all()
        due: dict[str, list[int]] = {}
        for name, version, at in rows:
            if at is None or aware(at) <= cutoff:
                due.setdefault(name, []).append(version)
        done: list[tuple[str, int]] = []
        for name, versions in sorted(due.items()):
            with self.session() as s:
                model = self._model(s, name, live=False, lock=True)
                for row in s.scalars(select(VersionRow).where(
                        VersionRow.model_id == model.id, VersionRow.version.in_(versions),
                        VersionRow.state == TRASHED)).all():
                    if row.hold is not None or (row.deleted_at is not None
                                                and aware(row.deleted_at) > cutoff):
                        continue  # restored and deleted again, or held, since the first look
                    row.state = DELETED
                    s.execute(delete(VersionFileRow).where(VersionFileRow.version_id == row.id))
                    append_event(s, kind="version.deleted", name=name, version=row.version,
                                 actor=current_actor(),
                                 details={"digest": row.digest, "purged": True})
                    done.append((name, row.version))
        return done


def _governance(s: Session, model: ModelRow) -> ModelGovernance:
    protected = tuple(s.scalars(select(AliasRow.alias).where(
        AliasRow.model_id == model.id, AliasRow.protected.is_(True))
        .order_by(AliasRow.alias)).all())
    holds = {v: Hold(**json.loads(h or "{}")) for v, h in s.execute(
        select(VersionRow.version, VersionRow.hold).where(
            VersionRow.model_id == model.id, VersionRow.hold.is_not(None),
            VersionRow.state.in_((READY, TRASHED)))).all()}
    retention = None if model.retention is None else \
        Retention.from_dict(json.loads(model.retention))
    return ModelGovernance(protected, holds, retention)


def _adapter_bases(s: Session) -> set[tuple[str, str]]:
    """(name, digest) of every version a live adapter version names as its base."""
    bases = set()
    for text in s.scalars(select(VersionRow.manifest).where(
            VersionRow.state == READY, VersionRow.manifest.like('%"adapter"%'))).all():
        adapter = json.loads(text or "{}").get("adapter")
        base = adapter.get("base") if isinstance(adapter, dict) else None
        if isinstance(base, dict):
            bases.add((str(base.get("name")), str(base.get("digest"))))
    return bases
