"""Reading the event log (registry/events.py): one model's history and every model's events,
from a catalog (:class:`CatalogEvents`) or through a registry server (:class:`ServerEvents`).

Each backend owns one as ``backend.audit``, built with the narrow thing it reads from.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from .errors import RegistryError, quoted
from .events import Event
from .http.transport import segment
from .trust.validate import MAX_PAGE, answer_object

if TYPE_CHECKING:
    from .catalog.repository import Catalog
    from .http.transport import Transport

_UPGRADE = "is REGISTRY_URI a registry server of this version?"


class EventReader(Protocol):
    def history(self, name: str, alias: str | None = None, *, since: datetime | None = None,
                limit: int | None = None) -> list[Event]: ...

    def events(self, *, since_id: int | None = None,
               limit: int | None = None) -> list[Event]: ...


class CatalogEvents:
    """The event log of a SQL catalog."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def history(self, name: str, alias: str | None = None, *, since: datetime | None = None,
                limit: int | None = None, since_id: int | None = None,
                first: int | None = None) -> list[Event]:
        """Events of ``name`` (catalog/events.py); ``since_id`` and ``first`` page them."""
        return self.catalog.history(name, alias, since=since, limit=limit, since_id=since_id,
                                    first=first)

    def events(self, *, since_id: int | None = None,
               limit: int | None = None) -> list[Event]:
        return self.catalog.events(since_id=since_id, limit=limit)


class ServerEvents:
    """The event log of a registry server, read page by page, each event checked."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def history(self, name: str, alias: str | None = None, *, since: datetime | None = None,
                limit: int | None = None) -> list[Event]:
        params: dict[str, Any] = {}
        if alias is not None:
            params["alias"] = alias
        if since is not None:
            params["since"] = since.isoformat()
        found = self._pages(f"/models/{segment(name)}/events", params, None)
        return found[-limit:] if limit is not None else found

    def events(self, *, since_id: int | None = None,
               limit: int | None = None) -> list[Event]:
        return self._pages("/events", {} if since_id is None else {"since_id": since_id}, limit)

    def _pages(self, path: str, params: dict[str, Any], limit: int | None) -> list[Event]:
        """Every event of a paged event list (at most ``limit``), each checked, following
        ``next`` while it advances."""
        url = self.transport.url
        found: list[Event] = []
        while True:
            page = min(MAX_PAGE, limit - len(found)) if limit is not None else MAX_PAGE
            answer = answer_object(self.transport.call("GET", path,
                                                       params={**params, "limit": page}),
                                   "event list")
            items = answer.get("events")
            if not isinstance(items, list) or len(items) > MAX_PAGE:
                raise RegistryError(f"registry server {url} sent a malformed event list; "
                                    f"{_UPGRADE}")
            events = [Event.from_dict(e, origin=f"an event from {url}", error=RegistryError,
                                      fix=_UPGRADE) for e in items]
            last = found[-1].id if found else params.get("since_id", 0)
            if any(e.id <= last for e in events) or \
                    any(a.id >= b.id for a, b in zip(events, events[1:], strict=False)):
                raise RegistryError(f"registry server {url} sent events out of order; "
                                    f"{_UPGRADE}")
            found += events
            following = answer.get("next")
            if following is None or (limit is not None and len(found) >= limit):
                return found
            if not events or following != events[-1].id:
                raise RegistryError(f"registry server {url} sent an event cursor that does "
                                    f"not advance ({quoted(following)}); {_UPGRADE}")
            params = {**params, "since_id": following}
