"""Webhook routes (admin scope): ``GET /webhooks`` lists, ``POST /webhooks`` adds (the answer
carries the secret, the only time it is shown), ``DELETE /webhooks/{id}`` removes,
``POST /webhooks/{id}/test`` pings, ``GET /webhooks/{id}/deliveries`` lists deliveries with
their attempts. The server's delivery worker (``registry serve``) sends what the outbox owes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import Field

from registry.errors import ForbiddenError
from registry.http.wire import API
from registry.webhooks.remote import ROUTE

from ..auth import Principal
from ..boundary import Body
from ..dependencies import Backend, admin

router = APIRouter(prefix=API + ROUTE)


class WebhookBody(Body):
    url: str = Field(max_length=2048)
    events: list[str] = Field(max_length=32)
    models: list[str] | None = Field(default=None, max_length=32)
    secret: str | None = Field(default=None, max_length=256)


@router.get("", tags=["webhooks"])
def list_webhooks(local: Backend, caller: Principal = admin) -> dict[str, Any]:
    """Every webhook (never its secret)."""
    _every_model(caller)
    return {"webhooks": [w.to_dict() for w in local.webhooks.listed()]}


@router.post("", tags=["webhooks"])
def add_webhook(body: WebhookBody, local: Backend, caller: Principal = admin) -> dict[str, Any]:
    """Subscribe a URL to events; the answer holds the secret, shown only this once."""
    _every_model(caller)
    hook = local.webhooks.add(body.url, body.events, models=body.models, secret=body.secret)
    return {"webhook": hook.to_dict()}


@router.delete("/{webhook_id}", tags=["webhooks"], status_code=204)
def remove_webhook(webhook_id: str, local: Backend, caller: Principal = admin) -> None:
    """Remove a webhook and what it was owed."""
    _every_model(caller)
    local.webhooks.remove(webhook_id)


@router.post("/{webhook_id}/test", tags=["webhooks"])
def test_webhook(webhook_id: str, local: Backend, caller: Principal = admin) -> dict[str, Any]:
    """Send a ``ping`` now; the receiver's status."""
    _every_model(caller)
    return {"status": local.webhooks.test(webhook_id)}


@router.get("/{webhook_id}/deliveries", tags=["webhooks"])
def deliveries(webhook_id: str, local: Backend, limit: int = Query(100, ge=1, le=1000),
               caller: Principal = admin) -> dict[str, Any]:
    """The webhook's newest deliveries, newest first, each with its attempts."""
    _every_model(caller)
    return {"deliveries": [d.to_dict() for d in
                           local.webhooks.deliveries(webhook_id, limit=limit)]}


def _every_model(caller: Principal) -> None:
    """Webhooks see every model's events: a token restricted to some models may not manage
    them (it could subscribe to the rest)."""
    if caller.restricted:
        raise ForbiddenError(f"token {caller.name!r} is restricted to models "
                             f"{', '.join(caller.models or ())}; webhooks see every model's "
                             "events, so managing them needs an admin token without --models")
