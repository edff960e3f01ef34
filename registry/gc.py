"""Garbage collection: which stored bytes nothing needs any more, and why deleting them is safe
beside pushes that run at the same moment.

A blob is deleted only when all of these hold, checked in this order:

1. no ready version, no push in progress younger than the grace, and no export lists its
   digest; this is read once to choose candidates and again just before deleting, so a push
   that reserved its files meanwhile keeps them;
2. the store says the blob was last written or touched longer ago than the grace
   (``REGISTRY_GC_GRACE``, default ``6h``), asked again right before its delete. A push that
   reuses a stored blob touches it (``ObjectStore.touch``) before it relies on it, so a blob
   a push has just chosen to reuse is young and stays;
3. and should a blob still vanish under a push (a gc that chose it before the push existed),
   ``commit_push`` checks every blob again after writing the manifest and undoes the version
   (``MissingBlobError``); the embedded push then uploads the blob again and commits.

Crash hygiene: a push killed after writing its staging file, a server upload cut off, a
download that died halfway each leave a temporary file. Those older than the grace (so no live
process is still writing them) are removed and reported; a crashed push's reservation is dropped
by the same rule (``Catalog.drop_stale_pending``), with the manifest it may have written before
it died (else `registry db rebuild` would restore a version whose blobs gc freed).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from .caching.cache import BlobCache
from .errors import RefError
from .store import ObjectStore, layout
from .store.layout import blob_digest, parse_blob_key

log = logging.getLogger(__name__)

DEFAULT_GRACE = timedelta(hours=6)


@dataclass
class GcReport:
    """What ``gc`` removed, and what it kept because it was too young to judge."""

    deleted: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    kept: int = 0
    stale_pushes: int = 0
    young: int = 0
    # Temporary files of crashed pushes, uploads and downloads removed, and their bytes.
    temporary_files: int = 0
    temporary_bytes: int = 0
    # Objects under blobs/ that are not blobs/sha256/<hex>: skipped, never deleted (named in
    # the log), so one stray object cannot stop every gc.
    unknown: int = 0
    # Store writes a commit owed and gc made (manifests, tombstones, alias tables), and
    # manifests of versions neither committed nor pending that gc removed.
    reconciled: list[str] = field(default_factory=list)
    orphan_manifests: list[str] = field(default_factory=list)
    # Versions retention policies moved to the trash, and versions purged from the trash
    # (past REGISTRY_TRASH_DAYS) before the blobs were collected (registry/governance.py).
    expired: list[str] = field(default_factory=list)
    purged: list[str] = field(default_factory=list)


def collect(store: ObjectStore, referenced: Callable[[], set[str]], *, grace: timedelta,
            drop_stale: Callable[[], int], cache_blobs: Path | None,
            temporary_dirs: Iterable[Path]) -> GcReport:
    """Delete what nothing references from ``store`` and the local cache (rules above)."""
    report = GcReport(stale_pushes=drop_stale())
    now = datetime.now(timezone.utc)
    keep = referenced()
    candidates = []
    for key in list(store.list(layout.BLOBS)):
        if parse_blob_key(key) is None:
            log.warning("gc skipped %r: not a blob key (blobs/sha256/<hex>)", key[:200])
            report.unknown += 1
        elif blob_digest(key) in keep:
            report.kept += 1
        else:
            candidates.append(key)
    keep = referenced() if candidates else keep
    for key in candidates:
        if blob_digest(key) in keep:
            report.kept += 1
            continue
        modified = store.modified(key)
        if modified is None:
            continue  # someone else removed it
        if now - modified < grace:
            report.young += 1
            continue
        size = store.has(key) or 0
        store.delete(key)
        store.delete(layout.checked_key(blob_digest(key)))  # its marker goes with it
        report.deleted.append(blob_digest(key))
        report.freed_bytes += size
    _orphan_markers(store, keep, now, grace)
    if cache_blobs is not None and cache_blobs.is_dir():
        cache = BlobCache(cache_blobs.parent)
        for path in cache_blobs.glob("*/*"):
            digest = f"{path.parent.name}:{path.name}"
            if digest in keep:
                continue
            try:
                cache.try_remove(digest)  # a blob a pull reads or downloads now stays
            except RefError:
                path.unlink(missing_ok=True)  # not a blob's name: nothing locks it
    for directory in dict.fromkeys(temporary_dirs):
        _sweep(directory, now - grace, report)
    log.info("gc deleted %d blobs (%d bytes), kept %d (%d younger than %s), removed %d "
             "temporary files (%d bytes)", len(report.deleted), report.freed_bytes, report.kept,
             report.young, grace, report.temporary_files, report.temporary_bytes)
    return report


def _orphan_markers(store: ObjectStore, keep: set[str], now: datetime,
                    grace: timedelta) -> None:
    """``checked/sha256/<hex>`` markers whose blob is gone (an older gc deleted the blob and
    left its marker), past the grace: deleted."""
    for key in list(store.list(layout.CHECKED)):
        digest = "sha256:" + key.rpartition("/")[2]
        try:
            blob = layout.blob_key(digest)
        except RefError:
            continue  # not a marker name: left alone
        if digest in keep or store.has(blob) is not None:
            continue
        modified = store.modified(key)
        if modified is not None and now - modified >= grace:
            store.delete(key)


def orphan_manifests(store: ObjectStore,
                     states: dict[tuple[str, int], tuple[str, datetime]], *,
                     grace: timedelta) -> list[str]:
    """Delete manifests of versions the catalog neither holds nor has a push in progress for
    (``states``: (name, version) -> (state, reserved at)), once older than ``grace``; return
    their keys. Such a manifest can only be left by a crash of an older registry, which wrote
    manifests before the commit; `db rebuild` would otherwise restore a version never
    visible, whose blobs gc freed."""
    now = datetime.now(timezone.utc)
    removed = []
    for key in list(store.list(layout.MANIFESTS)):
        try:
            name, version, suffix = layout.parse_manifest_key(key)
        except ValueError:
            continue  # not ours to judge: `db rebuild` names it
        if suffix != layout.MANIFEST or (name, version) in states:
            continue  # ready; pending (in progress, or dropped by its grace); deleted (the
            # tombstone written by reconcile says so)
        modified = store.modified(key)
        if modified is None or now - modified < grace:
            continue
        store.delete(key)
        removed.append(key)
        log.info("gc removed %s: no such version was committed", key)
    return removed


def _sweep(directory: Path, cutoff: datetime, report: GcReport) -> None:
    """Remove files under ``directory`` last written before ``cutoff``."""
    if not directory.is_dir():
        return
    limit = cutoff.timestamp()
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(root, name)
            try:
                st = path.lstat()
                if st.st_mtime >= limit:
                    continue
                path.unlink()
            except FileNotFoundError:
                continue
            log.info("gc removed %s (%d bytes, left by a crashed process)", path, st.st_size)
            report.temporary_files += 1
            report.temporary_bytes += st.st_size
