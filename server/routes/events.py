"""The event log's routes: one model's history (read scope) and every model's events, the
audit log (admin scope). Both page by event id: pass ``next`` back as ``since_id``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from registry.events import MAX_EVENT_ID
from registry.http.wire import API
from registry.refs import validate_alias, validate_name
from registry.trust.validate import DEFAULT_PAGE, MAX_PAGE
from registry.versions import parse_since

from ..auth import Principal
from ..dependencies import Backend, admin, read

router = APIRouter(prefix=API)

PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Events per page.")]
SinceId = Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID,
                                      description="Only events with a higher id (the `next` "
                                                  "of the previous page).")]


@router.get("/models/{name}/events", tags=["events"])
def model_events(name: str, local: Backend, limit: PageSize = DEFAULT_PAGE,
                 since_id: SinceId = None,
                 alias: Annotated[str | None, Query(max_length=63,
                                                    description="Only this alias's events.")]
                 = None,
                 since: Annotated[str | None, Query(max_length=64,
                                                    description="Only events at or after this "
                                                                "ISO-8601 time.")] = None,
                 _caller: Principal = read) -> dict[str, Any]:
    """A model's events, oldest first, one page at a time."""
    events = local.audit.history(validate_name(name),
                                   None if alias is None else validate_alias(alias),
                                   since=parse_since(since), since_id=since_id, first=limit + 1)
    return _page(events, limit)


@router.get("/events", tags=["events"])
def all_events(local: Backend, limit: PageSize = DEFAULT_PAGE, since_id: SinceId = None,
               _caller: Principal = admin) -> dict[str, Any]:
    """Every model's events (the audit log), oldest first, one page at a time."""
    return _page(local.audit.events(since_id=since_id, limit=limit + 1), limit)


def _page(events: list[Any], limit: int) -> dict[str, Any]:
    return {"events": [e.to_dict() for e in events[:limit]],
            "next": events[limit - 1].id if len(events) > limit else None}
