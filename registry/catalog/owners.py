"""Which models own a blob, and whether a model exists (mixed into
:class:`registry.catalog.repository.Catalog`).

A server with per-model token scopes (server/auth.py) serves a blob by digest only to a caller
who may see a model owning it: a file of a live version (weights, attached file, signature
bundle), an export of one, or, for uploads, a file of a push in progress. These answer that in
one indexed query each (``ix_registry_version_files_digest``, ``ix_registry_exports_digest``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import PENDING, READY, ExportRow, ModelRow, VersionFileRow, VersionRow


class BlobOwners:
    """Catalog methods that name the models behind blobs."""

    session: Callable[[], AbstractContextManager[Session]]

    def blob_owners(self, digests: Iterable[str], *,
                    state: Literal["ready", "pending", "any"] = "ready",
                    ) -> dict[str, set[str]]:
        """For each of ``digests``, the names of the models whose live versions own it (files
        and exports); with ``state="pending"``, those whose pushes in progress list it; with
        ``"any"``, every version that lists it, whatever its state."""
        wanted = sorted(set(digests))
        owners: dict[str, set[str]] = {d: set() for d in wanted}
        if not wanted:
            return owners
        with self.session() as s:
            files = (select(VersionFileRow.digest, ModelRow.name).distinct()
                     .join(VersionRow, VersionRow.id == VersionFileRow.version_id)
                     .join(ModelRow, ModelRow.id == VersionRow.model_id)
                     .where(VersionFileRow.digest.in_(wanted)))
            exports = (select(ExportRow.digest, ModelRow.name).distinct()
                       .join(VersionRow, VersionRow.id == ExportRow.version_id)
                       .join(ModelRow, ModelRow.id == VersionRow.model_id)
                       .where(ExportRow.digest.in_(wanted)))
            if state != "any":
                files = files.where(VersionRow.state == (READY if state == "ready" else PENDING))
                exports = exports.where(VersionRow.state == READY)
            rows = list(s.execute(files))
            if state != "pending":
                rows += s.execute(exports)
        for digest, name in rows:
            owners[digest].add(name)
        return owners

    def model_exists(self, name: str) -> bool:
        """Whether the catalog has ever held model ``name`` (live versions or not)."""
        with self.session() as s:
            return s.scalar(select(ModelRow.id).where(ModelRow.name == name)) is not None
