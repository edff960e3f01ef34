"""What webhook reads return (plain dataclasses, never ORM rows), what a subscription matches,
and the checks on what a caller subscribes to."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..errors import SettingsError, quoted

# Every event of the log, whatever kinds the log grows later: "*".
ALL = "*"
# The kind a test delivery carries (Registry.test_webhook); never written to the event log.
PING = "ping"
MAX_URL = 2048
MAX_PATTERNS = 32
MAX_PATTERN = 128
# What an attempt keeps of the receiver's answer (the rest is read, up to the read bound,
# and dropped).
ANSWER_KEPT = 1024
_KIND_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")
_ID_RE = re.compile(r"wh_[0-9a-f]{16}")


@dataclass(frozen=True)
class Webhook:
    """A subscription: events of ``events`` kinds (or ``"*"``) on models matching one of
    ``models`` (fnmatch patterns; None: every model) are POSTed to ``url``, signed with its
    secret. ``secret`` is set only on the value :meth:`Registry.add_webhook` returns: the
    registry never shows it again."""

    id: str
    url: str
    events: tuple[str, ...]
    models: tuple[str, ...] | None
    enabled: bool
    created_at: datetime
    disabled_reason: str | None = None
    secret: str | None = field(default=None, repr=False)

    def matches(self, kind: str, model: str | None) -> bool:
        return self.enabled and matches(self.events, self.models, kind, model)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "url": self.url, "events": list(self.events),
            "models": None if self.models is None else list(self.models),
            "enabled": self.enabled, "disabled_reason": self.disabled_reason,
            "created_at": self.created_at.isoformat()}
        if self.secret is not None:
            out["secret"] = self.secret
        return out


@dataclass(frozen=True)
class Attempt:
    """One POST of a delivery: when, the receiver's status (None: no answer, see ``error``),
    how long it took, and the first KB of its answer."""

    at: datetime
    status: int | None
    duration_ms: int
    answer: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "status": self.status,
                "duration_ms": self.duration_ms, "answer": self.answer, "error": self.error}


@dataclass(frozen=True)
class Recorded:
    """An attempt of a claimed delivery (catalog row ``pk``, lease ``owner``) as its worker
    records it: the delivery's new state, when to try again (``pending`` only), and the
    webhook to disable (410 Gone) with why."""

    pk: int
    owner: str
    attempt: Attempt
    state: str
    next_attempt_at: datetime | None = None
    disable: tuple[str, str] | None = None  # (webhook id, reason)


@dataclass(frozen=True)
class Delivery:
    """One event owed to one webhook: ``pending`` (queued or retrying), ``delivered`` (a 2xx),
    ``failed`` (retried for REGISTRY_WEBHOOK_RETRY_HOURS, or its webhook was disabled)."""

    id: str
    webhook_id: str
    kind: str
    model: str | None
    state: str
    created_at: datetime
    next_attempt_at: datetime | None
    attempts: tuple[Attempt, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "webhook_id": self.webhook_id, "kind": self.kind,
                "model": self.model, "state": self.state,
                "created_at": self.created_at.isoformat(),
                "next_attempt_at": None if self.next_attempt_at is None
                else self.next_attempt_at.isoformat(),
                "attempts": [a.to_dict() for a in self.attempts]}


def matches(events: Sequence[str], models: Sequence[str] | None, kind: str,
            model: str | None) -> bool:
    """Whether a subscription to ``events`` on ``models`` wants an event ``kind`` of ``model``
    (an event of no model matches only a subscription to every model)."""
    if ALL not in events and kind not in events:
        return False
    if models is None:
        return True
    return model is not None and any(fnmatch.fnmatchcase(model, p) for p in models)


def check_url(url: object) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise SettingsError(f"webhook URL {quoted(url)} must be an http(s) URL of at most "
                            f"{MAX_URL} characters")
    return url


def check_events(events: str | Iterable[str], known: Iterable[str] = ()) -> tuple[str, ...]:
    """The kinds subscribed to: ``"*"`` or kinds of the event log (``known``, when given)."""
    items = [events] if isinstance(events, str) else list(events)
    kinds = tuple(dict.fromkeys(e.strip() for e in items if isinstance(e, str) and e.strip()))
    if not kinds or len(kinds) > MAX_PATTERNS or len(items) > MAX_PATTERNS \
            or not all(isinstance(e, str) for e in items):
        raise SettingsError(f"webhook events {quoted(events)} name no event kind; use '*' or "
                            "kinds such as 'alias.set,version.created'")
    known = set(known)
    for kind in kinds:
        if kind == ALL:
            continue
        if not _KIND_RE.fullmatch(kind) or len(kind) > 64 or (known and kind not in known):
            hint = f"; known kinds: {', '.join(sorted(known))}" if known else ""
            raise SettingsError(f"webhook event kind {quoted(kind)} is not an event of the "
                                f"log; use '*' or kinds such as 'alias.set'{hint}")
    return (ALL,) if ALL in kinds else kinds


def check_models(models: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if models is None:
        return None
    items = [models] if isinstance(models, str) else list(models)
    if not items or len(items) > MAX_PATTERNS or not all(
            isinstance(p, str) and 0 < len(p) <= MAX_PATTERN for p in items):
        raise SettingsError(f"webhook models {quoted(models)} must be 1 to {MAX_PATTERNS} "
                            f"fnmatch patterns of at most {MAX_PATTERN} characters, e.g. "
                            "'resnet*'")
    return tuple(dict.fromkeys(items))


def check_id(webhook_id: object) -> str:
    if not isinstance(webhook_id, str) or not _ID_RE.fullmatch(webhook_id):
        raise SettingsError(f"{quoted(webhook_id)} is not a webhook id (such as "
                            "'wh_0123456789abcdef'); `registry webhook ls` lists them")
    return webhook_id


def event_model(event: Mapping[str, Any]) -> str | None:
    """The model an event (as ``history`` returns it) is about."""
    name = event.get("name", event.get("model"))
    return name if isinstance(name, str) else None
