"""The REST shapes that the server (server/app.py) and the remote client (remote.py) share.

One module for both sides of the wire, so a field, a status or an error code cannot drift:

- ``API`` is the prefix of every route (``/api/v1``);
- a version travels as :func:`record_to_wire` JSON and comes back through :func:`record_from_wire`,
  which checks every field;
- an error travels as ``{"error": {"code", "message"}}`` with the status :func:`status_for` gives
  its class, and :func:`error_class` turns the code back into the same ``RegistryError`` class.
"""

from __future__ import annotations

from typing import Any

from ..catalog.records import VersionRecord
from ..errors import (
    ERRORS_BY_CODE,
    AliasProtectedError,
    CatalogUnavailableError,
    DigestMismatchError,
    ForbiddenError,
    NotFoundError,
    ReferencedVersionError,
    RegistryError,
    SchemaOutOfDateError,
    StoreUnavailableError,
    UnauthorizedError,
    UnexpectedUploadError,
    VersionAliasedError,
    VersionExistsError,
    VersionHeldError,
)
from ..trust.validate import answer_record

API = "/api/v1"
# The header of a push's begin and commit that names the push (catalog/pushes.py): a begin with
# a key the model holds answers that push's version instead of reserving another.
IDEMPOTENCY_HEADER = "Idempotency-Key"
# A version's exports: GET lists their records, POST registers one (server/exports.py).
EXPORTS_ROUTE = "/models/{name}/versions/{version}/exports"

# Status of each error class (the first match wins); any other RegistryError is a 400.
STATUS: list[tuple[type[RegistryError], int]] = [
    (UnauthorizedError, 401),
    (ForbiddenError, 403),
    (AliasProtectedError, 403),
    (VersionHeldError, 409),
    (NotFoundError, 404),
    (VersionExistsError, 409),
    (VersionAliasedError, 409),
    (ReferencedVersionError, 409),
    (UnexpectedUploadError, 409),
    (DigestMismatchError, 422),
    (StoreUnavailableError, 503),
    (CatalogUnavailableError, 503),
    (SchemaOutOfDateError, 503),
]


def status_for(exc: RegistryError) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 400


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def error_class(code: str) -> type[RegistryError]:
    """The RegistryError subclass a server's error code names (the root class if unknown)."""
    return ERRORS_BY_CODE.get(code) or RegistryError


def record_to_wire(record: VersionRecord) -> dict[str, Any]:
    """The JSON form of a VersionRecord on the wire (server side)."""
    return {"name": record.name, "version": record.version, "digest": record.digest,
            "size_bytes": record.size_bytes, "manifest": record.manifest,
            "tags": record.tags, "aliases": record.aliases}


def record_from_wire(data: object) -> VersionRecord:
    """A VersionRecord from a server's JSON (client side): every field is checked first
    (``validate.answer_record``), so a hostile or broken answer is a RegistryError."""
    return answer_record(data)
