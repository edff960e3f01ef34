"""Governance routes: protected aliases, holds, retention policies and the trash
(registry/governance.py). Protecting, unprotecting, releasing and retention need the admin
scope; holding and restoring need write; reading needs read."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from registry.governance import check_reason, check_retention
from registry.http.wire import API, record_to_wire
from registry.refs import validate_alias, validate_name, validate_version

from ..auth import Principal
from ..boundary import Body
from ..dependencies import Backend, Changed, admin, read, write

router = APIRouter(prefix=API)


class HoldBody(Body):
    reason: str


class RetentionBody(Body):
    keep_last: int | None = None
    max_age_s: int | None = None


@router.put("/models/{name}/aliases/{alias}/protection", tags=["governance"], status_code=204)
def protect_alias(name: str, alias: str, local: Backend, changed: Changed,
                  _caller: Principal = admin) -> Response:
    local.governance.protect_alias(validate_name(name), validate_alias(alias), True)
    changed()
    return Response(status_code=204)


@router.delete("/models/{name}/aliases/{alias}/protection", tags=["governance"],
               status_code=204)
def unprotect_alias(name: str, alias: str, local: Backend, changed: Changed,
                    _caller: Principal = admin) -> Response:
    local.governance.protect_alias(validate_name(name), validate_alias(alias), False)
    changed()
    return Response(status_code=204)


@router.put("/models/{name}/versions/{version}/hold", tags=["governance"])
def hold(name: str, version: str, body: HoldBody, local: Backend, changed: Changed,
         _caller: Principal = write) -> dict[str, Any]:
    record = local.governance.hold(validate_name(name), validate_version(version),
                                   check_reason(body.reason))
    changed()
    return record_to_wire(record)


@router.delete("/models/{name}/versions/{version}/hold", tags=["governance"])
def release(name: str, version: str, local: Backend, changed: Changed,
            _caller: Principal = admin) -> dict[str, Any]:
    record = local.governance.release(validate_name(name), validate_version(version))
    changed()
    return record_to_wire(record)


@router.put("/models/{name}/retention", tags=["governance"], status_code=204)
def set_retention(name: str, body: RetentionBody, local: Backend,
                  _caller: Principal = admin) -> Response:
    local.governance.set_retention(validate_name(name),
                                   check_retention(body.keep_last, body.max_age_s))
    return Response(status_code=204)


@router.delete("/models/{name}/retention", tags=["governance"], status_code=204)
def clear_retention(name: str, local: Backend, _caller: Principal = admin) -> Response:
    local.governance.set_retention(validate_name(name), None)
    return Response(status_code=204)


@router.post("/models/{name}/versions/{version}/restore", tags=["governance"])
def restore_version(name: str, version: str, local: Backend, changed: Changed,
                    _caller: Principal = write) -> dict[str, Any]:
    record = local.governance.restore_version(validate_name(name), validate_version(version))
    changed()
    return record_to_wire(record)


@router.get("/models/{name}/trash", tags=["governance"])
def model_trash(name: str, local: Backend, _caller: Principal = read) -> dict[str, Any]:
    return {"trash": [t.to_dict() for t in local.governance.trash(validate_name(name))]}


@router.get("/trash", tags=["governance"])
def trash(local: Backend, caller: Principal = read) -> dict[str, Any]:
    """Every model's trash, filtered to the models the caller may see."""
    return {"trash": [t.to_dict() for t in local.governance.trash()
                      if caller.may_see(t.name)]}


@router.get("/models/{name}/governance", tags=["governance"])
def state(name: str, local: Backend, _caller: Principal = read) -> dict[str, Any]:
    return local.governance.state(validate_name(name)).to_dict()
