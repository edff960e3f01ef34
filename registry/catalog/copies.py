"""What the catalog tells the store's copies of its facts, and what makes a push's outcome
exact (mixed into :class:`registry.catalog.repository.Catalog`).

The catalog is the single source of truth for visibility, tags and aliases. The store keeps
copies (manifests, alias tables, tombstones) so that ``registry db rebuild`` can restore the
catalog; :meth:`StoreCopies.publish` hands a writer the catalog's current facts under the
model's write lock, which every change of them also takes, so the copies are written in the
catalog's order (docs/reliability.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from .models import PENDING, READY, TRASHED, AliasRow, ModelRow, VersionRow, aware
from .records import VersionRecord


class StoreCopies:
    """Catalog methods behind the store's copies and exact push outcomes."""

    session: Callable[[], AbstractContextManager[Session]]
    _record: Callable[..., VersionRecord]
    governance_facts: Callable[[Session, ModelRow], dict[str, Any]]

    def committed(self, name: str, version: int, manifest: dict[str, Any], *,
                  session: Session | None = None,
                  model: ModelRow | None = None) -> VersionRecord | None:
        """The record of ``name:vN`` if it is visible and was committed with exactly
        ``manifest`` (a retried commit whose answer was lost), else None. Its aliases and
        tags are today's: a retry never moves them back."""
        if session is None:
            with self.session() as s:
                return self.committed(name, version, manifest, session=s)
        s = session
        if model is None:
            model = s.scalar(select(ModelRow).where(ModelRow.name == name))
            if model is None:
                return None
        row = s.scalar(select(VersionRow).where(
            VersionRow.model_id == model.id, VersionRow.version == version,
            VersionRow.state == READY))
        if row is None or row.manifest != json.dumps(manifest, sort_keys=True):
            return None
        return self._record(s, model, row)

    def publish(self, name: str, versions: Iterable[int],
                write: Callable[[dict[int, dict[str, Any]], dict[str, int], dict[str, Any]],
                                None]) -> None:
        """Call ``write(manifests, aliases, governance)`` with what the catalog holds for
        ``name`` right now (the manifests, tags included, of those of ``versions`` that are
        ready or in the trash, the alias table, and the governance facts) while holding the
        model's write lock.

        Every change of a version's visibility, tags or aliases takes the same lock, so the
        store's copies are written in the catalog's order and the last one written is of the
        newest state: two pushes moving one alias can no longer leave the older table in the
        store (docs/reliability.md)."""
        with self.session() as s:
            model = s.scalar(select(ModelRow).where(ModelRow.name == name).with_for_update())
            if model is None:
                return
            wanted = sorted(set(versions))
            rows = s.scalars(select(VersionRow).where(
                VersionRow.model_id == model.id, VersionRow.version.in_(wanted),
                VersionRow.state.in_((READY, TRASHED)))).all() if wanted else []
            manifests = {r.version: {**json.loads(r.manifest or "{}"), "tags": json.loads(r.tags)}
                         for r in rows}
            aliases = {a.alias: a.version for a in s.scalars(
                select(AliasRow).where(AliasRow.model_id == model.id))}
            write(manifests, aliases, self.governance_facts(s, model))

    def version_states(self) -> dict[tuple[str, int], tuple[str, datetime]]:
        """(name, version) -> (state, reserved at) of every row: what gc compares the store's
        manifests with."""
        with self.session() as s:
            rows = s.execute(select(ModelRow.name, VersionRow.version, VersionRow.state,
                                    VersionRow.created_at)
                             .join(ModelRow, ModelRow.id == VersionRow.model_id)).all()
            return {(n, v): (state, aware(created)) for n, v, state, created in rows}

    def drop_stale_pending(self, *, older_than: timedelta = timedelta(hours=6)) -> int:
        """Forget reservations of pushes that died; their numbers stay retired.

        A push writes its manifest only after its commit (``LocalBackend.commit_push``), so a
        dead push left none; the delete names the state, so a push that commits at this very
        moment keeps its version."""
        with self.session() as s:
            cutoff = datetime.now(timezone.utc) - older_than
            stale = [i for i, created in s.execute(
                select(VersionRow.id, VersionRow.created_at).where(VersionRow.state == PENDING))
                if aware(created) < cutoff]
            if not stale:
                return 0
            gone = s.execute(delete(VersionRow).where(VersionRow.id.in_(stale),
                                                      VersionRow.state == PENDING))
            return int(gone.rowcount or 0)  # type: ignore[attr-defined]
