"""Admin routes (garbage collection, the MLflow mirror's sync) and the service's health probe."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from registry.http.wire import API
from registry.mirror.mirror_mlflow import sync, tracking_uri_for

from ..auth import Principal
from ..dependencies import Backend, ServerSettings, admin

log = logging.getLogger("registry.server")
router = APIRouter()


# The health probe (GET /healthz): create_app adds it to the app itself. No docstring: it would
# become the operation's description in /openapi.json.
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.post(API + "/gc", tags=["admin"])
def gc(local: Backend, caller: Principal = admin) -> dict[str, Any]:
    report = local.gc()
    log.info("gc by %s deleted %d blobs", caller, len(report.deleted))
    return {"deleted": report.deleted, "freed_bytes": report.freed_bytes,
            "kept": report.kept, "stale_pushes": report.stale_pushes,
            "young": report.young, "temporary_files": report.temporary_files,
            "temporary_bytes": report.temporary_bytes, "unknown": report.unknown,
            "expired": report.expired, "purged": report.purged}


@router.post(API + "/mlflow/sync", tags=["admin"])
def mlflow_sync(local: Backend, settings: ServerSettings, full: bool = False,
                _caller: Principal = admin) -> dict[str, Any]:
    report = sync(local, tracking_uri_for(settings), full=full)
    return report.to_dict()
