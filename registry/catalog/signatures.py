"""Catalog rows of signatures (mixed into :class:`registry.catalog.repository.Catalog`): each
bundle of a version is a version file of role ``signature`` (``registry_version_files``), so gc
keeps it for as long as the version lives and no new table is needed. What a signature says
(method, signer, time) lives in the store's ``manifests/<name>/v<N>.signatures.json``
(registry/signing/local.py), which calls these as methods of the catalog it was given: `import
registry` loads that module, and must not load sqlalchemy with it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..events import current_actor
from ..files import VersionFile
from .events import append_event
from .models import ModelRow, VersionFileRow, VersionRow, live_version_id

ROLE = "signature"


class SignatureFiles:
    """Catalog methods of the bundle rows of signatures."""

    session: Callable[[], AbstractContextManager[Session]]
    version_row: Callable[[Session, str, int], VersionRow]

    def add_signature_files(self, name: str, version: int, files: Iterable[VersionFile]) -> None:
        """Rows for the bundles of ``name:vN`` (NotFoundError if it is not a live version); a
        row already there (the same bundle signed again) is kept as it is."""
        with self.session() as s:
            row = self.version_row(s, name, version)
            have = set(s.scalars(select(VersionFileRow.name).where(
                VersionFileRow.version_id == row.id, VersionFileRow.role == ROLE)).all())
            added = []
            for f in files:
                if f.name not in have:
                    have.add(f.name)
                    added.append(f)
                    s.add(VersionFileRow(version_id=row.id, role=ROLE, name=f.name,
                                         digest=f.digest, size=f.size))
            if added:
                append_event(s, kind="signature.added", name=name, version=version,
                             actor=current_actor(),
                             details={"files": [{"name": f.name, "digest": f.digest}
                                                for f in added]})

    @contextmanager
    def signatures_locked(self, name: str) -> Iterator[None]:
        """Hold ``name``'s write lock (the one every change of the model and the store's copies
        of it take, catalog/copies.py) while the body runs: two signers' read, append and write
        of the store's list of records run one after the other, and neither record is lost."""
        with self.session() as s:
            s.scalar(select(ModelRow).where(ModelRow.name == name).with_for_update())
            yield

    def has_signature_files(self, name: str, version: int) -> bool:
        """Whether ``name:vN`` has bundle rows: a pull of an unsigned version asks the catalog
        it already reads, not the store (a round trip to S3 on every pull)."""
        with self.session() as s:
            return s.scalar(select(VersionFileRow.id)
                            .join(VersionRow, VersionRow.id == VersionFileRow.version_id)
                            .join(ModelRow, ModelRow.id == VersionRow.model_id)
                            .where(ModelRow.name == name, VersionRow.version == version,
                                   VersionFileRow.role == ROLE).limit(1)) is not None

    def restore_signature_files(self,
                                found: Iterable[tuple[str, int, list[VersionFile]]]) -> int:
        """Rows for the bundles the store lists (``registry db rebuild``), for live versions."""
        count = 0
        with self.session() as s:
            s.execute(delete(VersionFileRow).where(VersionFileRow.role == ROLE))
            for name, version, files in found:
                version_id = live_version_id(s, name, version)
                if version_id is None:
                    continue
                for f in {f.name: f for f in files}.values():
                    s.add(VersionFileRow(version_id=version_id, role=ROLE, name=f.name,
                                         digest=f.digest, size=f.size))
                    count += 1
        return count
