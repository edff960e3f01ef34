"""Exports over a :class:`~registry.remote.RemoteBackend`: the client exported and verified the
artifact; the server stores the blob (by presigned URL or through itself) and the record.
Every field of every answer is checked before it is used."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..errors import RegistryError
from ..validate import answer_field
from ..wire import EXPORTS_ROUTE
from . import records

if TYPE_CHECKING:
    from ..remote import RemoteBackend


def _path(name: str, version: int) -> str:
    return EXPORTS_ROUTE.format(name=quote(name, safe=""), version=version)


def list_exports(remote: RemoteBackend, name: str, version: int) -> list[dict[str, Any]]:
    answer = remote._call("GET", _path(name, version))
    return answer_field(answer, "export list", "exports",
                        lambda v: records.check_list(v, "the server's export list"))


def register(remote: RemoteBackend, name: str, version: int, record: dict[str, Any],
             path: Path) -> dict[str, Any]:
    """Register an export; when the server lacks the blob it answers with an upload target
    first, then the client uploads and registers again."""
    from ..remote import _upload_targets

    digest, size = record["digest"], record["size"]
    for attempt in range(2):
        answer = remote._call("POST", _path(name, version), json={"record": record})
        uploads = answer_field(answer, "export answer", "uploads",
                               lambda v: _upload_targets(v, {digest: path}))
        if not uploads:
            kept = answer_field(answer, "export answer", "export",
                                lambda v: records.check(v, "the server's export answer"))
            if kept["key"] != record["key"]:
                raise RegistryError(f"registry server {remote.url} answered an export "
                                    f"registration with another export ({kept['key'][:12]}); "
                                    "is REGISTRY_URI a registry server of this version?")
            if kept["digest"] == digest:
                remote._keep_in_cache(path, digest)
            return kept
        if attempt == 0:
            remote._upload(uploads[0][0], path, size, digest)
    raise RegistryError(f"registry server {remote.url} still lacks export blob {digest} after "
                        "it was uploaded; retry the export")
