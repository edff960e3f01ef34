"""What a route needs, read from the app's state through FastAPI dependencies.

``create_app`` sets each once on ``app.state``; a route names what it uses as a parameter
(``local: Backend``) and FastAPI hands it over per request, so a route module holds no closure
over the app and a test can build an app from any backend, policy or mirror.

    app.state.backend    the LocalBackend every route reads and writes
    app.state.settings   the server's frozen Settings
    app.state.auth       the AuthPolicy that turns a bearer token into a caller's name
    app.state.mirror     an object with poke() told of each change (the MLflow mirror), or None
    app.state.signing    the CommitSignatures policy for commits and signature routes
    app.state.delivery   the webhook DeliveryWorker (a background thread), or None
    app.state.hub        the Hub door (registry/doors/hf.py) the /hf routes answer from

``read``, ``write`` and ``admin`` are the auth scopes as parameter defaults
(``caller: Principal = read``): each answers the caller (server/auth.py) or raises 401/403, and
applies the caller's model scope to the route's ``{name}`` path parameter: a model the token may
not see answers 404 exactly as a missing one before the route runs. A route that finds a model
name anywhere else (a ref in the query, a blob's owners, a door's own path) calls
``caller.check(name)`` itself, and one that lists names filters them (``caller.visible``,
``auth.visible_models``). An ``admin`` route without ``{name}`` acts on the whole registry and
needs a token over all models. Each also makes the caller's name the actor of the events the
request's changes append (registry/events.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from registry.backends import LocalBackend
from registry.doors.hf import HubDoor
from registry.events import set_actor
from registry.refs import validate_name
from registry.settings import Settings

from .auth import AuthPolicy, Principal, Scope
from .signatures import CommitSignatures

_bearer = HTTPBearer(auto_error=False, description="A token from `registry token create`.")


def _backend(request: Request) -> LocalBackend:
    local: LocalBackend = request.app.state.backend
    return local


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _signing(request: Request) -> CommitSignatures:
    signing: CommitSignatures = request.app.state.signing
    return signing


def _hub(request: Request) -> HubDoor:
    door: HubDoor = request.app.state.hub
    return door


def _changed(request: Request) -> Callable[[], None]:
    """Tell the mirror (if any) that the catalog changed."""
    mirror = request.app.state.mirror
    return mirror.poke if mirror is not None else _nothing


def _nothing() -> None:
    return None


Backend = Annotated[LocalBackend, Depends(_backend)]
ServerSettings = Annotated[Settings, Depends(_settings)]
Signing = Annotated[CommitSignatures, Depends(_signing)]
Hub = Annotated[HubDoor, Depends(_hub)]
Changed = Annotated[Callable[[], None], Depends(_changed)]


def _need(scope: Scope) -> Any:
    # Async on purpose: it runs in the request's own context, so the actor it sets is the one
    # the route (run in a worker thread with a copy of that context) records its events as.
    async def caller(request: Request,
                     credentials: Annotated[HTTPAuthorizationCredentials | None,
                                            Depends(_bearer)]) -> Principal:
        policy: AuthPolicy = request.app.state.auth
        header = f"Bearer {credentials.credentials}" if credentials else None
        principal = policy.authorize(header, scope)
        request.state.principal = principal  # the error handler hides names with it
        set_actor(principal.name)
        name = request.path_params.get("name")
        if name is not None:
            request.state.model = principal.check(validate_name(name))
        elif scope == "admin":
            route = getattr(request.scope.get("route"), "path", "this route")
            principal.require_all_models(f"{request.method} {route}")
        return principal

    return Depends(caller)


read, write, admin = _need("read"), _need("write"), _need("admin")
