"""Exports over a registry server: the client exported and verified the artifact; the server
stores the blob (by presigned URL or through itself) and the record. Every field of every answer
is checked before it is used. :class:`RemoteExports` is built by
:class:`~registry.http.remote.RemoteBackend` over the transport it shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import RegistryError
from ..http.transport import Transport, segment, upload_targets
from ..http.wire import EXPORTS_ROUTE
from ..trust.validate import answer_field
from . import records


def _path(name: str, version: int) -> str:
    return EXPORTS_ROUTE.format(name=segment(name), version=version)


class RemoteExports:
    """The exports of one registry server's versions."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]:
        answer = self.transport.call("GET", _path(name, version))
        return answer_field(answer, "export list", "exports",
                            lambda v: records.check_list(v, "the server's export list"))

    def register(self, name: str, version: int, record: dict[str, Any],
                 path: Path) -> dict[str, Any]:
        """Register an export; when the server lacks the blob it answers with an upload target
        first, then the client uploads and registers again."""
        digest, size = record["digest"], record["size"]
        for attempt in range(2):
            answer = self.transport.call("POST", _path(name, version), json={"record": record})
            uploads = answer_field(answer, "export answer", "uploads",
                                   lambda v: upload_targets(v, {digest: path}))
            if not uploads:
                kept = answer_field(answer, "export answer", "export",
                                    lambda v: records.check(v, "the server's export answer"))
                if kept["key"] != record["key"]:
                    raise RegistryError(
                        f"registry server {self.transport.url} answered an export registration "
                        f"with another export ({kept['key'][:12]}); is REGISTRY_URI a registry "
                        "server of this version?")
                if kept["digest"] == digest:
                    self.transport.keep_in_cache(path, digest)
                return kept
            if attempt == 0:
                self.transport.upload(uploads[0][0], path, size, digest)
        raise RegistryError(f"registry server {self.transport.url} still lacks export blob "
                            f"{digest} after it was uploaded; retry the export")
