"""The event log's catalog half: :func:`append_event`, the one way an event is written, and the
reads behind ``history`` and ``audit`` (mixed into :class:`registry.catalog.repository.Catalog`).

Every change appends its event through :func:`append_event` in the change's own session, so the
event and the change commit together or not at all. The events appended in a session are handed
to the catalog's ``event_sinks`` after that session committed (the store's copies,
registry/publish.py), never before: a sink never sees an event whose change was rolled back.

Ids increase in commit order. SQLite serializes writers (``BEGIN IMMEDIATE``); on PostgreSQL
an append first takes one transaction-scoped advisory lock, so an id is drawn only by the
transaction that will commit next, and a reader paging with ``since_id`` never skips an event
that commits late with a lower id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, String, delete, func, select, text, type_coerce
from sqlalchemy.orm import Session

from ..errors import NotFoundError
from ..events import KINDS, Event, iso
from .models import EventRow, ModelRow, aware
from .webhooks import enqueue

# The session.info key under which a session's appended events wait for its commit.
APPENDED = "registry_events"
# pg_advisory_xact_lock's key for event appends ("registry events", arbitrary but fixed).
_PG_LOCK_KEY = 0x7265_6776_6E74
_events = EventRow.__table__


def append_event(session: Session, *, kind: str, name: str, version: int | None = None,
                 alias: str | None = None, previous: int | None = None,
                 details: dict[str, Any] | None = None, actor: str) -> Event:
    """Append one event in ``session`` (the change's own transaction) and return it."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")  # a programming error, not a user's
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
    moment = datetime.now(timezone.utc)
    row = EventRow(at=moment, actor=actor, kind=kind, name=name, version=version, alias=alias,
                   previous=previous, details=json.dumps(details or {}, sort_keys=True))
    session.add(row)
    session.flush()
    event = Event(id=row.id, at=iso(moment), actor=actor, kind=kind, name=name,
                  version=version, alias=alias, previous=previous, details=dict(details or {}))
    session.info.setdefault(APPENDED, []).append(event)
    # What the event owes each webhook that subscribes to it: the outbox's rows, committed
    # with the event or not at all (catalog/webhooks.py).
    enqueue(session, event.to_dict(), at=moment)
    return event


def _event(row: Any) -> Event:
    ident, at, actor, kind, name, version, alias, previous, details = row  # table order
    if isinstance(at, str):  # SQLite's stored text (see _columns): UTC, microseconds always
        at = at.replace(" ", "T", 1)
        at = (at[:-7] if at.endswith(".000000") else at) + "+00:00"
    else:
        at = iso(aware(at))
    return Event(id=int(ident), at=at, actor=actor, kind=kind, name=name, version=version,
                 alias=alias, previous=previous,
                 details={} if details == "{}" else json.loads(details))


def _columns(conn: Connection) -> Any:
    """The event table's columns to select; on SQLite ``at`` as the text SQLAlchemy stored
    (``YYYY-MM-DD HH:MM:SS.ffffff``, always UTC here), which :func:`_event` turns into ISO-8601
    without parsing a datetime per row (a third of reading a long history)."""
    if conn.dialect.name != "sqlite":
        return select(_events)
    return select(*[type_coerce(c, String()) if c.name == "at" else c for c in _events.c])


def after_commit(session: Session, sinks: Iterable[Callable[[list[Event]], object]]) -> None:
    """Hand the events ``session`` appended (and just committed) to each sink."""
    appended = session.info.pop(APPENDED, None)
    if appended:
        for sink in sinks:
            sink(list(appended))


class EventLog:
    """Catalog methods that read the event log and restore it from the store."""

    session: Callable[[], AbstractContextManager[Session]]
    _snapshot: Callable[[], AbstractContextManager[Connection]]

    def history(self, name: str, alias: str | None = None, *, since: datetime | None = None,
                limit: int | None = None, since_id: int | None = None,
                first: int | None = None) -> list[Event]:
        """Events of model ``name`` (of ``name@alias`` only, when given), oldest first; those
        at or after ``since`` and with an id above ``since_id``; the newest ``limit`` of them,
        or the oldest ``first`` (a server's page). NotFoundError if ``name`` never existed."""
        query = select(_events).where(_events.c.name == name)  # columns chosen below
        if alias is not None:
            query = query.where(_events.c.alias == alias)
        if since is not None:
            query = query.where(_events.c.at >= since)
        if since_id is not None:
            query = query.where(_events.c.id > since_id)
        newest_first = first is None
        query = query.order_by(_events.c.id.desc() if newest_first else _events.c.id)
        if limit is not None or first is not None:
            query = query.limit(first if first is not None else limit)
        with self._snapshot() as conn:
            rows = conn.execute(query.with_only_columns(*_columns(conn).selected_columns)).all()
            if not rows and conn.scalar(
                    select(ModelRow.id).where(ModelRow.name == name)) is None and \
                    conn.scalar(select(_events.c.id).where(_events.c.name == name)
                                .limit(1)) is None:
                raise NotFoundError(f"model {name!r} not found: no version of it was ever "
                                    "pushed, so it has no history")
        return [_event(r) for r in (reversed(rows) if newest_first else rows)]

    def events(self, *, since_id: int | None = None, limit: int | None = None) -> list[Event]:
        """Events of every model with an id above ``since_id``, oldest first, at most
        ``limit``."""
        query = select(_events)
        if since_id is not None:
            query = query.where(_events.c.id > since_id)
        query = query.order_by(_events.c.id)
        if limit is not None:
            query = query.limit(limit)
        with self._snapshot() as conn:
            query = query.with_only_columns(*_columns(conn).selected_columns)
            return [_event(r) for r in conn.execute(query).all()]

    def event_ids(self) -> Iterator[int]:
        """Every event's id, ascending (what gc compares the store's copies with)."""
        with self._snapshot() as conn:
            yield from conn.scalars(select(_events.c.id).order_by(_events.c.id)).all()

    def restore_events(self, events: Iterable[Event]) -> int:
        """Replace the log with ``events`` read from the store (``registry db rebuild``), ids
        kept; the next append continues after the highest."""
        count = 0
        with self.session() as s:
            s.execute(delete(EventRow))
            for e in sorted(events, key=lambda e: e.id):
                s.add(EventRow(id=e.id, at=datetime.fromisoformat(e.at).astimezone(timezone.utc),
                               actor=e.actor, kind=e.kind, name=e.name, version=e.version,
                               alias=e.alias, previous=e.previous,
                               details=json.dumps(e.details, sort_keys=True)))
                count += 1
            s.flush()
            if s.get_bind().dialect.name == "postgresql":
                top = s.scalar(select(func.max(EventRow.id)))
                s.execute(text("SELECT setval(pg_get_serial_sequence('registry_events', 'id'), "
                               ":top, :called)"), {"top": top or 1, "called": top is not None})
        return count
