"""Webhooks of a registry server, managed over its REST API (admin scope): ``/webhooks`` lists
(GET) and adds (POST), ``/webhooks/{id}`` removes (DELETE), ``/webhooks/{id}/test`` pings,
``/webhooks/{id}/deliveries`` lists deliveries with their attempts. The server delivers them
itself; every answer is checked before use. Built by RemoteBackend over the transport it
shares, never the backend.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import RegistryError, quoted
from ..trust.validate import answer_field, strict_int
from . import records
from .records import Attempt, Delivery, Webhook

if TYPE_CHECKING:  # `import registry` loads this module, and must not load the HTTP stack
    from ..http.transport import Transport

ROUTE = "/webhooks"
MAX_LISTED = 10_000


class RemoteWebhooks:
    """The webhooks of a registry server."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def add(self, url: str, events: str | Iterable[str], *,
            models: str | Iterable[str] | None = None, secret: str | None = None) -> Webhook:
        body = {"url": records.check_url(url), "events": list(records.check_events(events)),
                "models": None if models is None else list(records.check_models(models) or ()),
                "secret": secret}
        answer = self.transport.call("POST", ROUTE, json=body)
        return answer_field(answer, "webhook answer", "webhook", webhook_from_wire)

    def listed(self) -> list[Webhook]:
        answer = self.transport.call("GET", ROUTE)
        return answer_field(answer, "webhook list", "webhooks",
                            lambda v: [webhook_from_wire(w) for w in _items(v)])

    def remove(self, webhook_id: str) -> None:
        self.transport.call("DELETE", f"{ROUTE}/{records.check_id(webhook_id)}")

    def test(self, webhook_id: str) -> int:
        answer = self.transport.call("POST", f"{ROUTE}/{records.check_id(webhook_id)}/test")
        return answer_field(answer, "ping answer", "status",
                            lambda v: strict_int(v, "status", low=100, high=599))

    def deliveries(self, webhook_id: str, *, limit: int = 100) -> list[Delivery]:
        answer = self.transport.call("GET", f"{ROUTE}/{records.check_id(webhook_id)}/deliveries",
                                     params={"limit": limit})
        return answer_field(answer, "delivery list", "deliveries",
                            lambda v: [delivery_from_wire(d) for d in _items(v)])


def _items(value: object) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_LISTED:
        raise RegistryError(f"the server sent {quoted(value, 60)} where a list was expected")
    return value


def _str(data: dict[str, Any], key: str, *, optional: bool = False, most: int = 4096) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > most:
        raise RegistryError(f"the server sent a malformed {key!r} ({quoted(value, 60)})")
    return value


def _time(data: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    text = _str(data, key, optional=optional, most=64)
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise RegistryError(f"the server sent {key}={quoted(text)}, not a time") from None


def webhook_from_wire(data: object) -> Webhook:
    if not isinstance(data, dict):
        raise RegistryError(f"the server sent {quoted(data, 60)} where a webhook was expected")
    events, models = data.get("events"), data.get("models")
    return Webhook(records.check_id(data.get("id")), records.check_url(data.get("url")),
                   records.check_events(events if isinstance(events, list) else []),
                   records.check_models(models), data.get("enabled") is True,
                   _time(data, "created_at"), _str(data, "disabled_reason", optional=True),
                   _str(data, "secret", optional=True, most=256))


def delivery_from_wire(data: object) -> Delivery:
    if not isinstance(data, dict):
        raise RegistryError(f"the server sent {quoted(data, 60)} where a delivery was expected")
    attempts = []
    for a in _items(data.get("attempts")):
        if not isinstance(a, dict):
            raise RegistryError("the server sent a malformed attempt")
        status = a.get("status")
        attempts.append(Attempt(
            _time(a, "at"), None if status is None else strict_int(status, "status", low=100,
                                                                   high=599),
            strict_int(a.get("duration_ms"), "duration_ms", low=0, high=10**9),
            _str(a, "answer", most=4 * records.ANSWER_KEPT), _str(a, "error", optional=True)))
    return Delivery(_str(data, "id", most=64), records.check_id(data.get("webhook_id")),
                    _str(data, "kind", most=64), _str(data, "model", optional=True, most=256),
                    _str(data, "state", most=16), _time(data, "created_at"),
                    _time(data, "next_attempt_at", optional=True), tuple(attempts))
