"""What a backend's webhooks offer the facade, embedded (``local.py``) or over a server
(``remote.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from .records import Delivery, Webhook


class WebhookStore(Protocol):
    """Subscriptions and their deliveries, wherever the catalog is."""

    def add(self, url: str, events: str | Iterable[str], *,
            models: str | Iterable[str] | None = None, secret: str | None = None) -> Webhook: ...

    def listed(self) -> list[Webhook]: ...

    def remove(self, webhook_id: str) -> None: ...

    def test(self, webhook_id: str) -> int: ...

    def deliveries(self, webhook_id: str, *, limit: int = 100) -> list[Delivery]: ...
