"""Signature routes: ``GET /models/{name}/versions/{n}/signatures`` lists a version's signature
records; ``POST`` on the same path adds one (``{"record": {...}, "bundles": {digest: base64}}``),
checked by the server's signing policy (``server/signatures.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from registry.http.wire import API
from registry.refs import Ref, validate_name, validate_version
from registry.signing.remote import SIGNATURES_ROUTE, from_wire
from registry.trust.record_check import checked

from ..auth import Principal
from ..dependencies import Backend, Changed, Signing, read, write

router = APIRouter(prefix=API + SIGNATURES_ROUTE)


class SignatureBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    record: dict[str, Any]
    bundles: dict[str, str] = Field(max_length=2)


@router.get("", tags=["signatures"])
def list_signatures(name: str, version: str, local: Backend,
                    _caller: Principal = read) -> dict[str, Any]:
    """The signature records of a version (method, signer, time, bundle digests)."""
    name, number = validate_name(name), validate_version(version)
    local.resolve(Ref(name, version=number))  # NotFoundError for an unknown version
    return {"signatures": local.signatures.listed(name, number)}


@router.post("", tags=["signatures"])
def add_signature(name: str, version: str, body: SignatureBody, local: Backend,
                  policy: Signing, changed: Changed, _caller: Principal = write) -> dict[str, Any]:
    """Store a signature of an existing version (bundles inline, base64)."""
    name, number = validate_name(name), validate_version(version)
    manifest = checked(local.resolve(Ref(name, version=number))).manifest
    record, bundles = from_wire(body.model_dump(), f"signature of {name}:v{number}")
    kept = local.signatures.add(name, number, policy.check(record, bundles, manifest), bundles)
    changed()
    return {"signature": kept}
