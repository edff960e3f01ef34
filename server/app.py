"""The registry's HTTP service: REST under /api/v1, translated to calls of the registry library.

Every name, ref, alias, version and tag is checked by ``registry.refs`` / the facade's validators
before it reaches the catalog or a store key; storage and catalog logic live in ``LocalBackend``.
The server adds only what HTTP needs: auth, two-phase pushes, blob transfer and error bodies

    {"error": {"code": "<RegistryError.code>", "message": "<str(exc)>"}}

that ``registry.http.remote`` turns back into the same exception class.

:func:`create_app` only assembles: it builds the app's state (``server/dependencies.py``),
includes the routers of ``server/routes/`` and sets the body limit and the error handlers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry.backends import LocalBackend
from registry.doors.hf import HubDoor
from registry.errors import NotFoundError, RegistryError, SettingsError
from registry.http.wire import status_for
from registry.mirror.mirror_mlflow import MirrorWorker
from registry.settings import Settings
from registry.signing.service import directory_signature
from registry.webhooks.worker import DeliveryWorker

from .auth import AuthPolicy, missing_model
from .boundary import AsciiJSONResponse, BodyLimit, error_response
from .routes import (
    admin,
    blobs,
    events,
    exports,
    governance,
    hf,
    models,
    pushes,
    signatures,
    webhooks,
)
from .signatures import CommitSignatures

log = logging.getLogger("registry.server")

ROUTERS = (signatures.router, models.router, pushes.router, blobs.router, admin.router,
           exports.router, events.router, webhooks.router, hf.router, governance.router)


def create_app(settings: Settings | None = None, *, auth: AuthPolicy | None = None,
               backend: LocalBackend | None = None, mirror: Any = None,
               deliver: bool = True) -> FastAPI:
    """The registry server over ``LocalBackend.from_settings(settings)``.

    ``auth`` defaults to the tokens in ``REGISTRY_AUTH_FILE`` if that is set, else an open
    server (``registry serve`` chooses and enforces the policy for its host). ``mirror`` is an
    object with ``poke()`` called after each change (the MLflow mirror); by default one is
    started when ``MLFLOW_TRACKING_URI`` is set. ``deliver`` runs the webhook delivery worker
    on a background thread while the app runs (registry/webhooks/worker.py).
    """
    settings = settings or Settings.from_env()
    if auth is None:
        auth = _default_policy(settings)
    local = backend or LocalBackend.from_settings(settings)
    if mirror is None and settings.mlflow_tracking_uri:
        mirror = MirrorWorker(local, settings.mlflow_tracking_uri)

    app = FastAPI(title="registry", version="1", lifespan=_lifespan,
                  default_response_class=AsciiJSONResponse,
                  description="A model registry for PyTorch: push any checkpoint, pull it on "
                              "any device.")
    app.state.backend = local
    app.state.settings = settings
    app.state.auth = auth
    app.state.mirror = mirror
    app.state.delivery = DeliveryWorker(local.webhooks) if deliver else None
    app.state.signing = CommitSignatures(local, settings)
    app.state.hub = HubDoor(resolve=local.resolve, list_versions=local.list_versions,
                            open_blob=local.open_blob, cache_dir=local.cache.root,
                            signature=lambda m: directory_signature(local.signatures, m))
    app.add_middleware(BodyLimit)
    app.add_exception_handler(RegistryError, _registry_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
    # The health probe sits on the app itself, where a deployment's check finds it among
    # app.routes (an included router is one entry there).
    app.add_api_route("/healthz", admin.healthz, tags=["service"])
    for router in ROUTERS:
        app.include_router(router)
    return app


def _default_policy(settings: Settings) -> AuthPolicy:
    named = settings.auth_file if settings.auth_file_named else None
    if named is not None and not named.exists():
        raise SettingsError(f"REGISTRY_AUTH_FILE {named} does not exist; create it with "
                            "`registry token create NAME --scopes admin`")
    return AuthPolicy.for_server("127.0.0.1", auth_file=named, allow_anonymous=False)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    if app.state.auth.mode == "open":
        log.warning("no auth file: this server is open to anyone who can reach it "
                    "(loopback only); create tokens with `registry token create`")
    workers = [w for w in (app.state.mirror, app.state.delivery) if w is not None]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.stop()
        app.state.backend.close()


# -- error bodies ----------------------------------------------------------------------------

async def _registry_error(request: Request, exc: RegistryError) -> JSONResponse:
    if isinstance(exc, NotFoundError):
        exc = await run_in_threadpool(_as_seen_by_caller, request, exc)
    status = status_for(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return error_response(status, exc.code, str(exc), headers)


def _as_seen_by_caller(request: Request, exc: NotFoundError) -> NotFoundError:
    """A model the caller's token may see but the catalog lacks: the library's message would
    suggest other models (hidden ones among them), so the caller gets the one answer it gets for
    a model it may not see (server/auth.py), and the two cannot be told apart."""
    principal = getattr(request.state, "principal", None)
    name = getattr(request.state, "model", None)
    if principal is None or not principal.restricted or name is None:
        return exc
    if request.app.state.backend.catalog.model_exists(name):
        return exc
    return missing_model(principal, name)


async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p)[:60] for p in first.get("loc", ()))
    return error_response(422, "invalid_request",
                          f"invalid request at {where[:200] or 'body'}: "
                          f"{str(first.get('msg', 'malformed'))[:200]}")


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = "not_found" if exc.status_code == 404 else "invalid_request"
    return error_response(exc.status_code, code,
                          f"{str(exc.detail)[:200]}: see /docs for the API", exc.headers)


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", exc_info=exc)
    return error_response(500, "internal_error", "the registry server failed; see its log")
