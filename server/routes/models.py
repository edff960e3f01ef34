"""Model and version routes: reads (lists, one version, resolve) and changes to what is
already committed (aliases, tags, deletes)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from registry.http.wire import API, record_to_wire
from registry.refs import (
    MAX_VERSION,
    parse,
    validate_alias,
    validate_name,
    validate_tags,
    validate_version,
)
from registry.trust.validate import DEFAULT_PAGE, MAX_PAGE
from registry.versions import refuse_deleting_a_base

from ..auth import Principal, visible_models
from ..boundary import Body
from ..dependencies import Backend, Changed, read, write

log = logging.getLogger("registry.server")
router = APIRouter(prefix=API)

PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Items per page.")]


class AliasTarget(Body):
    version: int | str


class TagChanges(Body):
    tags: dict[str, str | None]


# -- reads -----------------------------------------------------------------------------------

@router.get("/models", tags=["models"])
def list_models(local: Backend, limit: PageSize = DEFAULT_PAGE,
                after: Annotated[str | None, Query(
                    max_length=128, description="The `next` of the previous page.")] = None,
                caller: Principal = read) -> dict[str, Any]:
    """Model names, sorted, one page at a time: pass ``next`` back as ``after``. A token
    limited to some models lists those only."""
    start = None if after is None else validate_name(after)
    names = visible_models(caller, lambda n, a: local.list_models(limit=n, after=a),
                           limit=limit + 1, after=start)
    return {"models": names[:limit], "next": names[limit - 1] if len(names) > limit else None}


@router.get("/models/{name}/versions", tags=["models"])
def list_versions(name: str, local: Backend, limit: PageSize = DEFAULT_PAGE,
                  after: Annotated[int | None, Query(
                      ge=0, le=MAX_VERSION,
                      description="The `next` of the previous page.")] = None,
                  _caller: Principal = read) -> dict[str, Any]:
    """Live versions, oldest first, one page at a time: pass ``next`` back as ``after``."""
    records = local.list_versions(validate_name(name), limit=limit + 1, after=after)
    return {"versions": [record_to_wire(r) for r in records[:limit]],
            "next": records[limit - 1].version if len(records) > limit else None}


@router.get("/models/{name}/versions/{version}", tags=["models"])
def show_version(name: str, version: str, local: Backend,
                 _caller: Principal = read) -> dict[str, Any]:
    ref = parse(f"{validate_name(name)}:v{validate_version(version)}")
    return record_to_wire(local.resolve(ref))


@router.get("/resolve", tags=["models"])
def resolve(ref: Annotated[str, Query(description="name, name:vN, name@alias, "
                                                  "name@sha256:<hex>")],
            local: Backend, request: Request, caller: Principal = read) -> dict[str, Any]:
    parsed = parse(ref)
    request.state.model = caller.check(parsed.name)  # the one model check (server/auth.py)
    return record_to_wire(local.resolve(parsed))


# -- changes ---------------------------------------------------------------------------------

@router.put("/models/{name}/aliases/{alias}", tags=["aliases"])
def set_alias(name: str, alias: str, body: AliasTarget, local: Backend, changed: Changed,
              caller: Principal = write) -> dict[str, Any]:
    """Point an alias at a version; a protected alias moves for an admin token only (403)."""
    record = local.set_alias(validate_name(name), validate_alias(alias),
                             validate_version(body.version), force="admin" in caller.scopes)
    changed()
    return record_to_wire(record)


@router.delete("/models/{name}/aliases/{alias}", tags=["aliases"], status_code=204)
def delete_alias(name: str, alias: str, local: Backend, changed: Changed,
                 caller: Principal = write) -> Response:
    """Remove an alias; a protected one for an admin token only (403)."""
    local.delete_alias(validate_name(name), validate_alias(alias),
                       force="admin" in caller.scopes)
    changed()
    return Response(status_code=204)


@router.patch("/models/{name}/versions/{version}/tags", tags=["models"])
def set_tags(name: str, version: str, body: TagChanges, local: Backend, changed: Changed,
             _caller: Principal = write) -> dict[str, Any]:
    name, number = validate_name(name), validate_version(version)
    record = local.set_tags(name, number, validate_tags(body.tags, removals=True))
    changed()
    return record_to_wire(record)


@router.delete("/models/{name}/versions/{version}", tags=["models"])
def delete_version(name: str, version: str, local: Backend, changed: Changed,
                   caller: Principal = write,
                   force: Annotated[bool, Query(description="Delete even if aliases or "
                                                "adapters point at the version.")] = False,
                   ) -> dict[str, Any]:
    name, number = validate_name(name), validate_version(version)
    if not force:  # adapters over it keep their base (409, names them and `force`)
        refuse_deleting_a_base(local, name, number, shown=caller.may_see)
    # To the trash; one a protected alias points at needs an admin token too, a held one no one.
    record = local.delete_version(name, number, force=force,
                                  protected_ok="admin" in caller.scopes)
    log.info("%s:v%d deleted by %s", name, number, caller)
    changed()
    return record_to_wire(record)
