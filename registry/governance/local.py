"""Governance over a catalog and a store (the embedded registry and the server): each change
in the catalog (whose operations hold the checks), then the store's copies of it; gc's sweep
of retention policies and the trash."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from ..store import layout
from . import ModelGovernance, Retention, Trashed, check_reason

if TYPE_CHECKING:
    from ..catalog.records import VersionRecord
    from ..catalog.repository import Catalog
    from ..exports.local import LocalExports
    from ..publish import Copies
    from ..store import ObjectStore


class LocalGovernance:
    """Governance over a catalog and a store: each change in the catalog, then its copies."""

    def __init__(self, catalog: Catalog, store: ObjectStore, copies: Copies,
                 exports: LocalExports, *, trash_window: timedelta) -> None:
        self.catalog = catalog
        self.store = store
        self.copies = copies
        self.exports = exports
        self.trash_window = trash_window

    def _publish(self, name: str, versions: tuple[int, ...] = ()) -> None:
        self.copies.publish(self.catalog, self.store, name, versions, aliases=True,
                            governance=True)

    def protect_alias(self, name: str, alias: str, protected: bool) -> None:
        if self.catalog.protect_alias(name, alias, protected):
            self._publish(name)

    def hold(self, name: str, version: int, reason: str) -> VersionRecord:
        record = self.catalog.hold(name, version, check_reason(reason))
        self._publish(name)
        return record

    def release(self, name: str, version: int) -> VersionRecord:
        record = self.catalog.release(name, version)
        self._publish(name)
        return record

    def set_retention(self, name: str, policy: Retention | None) -> None:
        self.catalog.set_retention(name, policy)
        self._publish(name)

    def restore_version(self, name: str, version: int) -> VersionRecord:
        record = self.catalog.restore_version(name, version, self.trash_window)
        self._publish(name, (version,))
        return record

    def trash(self, name: str | None = None) -> list[Trashed]:
        return self.catalog.trashed(name, self.trash_window)

    def state(self, name: str) -> ModelGovernance:
        return self.catalog.governance(name)

    def trashed(self, name: str, version: int) -> None:
        """After ``delete_version`` moved ``name:vN`` to the trash: the store's copies say so
        (its manifest stays, for a restore or a rebuild)."""
        self._publish(name)

    def sweep(self) -> tuple[list[str], list[str]]:
        """gc's first step: trash what retention policies expire, then purge the trash past
        its window (tombstone, manifest and exports gone; the blobs are gc's next step).
        Returns the refs expired and purged."""
        expired = self.catalog.expire()
        for name in sorted({n for n, _ in expired}):
            self._publish(name)
        purged = self.catalog.purge_trash(self.trash_window)
        for name, version in purged:
            self.store.put_bytes(layout.tombstone_key(name, version), b"")
            self.store.delete(layout.manifest_key(name, version))
            self.exports.drop(name, version)
        for name in sorted({n for n, _ in purged}):
            self._publish(name)
        return [f"{n}:v{v}" for n, v in expired], [f"{n}:v{v}" for n, v in purged]


