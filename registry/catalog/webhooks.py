"""The catalog's webhook tables: subscriptions, the outbox of deliveries, and their attempts.

A delivery row is written by :func:`enqueue`, in the transaction that appends the event (so an
event and what it owes to each subscriber commit together, or not at all), and is then worked
by whichever delivery worker claims it. A claim is a lease: one conditional UPDATE sets
``lease_owner`` and ``lease_until`` on a row whose lease is free or expired, so of two replicas
that saw the same row exactly one claims it (on SQLite and PostgreSQL alike), and a worker that
died holding one lets it go when the lease ends. A delivery is claimable only when no earlier
pending delivery of the same webhook and model exists: a model's events arrive in order.

The worker runs beside pushes (a thread of ``registry serve``, sharing their SQLite write lock
and the interpreter), so its statements are built once, run as Core on the session's
connection (no ORM unit of work), and its write transactions hold the lock for a statement or
two: the search for due deliveries reads a snapshot, the claim is one ``UPDATE ... RETURNING``,
and the attempts a pass finished are recorded together.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    Boolean,
    Connection,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Mapped, Session, aliased, mapped_column

from ..errors import NotFoundError
from ..webhooks.records import Attempt, Delivery, Recorded, Webhook, event_model, matches
from .models import Base, aware

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


class WebhookRow(Base):
    __tablename__ = "registry_webhooks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[str] = mapped_column(Text)  # JSON list of kinds, or ["*"]
    models: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON list of patterns
    secret: Mapped[str] = mapped_column(Text)  # sealed (registry/webhooks/sealing.py)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    disabled_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class DeliveryRow(Base):
    __tablename__ = "registry_webhook_deliveries"
    __table_args__ = (
        Index("ix_registry_webhook_deliveries_due", "state", "next_attempt_at"),
        Index("ix_registry_webhook_deliveries_order", "webhook_id", "model", "state", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(40), unique=True)
    webhook_id: Mapped[str] = mapped_column(
        ForeignKey("registry_webhooks.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))  # "" for an event of no model
    payload: Mapped[str] = mapped_column(Text)  # the event as history returns it, JSON
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class AttemptRow(Base):
    __tablename__ = "registry_webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery: Mapped[int] = mapped_column(
        ForeignKey("registry_webhook_deliveries.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    duration_ms: Mapped[int] = mapped_column(Integer)
    answer: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


@dataclass(frozen=True)
class Claimed:
    """A delivery a worker holds the lease of: what to send, and to whom."""

    pk: int
    owner: str  # the lease's token: what recording the attempt must still find on the row
    delivery_id: str
    webhook_id: str
    url: str
    sealed_secret: str
    kind: str
    payload: dict[str, Any]
    attempts: int
    created_at: datetime


def _now() -> datetime:
    return datetime.now(timezone.utc)


# The outbox's statements, built once (building one costs more than running it on SQLite).
_FREE = DeliveryRow.lease_until.is_(None) | (DeliveryRow.lease_until < bindparam("now"))
_EARLIER = aliased(DeliveryRow)
# Due: pending, its time come, its lease free, its webhook enabled, and no earlier pending
# delivery of the same webhook and model (a model's events go in order).
_DUE = (select(DeliveryRow.id, DeliveryRow.delivery_id, DeliveryRow.webhook_id, DeliveryRow.kind,
               DeliveryRow.payload, DeliveryRow.created_at, WebhookRow.url, WebhookRow.secret)
        .join(WebhookRow, WebhookRow.id == DeliveryRow.webhook_id)
        .where(DeliveryRow.state == PENDING, DeliveryRow.next_attempt_at <= bindparam("now"),
               _FREE, WebhookRow.enabled.is_(True),
               ~exists().where(and_(_EARLIER.webhook_id == DeliveryRow.webhook_id,
                                    _EARLIER.model == DeliveryRow.model,
                                    _EARLIER.state == PENDING, _EARLIER.id < DeliveryRow.id)))
        .order_by(DeliveryRow.id).limit(bindparam("limit")))
_TAKE = (update(DeliveryRow)
         .where(DeliveryRow.id.in_(bindparam("ids", expanding=True)),
                DeliveryRow.state == PENDING, _FREE)
         .values(lease_owner=bindparam("owner"), lease_until=bindparam("until")))
_TAKE_RETURNING = _TAKE.returning(DeliveryRow.id, DeliveryRow.attempts)
_TAKEN = (select(DeliveryRow.id, DeliveryRow.attempts)
          .where(DeliveryRow.id.in_(bindparam("ids", expanding=True)),
                 DeliveryRow.lease_owner == bindparam("owner")))
_ATTEMPT = insert(AttemptRow)
_RELEASE = (update(DeliveryRow)
            .where(DeliveryRow.id == bindparam("pk"), DeliveryRow.lease_owner == bindparam("owner"))
            .values(state=bindparam("state"), attempts=DeliveryRow.attempts + 1,
                    lease_owner=None, lease_until=None,
                    next_attempt_at=func.coalesce(bindparam("after", type_=DateTime(timezone=True)),
                                                  DeliveryRow.next_attempt_at)))
_SUBSCRIBED = select(WebhookRow.id, WebhookRow.events, WebhookRow.models) \
    .where(WebhookRow.enabled.is_(True))
_OUTBOX = insert(DeliveryRow)


def new_id() -> str:
    return f"wh_{secrets.token_hex(8)}"


def enqueue(s: Session, event: Mapping[str, Any], *, at: datetime | None = None) -> int:
    """In session ``s`` (the one appending ``event``): a delivery row for each enabled webhook
    the event matches; returns how many. ``event`` is the event as ``history`` returns it."""
    kind = str(event.get("kind", ""))
    model = event_model(event)
    conn = s.connection()
    hooks = conn.execute(_SUBSCRIBED).all()
    when = at or _now()
    owed = [hook_id for hook_id, events, models in hooks
            if matches(json.loads(events), None if models is None else json.loads(models), kind,
                       model)]
    if owed:
        payload = json.dumps(dict(event), sort_keys=True, default=str)
        # One statement for all of them (no ORM unit of work): the cost a push pays for its
        # subscribers is this insert.
        conn.execute(_OUTBOX, [
            {"delivery_id": f"dl_{secrets.token_hex(12)}", "webhook_id": hook_id, "kind": kind,
             "model": model or "", "payload": payload, "state": PENDING, "attempts": 0,
             "created_at": when, "next_attempt_at": when} for hook_id in owed])
    return len(owed)


class WebhookRows:
    """Catalog operations on webhooks, over the catalog's transactions (``session``)."""

    def __init__(self, session: Callable[[], AbstractContextManager[Session]],
                 snapshot: Callable[[], AbstractContextManager[Connection]]) -> None:
        self.session = session
        # Reads without the write lock (SQLite): an idle worker's poll never blocks a push.
        self.snapshot = snapshot

    # -- subscriptions --------------------------------------------------------------------

    def add(self, url: str, events: Iterable[str], models: Iterable[str] | None,
            sealed_secret: str) -> Webhook:
        row = WebhookRow(id=new_id(), url=url, events=json.dumps(list(events)),
                         models=None if models is None else json.dumps(list(models)),
                         secret=sealed_secret, enabled=True, created_at=_now())
        with self.session() as s:
            s.add(row)
        return _webhook(row)

    def listed(self) -> list[Webhook]:
        with self.session() as s:
            rows = s.scalars(select(WebhookRow).order_by(WebhookRow.created_at,
                                                         WebhookRow.id)).all()
            return [_webhook(r) for r in rows]

    def get(self, webhook_id: str) -> tuple[Webhook, str]:
        """The webhook and its sealed secret; NotFoundError naming the fix."""
        with self.session() as s:
            row = s.get(WebhookRow, webhook_id)
            if row is None:
                raise NotFoundError(f"webhook {webhook_id} not found; `registry webhook ls` "
                                    "lists the webhooks")
            return _webhook(row), row.secret

    def remove(self, webhook_id: str) -> None:
        """Drop the webhook with its deliveries and their attempts."""
        with self.session() as s:
            delivery_ids = select(DeliveryRow.id).where(DeliveryRow.webhook_id == webhook_id)
            s.execute(delete(AttemptRow).where(AttemptRow.delivery.in_(delivery_ids)))
            s.execute(delete(DeliveryRow).where(DeliveryRow.webhook_id == webhook_id))
            if not s.execute(delete(WebhookRow).where(WebhookRow.id == webhook_id)).rowcount:  # type: ignore[attr-defined]
                raise NotFoundError(f"webhook {webhook_id} not found; `registry webhook ls` "
                                    "lists the webhooks")

    # -- the outbox -----------------------------------------------------------------------

    def claim(self, worker: str, lease: timedelta, *, limit: int = 16,
              now: datetime | None = None) -> list[Claimed]:
        """Take the lease of up to ``limit`` due deliveries (oldest first, at most one per
        webhook and model: the next of a model waits for the one before)."""
        now = now or _now()
        # Found in a snapshot, without the write lock: an idle worker's look never blocks a
        # push. What it reads of a delivery (its event, its webhook's URL and secret) never
        # changes; whether it is still free is for the UPDATE to say.
        with self.snapshot() as conn:
            due = conn.execute(_DUE, {"now": now, "limit": limit}).all()
        if not due:
            return []
        # One statement takes every free one of them, marked with this pass's own token, so
        # the rows it answers are exactly the ones this pass won.
        owner = f"{worker}.{secrets.token_hex(4)}"
        params = {"ids": [row.id for row in due], "now": now, "owner": owner,
                  "until": now + lease}
        with self.session() as s:
            conn = s.connection()
            if conn.dialect.update_returning:
                taken = conn.execute(_TAKE_RETURNING, params).all()
            else:
                conn.execute(_TAKE, params)
                taken = conn.execute(_TAKEN, params).all()
        won = {pk: attempts for pk, attempts in taken}
        return [Claimed(row.id, owner, row.delivery_id, row.webhook_id, row.url, row.secret,
                        row.kind, json.loads(row.payload), won[row.id], aware(row.created_at))
                for row in due if row.id in won]

    def record(self, done: Iterable[Recorded]) -> list[bool]:
        """Record attempts of claimed deliveries and release their leases, in one transaction;
        for each, False when its lease was lost (expired and taken by another worker): the
        attempt is still recorded."""
        done = list(done)
        if not done:
            return []
        kept = []
        with self.session() as s:
            conn = s.connection()
            conn.execute(_ATTEMPT, [
                {"delivery": d.pk, "at": d.attempt.at, "status": d.attempt.status,
                 "duration_ms": d.attempt.duration_ms, "answer": d.attempt.answer,
                 "error": d.attempt.error} for d in done])
            for d in done:
                if d.disable is not None:
                    conn.execute(update(WebhookRow).where(WebhookRow.id == d.disable[0])
                                 .values(enabled=False, disabled_reason=d.disable[1][:500]))
                released = conn.execute(_RELEASE, {"pk": d.pk, "owner": d.owner,
                                                   "state": d.state,
                                                   "after": d.next_attempt_at})
                kept.append(getattr(released, "rowcount", 0) == 1)
        return kept

    def record_test(self, webhook_id: str, kind: str, delivery_id: str,
                    payload: Mapping[str, Any], attempt: Attempt, *, delivered: bool) -> None:
        """A delivery sent at once (a ping), recorded with its one attempt."""
        with self.session() as s:
            row = DeliveryRow(delivery_id=delivery_id, webhook_id=webhook_id, kind=kind,
                              model="", payload=json.dumps(dict(payload), sort_keys=True),
                              state=DELIVERED if delivered else FAILED, attempts=1,
                              created_at=attempt.at, next_attempt_at=attempt.at)
            s.add(row)
            s.flush()
            s.add(AttemptRow(delivery=row.id, at=attempt.at, status=attempt.status,
                             duration_ms=attempt.duration_ms, answer=attempt.answer,
                             error=attempt.error))

    def deliveries(self, webhook_id: str, *, limit: int = 100) -> list[Delivery]:
        """The newest ``limit`` deliveries of a webhook, newest first, with their attempts."""
        self.get(webhook_id)
        with self.session() as s:
            rows = s.scalars(select(DeliveryRow).where(DeliveryRow.webhook_id == webhook_id)
                             .order_by(DeliveryRow.id.desc()).limit(limit)).all()
            attempts: dict[int, list[Attempt]] = {}
            if rows:
                for a in s.scalars(select(AttemptRow).where(
                        AttemptRow.delivery.in_([r.id for r in rows])).order_by(AttemptRow.id)):
                    attempts.setdefault(a.delivery, []).append(Attempt(
                        aware(a.at), a.status, a.duration_ms, a.answer, a.error))
            return [Delivery(r.delivery_id, r.webhook_id, r.kind, r.model or None, r.state,
                             aware(r.created_at),
                             aware(r.next_attempt_at) if r.state == PENDING else None,
                             tuple(attempts.get(r.id, ()))) for r in rows]

    def pending(self) -> int:
        """How many deliveries are still owed (to enabled webhooks)."""
        with self.session() as s:
            return int(s.scalar(select(func.count(DeliveryRow.id))
                                .join(WebhookRow, WebhookRow.id == DeliveryRow.webhook_id)
                                .where(DeliveryRow.state == PENDING,
                                       WebhookRow.enabled.is_(True))) or 0)

    def prune(self, older_than: datetime) -> int:
        """Drop delivered and failed deliveries (with their attempts) made before
        ``older_than``; pending ones are never dropped. Returns how many."""
        with self.session() as s:
            old = select(DeliveryRow.id).where(DeliveryRow.state != PENDING,
                                               DeliveryRow.created_at < older_than)
            s.execute(delete(AttemptRow).where(AttemptRow.delivery.in_(old)))
            gone = s.execute(delete(DeliveryRow).where(DeliveryRow.state != PENDING,
                                                       DeliveryRow.created_at < older_than))
            return int(getattr(gone, "rowcount", 0) or 0)

    def next_due(self) -> datetime | None:
        """When the soonest pending delivery is due (None: nothing pending)."""
        with self.session() as s:
            when = s.scalar(select(DeliveryRow.next_attempt_at)
                            .join(WebhookRow, WebhookRow.id == DeliveryRow.webhook_id)
                            .where(DeliveryRow.state == PENDING, WebhookRow.enabled.is_(True))
                            .order_by(DeliveryRow.next_attempt_at).limit(1))
            return None if when is None else aware(when)


def _webhook(row: WebhookRow) -> Webhook:
    return Webhook(row.id, row.url, tuple(json.loads(row.events)),
                   None if row.models is None else tuple(json.loads(row.models)),
                   bool(row.enabled), aware(row.created_at), row.disabled_reason)
