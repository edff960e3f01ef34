"""The append-only event log's public half: what an :class:`Event` is, who is acting, and how an
event crosses a boundary (the wire, a store object).

Every change of the catalog appends one event in the change's own transaction
(``registry.catalog.events.append_event``); ``history`` and ``audit`` read them back, webhooks
deliver them, and the store keeps a copy of each (``events/<id>.json``) so that ``registry db
rebuild`` restores the history exactly. Nothing edits or deletes an event.

Who acted is a context variable: ``local:<OS user>`` in an embedded registry, the token's name
through a server (``server/dependencies.py`` sets it per request with :func:`acting_as`).
Importing this module loads neither SQLAlchemy nor torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import getpass
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, get_args

from .errors import CheckpointError, RegistryError, quoted
from .refs import MAX_VERSION, validate_alias, validate_name
from .trust import boundedjson

EventKind = Literal[
    "version.created", "version.deleted", "version.restored", "version.expired",
    "version.held", "version.released", "alias.set", "alias.deleted", "alias.protected",
    "alias.unprotected", "tags.set", "signature.added", "export.added", "retention.set",
]
KINDS: tuple[str, ...] = get_args(EventKind)
# Bounds of what an event holds (checked when one is read from a store or a server's answer).
MAX_ACTOR = 128
MAX_DETAILS_BYTES = 64 * 1024
MAX_EVENT_ID = 2**63 - 1

_STORE_FIX = ("nothing was restored: remove or repair that object in the store, then run "
              "`registry db rebuild` again")

_actor: contextvars.ContextVar[str | None] = contextvars.ContextVar("registry_actor",
                                                                    default=None)


@dataclass(frozen=True)
class Event:
    """One change, as the log recorded it. ``previous`` is, for alias events, the version the
    alias pointed at before (None if it pointed nowhere)."""

    id: int
    at: str  # ISO-8601, UTC
    actor: str
    kind: str
    name: str
    version: int | None = None
    alias: str | None = None
    previous: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-able data: the wire's and the store's form."""
        return {"id": self.id, "at": self.at, "actor": self.actor, "kind": self.kind,
                "name": self.name, "version": self.version, "alias": self.alias,
                "previous": self.previous, "details": dict(self.details)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: object, *, origin: str,
                  error: type[RegistryError] = CheckpointError, fix: str = _STORE_FIX) -> Event:
        """An event read from outside (a store object, a server's answer), every field
        checked; ``error`` is the boundary's error class, ``origin`` where it came from and
        ``fix`` what to do about a bad one."""
        def bad(detail: str) -> RegistryError:
            return error(f"{origin} is not a registry event: {detail}; {fix}")

        if not isinstance(data, dict):
            raise bad(f"expected an object, got {type(data).__name__}")
        if set(data) != {"id", "at", "actor", "kind", "name", "version", "alias", "previous",
                         "details"}:
            raise bad(f"fields {quoted(sorted(map(str, data)))}")
        ident = data["id"]
        if isinstance(ident, bool) or not isinstance(ident, int) or \
                not 1 <= ident <= MAX_EVENT_ID:
            raise bad(f"id {quoted(ident)} is not a positive integer")
        kind = data["kind"]
        if kind not in KINDS:
            raise bad(f"unknown kind {quoted(kind)}")
        actor = data["actor"]
        if not isinstance(actor, str) or not 0 < len(actor) <= MAX_ACTOR:
            raise bad(f"actor {quoted(actor)} is not a string of 1-{MAX_ACTOR} characters")
        at = data["at"]
        try:
            moment = datetime.fromisoformat(at) if isinstance(at, str) and len(at) <= 40 \
                else None
        except ValueError:
            moment = None
        if moment is None or moment.utcoffset() is None:
            raise bad(f"at {quoted(at)} is not an ISO-8601 time with a UTC offset")
        try:
            name = validate_name(data["name"])
            alias = None if data["alias"] is None else validate_alias(data["alias"])
        except RegistryError as exc:
            raise bad(str(exc)) from None
        numbers = {}
        for key in ("version", "previous"):
            value = data[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 1 <= value <= MAX_VERSION):
                raise bad(f"{key} {quoted(value)} is not a version number")
            numbers[key] = value
        details = data["details"]
        if not isinstance(details, dict) or \
                len(json.dumps(details, default=str)) > MAX_DETAILS_BYTES:
            raise bad(f"details must be an object of at most {MAX_DETAILS_BYTES} bytes")
        return cls(id=ident, at=at, actor=actor, kind=kind, name=name,
                   version=numbers["version"], alias=alias, previous=numbers["previous"],
                   details=details)

    @classmethod
    def from_json(cls, data: bytes | str, *, origin: str) -> Event:
        """An event from a store object's bytes (bounded JSON, checked)."""
        try:
            parsed = boundedjson.loads(data)
        except ValueError as exc:
            raise CheckpointError(f"{origin} is not valid JSON ({exc}); remove or repair it, "
                                  "then run `registry db rebuild` again") from None
        return cls.from_dict(parsed, origin=origin)


def current_actor() -> str:
    """Who is acting: the name :func:`acting_as` set (a server's token name), else
    ``local:<OS user>``."""
    name = _actor.get()
    if name is not None:
        return name
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        user = "unknown"
    return f"local:{user}"[:MAX_ACTOR]


def set_actor(name: str) -> None:
    """Make ``name`` the actor of the changes the current context makes from now on (a
    server's request runs in its own context, so this lasts for that request)."""
    _actor.set(name[:MAX_ACTOR])


@contextlib.contextmanager
def acting_as(name: str) -> Iterator[None]:
    """Record the changes made inside the block as ``name``'s."""
    token = _actor.set(name[:MAX_ACTOR])
    try:
        yield
    finally:
        _actor.reset(token)


def iso(moment: datetime) -> str:
    """``moment`` as the ISO-8601 UTC text events carry."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return aware.astimezone(timezone.utc).isoformat()


__all__ = ["KINDS", "Event", "EventKind", "acting_as", "current_actor", "iso", "set_actor"]
