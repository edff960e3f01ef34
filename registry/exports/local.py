"""Exports over a :class:`~registry.backends.LocalBackend`: the blob in the store, the record in
the catalog and in ``manifests/<name>/v<N>.exports.json``. The server calls these too, so an
export is registered one way whether it comes in-process or over HTTP."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import manifest as mf
from .. import validate
from ..catalog import exports as rows
from ..errors import NotFoundError
from ..files import StagedFile, VersionFile
from . import records

if TYPE_CHECKING:
    from ..backends import LocalBackend


def list_exports(local: LocalBackend, name: str, version: int) -> list[dict[str, Any]]:
    """The export records of ``name:vN``, each checked (a catalog row is read from outside too:
    a hand-edited or half-migrated one is a ManifestError naming it, never a KeyError)."""
    return records.check_list(rows.list_exports(local.catalog, name, version),
                              f"the catalog's exports of {name}:v{version}")


def register(local: LocalBackend, name: str, version: int, record: dict[str, Any],
             path: Path | None = None) -> dict[str, Any]:
    """Record an export of ``name:vN`` whose blob is ``path`` (consumed) or already stored.

    The catalog row comes first, so a gc running meanwhile keeps the blob being uploaded; then
    the blob; then the store's exports file is rewritten from the catalog, so `db rebuild`
    restores what the catalog lists. When the same options were recorded meanwhile (another
    process exported the same thing), that record stays and is returned."""
    record = records.check(record, f"export of {name}:v{version}")
    key = mf.blob_key(record["digest"])
    if path is None and local.store.has(key) != record["size"]:
        raise NotFoundError(f"export blob {record['digest']} of {name}:v{version} is not in the "
                            f"store ({record['size']} bytes expected); upload it first")
    kept, inserted = rows.add_export(local.catalog, name, version, record)
    if path is not None:
        try:
            if kept["digest"] != record["digest"] or local.store.has(key) == record["size"]:
                path.unlink(missing_ok=True)
            else:
                local.upload(StagedFile(path, VersionFile("export", record["format"],
                                                          record["digest"], record["size"])))
        except BaseException:
            if inserted:
                with contextlib.suppress(Exception):
                    rows.remove_export(local.catalog, name, version, record["key"])
            raise
    write_store_file(local, name, version)
    with contextlib.suppress(Exception):
        local.catalog.set_mirror_state(name, version, None)  # the mirror tags export formats
    return kept


def write_store_file(local: LocalBackend, name: str, version: int) -> None:
    listed = rows.list_exports(local.catalog, name, version)
    local.store.put_bytes(records.store_key(name, version), records.dumps(name, version, listed))


def drop(local: LocalBackend, name: str, version: int) -> None:
    """Forget the exports of a deleted version (gc then reclaims their blobs)."""
    rows.drop_exports(local.catalog, name, version)
    local.store.delete(records.store_key(name, version))


def referenced(local: LocalBackend) -> set[str]:
    return rows.export_digests(local.catalog)


def stored(local: LocalBackend) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """Every ``.exports.json`` in the store, checked (``registry db rebuild`` reads them all
    before it changes the catalog, so a hostile one refuses the rebuild and changes nothing)."""
    found: list[tuple[str, int, list[dict[str, Any]]]] = []
    for key in local.store.list("manifests/"):
        name, version, suffix = validate.manifest_key(key)
        if suffix != ".exports.json":
            continue
        data = validate.stored_bytes(local.store.has(key), key, local.store.get_bytes)
        found.append((name, version, records.loads(data, name, version, key)))
    return found


def restore(local: LocalBackend, found: list[tuple[str, int, list[dict[str, Any]]]]) -> int:
    """Catalog rows for the exports :func:`stored` read, once the versions were restored."""
    return rows.restore_exports(local.catalog, found)
