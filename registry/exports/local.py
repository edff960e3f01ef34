"""Exports over a catalog and an object store: the blob in the store, the record in the catalog
and in ``manifests/<name>/v<N>.exports.json``. :class:`LocalExports` is built and owned by
:class:`~registry.backends.LocalBackend` (``backend.exports``); the server calls it too, so an
export is registered one way whether it comes in-process or over HTTP."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .. import manifest as mf
from ..caching.cache import VerifiedFiles
from ..errors import NotFoundError
from ..store import ObjectStore, layout
from ..trust import validate
from . import records

if TYPE_CHECKING:
    from ..catalog.repository import Catalog

Stored = list[tuple[str, int, list[dict[str, Any]]]]


class LocalExports:
    """The exports of the versions of one catalog and store; ``verified`` remembers the hash of
    a blob stored on this filesystem, as a push's upload does."""

    def __init__(self, catalog: Catalog, store: ObjectStore, verified: VerifiedFiles) -> None:
        self.catalog = catalog
        self.store = store
        self.verified = verified

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]:
        """The export records of ``name:vN``, each checked (a catalog row is read from outside
        too: a hand-edited or half-migrated one is a ManifestError naming it, never a
        KeyError)."""
        return records.check_list(self.catalog.list_exports(name, version),
                                  f"the catalog's exports of {name}:v{version}")

    def register(self, name: str, version: int, record: dict[str, Any],
                 path: Path | None = None) -> dict[str, Any]:
        """Record an export of ``name:vN`` whose blob is ``path`` (consumed) or already stored.

        The catalog row comes first, so a gc running meanwhile keeps the blob being uploaded;
        then the blob; then the store's exports file is rewritten from the catalog, so `db
        rebuild` restores what the catalog lists. When the same options were recorded meanwhile
        (another process exported the same thing), that record stays and is returned."""
        record = records.check(record, f"export of {name}:v{version}")
        key = mf.blob_key(record["digest"])
        if path is None and self.store.has(key) != record["size"]:
            raise NotFoundError(f"export blob {record['digest']} of {name}:v{version} is not in "
                                f"the store ({record['size']} bytes expected); upload it first")
        kept, inserted = self.catalog.add_export(name, version, record)
        if path is not None:
            try:
                if kept["digest"] != record["digest"] or self.store.has(key) == record["size"]:
                    path.unlink(missing_ok=True)
                else:
                    self._store_blob(key, path, record["digest"])
            except BaseException:
                if inserted:
                    with contextlib.suppress(Exception):
                        self.catalog.remove_export(name, version, record["key"])
                raise
        self.write_store_file(name, version)
        with contextlib.suppress(Exception):
            self.catalog.set_mirror_state(name, version, None)  # the mirror tags export formats
        return kept

    def _store_blob(self, key: str, path: Path, digest: str) -> None:
        """Store the blob at ``path`` (consumed), whose bytes the export hashed to ``digest``."""
        self.store.put_file(key, path, move=True)
        local = self.store.open_local(key)
        if local is not None:
            self.verified.remember(local, digest)

    def write_store_file(self, name: str, version: int) -> None:
        listed = self.catalog.list_exports(name, version)
        self.store.put_bytes(records.store_key(name, version),
                             records.dumps(name, version, listed))

    def drop(self, name: str, version: int) -> None:
        """Forget the exports of a deleted version (gc then reclaims their blobs)."""
        self.catalog.drop_exports(name, version)
        self.store.delete(records.store_key(name, version))

    def referenced(self) -> set[str]:
        """The blobs the exports of live versions hold (gc keeps them)."""
        return self.catalog.export_digests()

    def stored(self) -> Stored:
        """Every ``.exports.json`` in the store, checked (``registry db rebuild`` reads them all
        before it changes the catalog, so a hostile one refuses the rebuild and changes
        nothing)."""
        found: Stored = []
        for key in self.store.list(layout.MANIFESTS):
            name, version, suffix = layout.parse_manifest_key(key)
            if suffix != layout.EXPORTS:
                continue
            data = validate.stored_bytes(self.store.has(key), key, self.store.get_bytes)
            found.append((name, version, records.loads(data, name, version, key)))
        return found

    def restore(self, found: Stored) -> int:
        """Catalog rows for the exports :meth:`stored` read, once the versions were restored."""
        return self.catalog.restore_exports(found)


class HasExports(Protocol):
    """A backend that owns a :class:`LocalExports` (LocalBackend)."""

    exports: LocalExports


def list_exports(local: HasExports, name: str, version: int) -> list[dict[str, Any]]:
    """``local.exports.list_exports``: kept for the server's routes (server/exports.py)."""
    return local.exports.list_exports(name, version)


def register(local: HasExports, name: str, version: int, record: dict[str, Any],
             path: Path | None = None) -> dict[str, Any]:
    """``local.exports.register``: kept for the server's routes (server/exports.py)."""
    return local.exports.register(name, version, record, path)
