"""Backends: where the push and pull pipelines send their catalog and store operations.

``LocalBackend`` pairs a SQL catalog with an object store; the embedded registry and the server
both run on it, so each operation has one implementation.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from . import manifest as mf
from ._progress import transfer
from .audit import CatalogEvents, EventReader
from .caching.cache import BlobCache, VerifiedFiles
from .caching.unchanged import KnownShard, known_shards
from .catalog.records import VersionRecord
from .errors import MissingBlobError, NotFoundError, UnexpectedUploadError
from .exports.local import LocalExports
from .files import (
    StagedFile,
    VersionFile,
    total_size,
    unique_by_digest,
    version_files,
    weights_digest,
)
from .gc import DEFAULT_GRACE, GcReport, collect, orphan_manifests
from .governance import GovernanceOps
from .governance.local import LocalGovernance
from .io.parallel import UPLOAD_CONCURRENCY, concurrently
from .publish import Copies, rebuild
from .refs import Ref
from .settings import DEFAULT_PUSH_LEASE, DEFAULT_TRASH_DAYS, Settings, redact_url
from .signing import LocalSignatures, SignatureStore
from .store import ObjectStore, Presigning, Staging, open_store
from .webhooks.local import WebhookStore, webhooks_for

if TYPE_CHECKING:
    from .catalog.pushes import Reservation
    from .catalog.repository import Catalog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PushResult:
    """A committed push: the version, and which of its blobs had to be uploaded."""

    record: VersionRecord
    files: list[VersionFile]
    uploaded: list[VersionFile]
    # Store keys the push committed but could not write yet (registry/publish.py).
    deferred: list[str] = field(default_factory=list)

    def report(self) -> dict[str, int]:
        """What ``metadata["push"]`` says (the stored manifest never depends on it)."""
        weights = [f for f in self.files if f.role == "weights"]
        sent = [f for f in self.uploaded if f.role == "weights"]
        owed = {"store_writes_owed": len(self.deferred)} if self.deferred else {}
        return {"shards": len(weights), "shards_uploaded": len(sent),
                "bytes": total_size(weights), "bytes_uploaded": total_size(sent),
                "files": len(self.files) - len(weights),
                "files_uploaded": len(self.uploaded) - len(sent), **owed}


class Backend(Protocol):
    """What the Registry facade needs; LocalBackend and the server's remote client implement it."""

    def staging_dir(self) -> Path: ...

    def known_shards(self, name: str) -> list[KnownShard]: ...

    def push(self, name: str, version: int | None, staged: Sequence[StagedFile],
             manifest_for: Callable[[int], dict[str, Any]], tags: dict[str, str],
             aliases: Iterable[str], *, idempotency_key: str | None = None) -> PushResult: ...

    def resolve(self, ref: Ref) -> VersionRecord: ...

    def blob_path(self, digest: str, size: int) -> Path: ...

    def open_blob(self, digest: str, size: int) -> BinaryIO: ...

    def list_models(self) -> list[str]: ...
    def list_versions(self, name: str) -> list[VersionRecord]: ...
    def set_alias(self, name: str, alias: str, version: int, *,
                  force: bool = False) -> VersionRecord: ...
    def delete_alias(self, name: str, alias: str, *, force: bool = False) -> None: ...
    def set_tags(self, name: str, version: int, tags: dict[str, str | None]) -> VersionRecord: ...
    def delete_version(self, name: str, version: int, *,
                       force: bool = False) -> VersionRecord: ...

    @property
    def audit(self) -> EventReader: ...  # the event log (registry/audit.py)

    def gc(self) -> GcReport: ...
    def rebuild(self) -> int: ...

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]: ...

    def register_export(self, name: str, version: int, record: dict[str, Any],
                        path: Path) -> dict[str, Any]: ...
    @property
    def signatures(self) -> SignatureStore: ...  # records and bundles (registry/signing)
    @property
    def webhooks(self) -> WebhookStore: ...  # subscriptions and deliveries (registry/webhooks)
    @property
    def governance(self) -> GovernanceOps: ...  # protection, holds, retention, trash

    def close(self) -> None: ...


class LocalBackend:
    """A SQL catalog plus an object store, driven in-process."""

    def __init__(self, catalog: Catalog, store: ObjectStore, cache_dir: Path, *,
                 grace: timedelta = DEFAULT_GRACE, lease: timedelta = DEFAULT_PUSH_LEASE,
                 trash: timedelta = timedelta(days=DEFAULT_TRASH_DAYS),
                 settings: Settings | None = None) -> None:
        self.catalog = catalog
        self.store = store
        # How long a reservation, a temporary file or an unreferenced blob is left to its
        # writer before gc may remove it (REGISTRY_GC_GRACE; registry/gc.py); a reservation
        # silent for ``lease`` is released sooner (REGISTRY_PUSH_LEASE; catalog/leases.py).
        self.grace = grace
        self.lease = lease
        self.cache = BlobCache(cache_dir)
        self.verified = VerifiedFiles(cache_dir / "verified")
        self.signatures = LocalSignatures(catalog, store)
        self.exports = LocalExports(catalog, store, self.verified)
        # The store's copies of catalog facts, and what a failed write left owed.
        self.copies = Copies()
        self.audit = CatalogEvents(catalog)
        self.governance = LocalGovernance(catalog, store, self.copies, self.exports,
                                          trash_window=trash)  # REGISTRY_TRASH_DAYS
        # Each committed event is copied to the store (events/<id>.json) for `db rebuild`.
        catalog.event_sinks.append(lambda events: self.copies.write_events(store, events))
        self.webhooks = webhooks_for(catalog.webhooks, settings, cache_dir)

    @classmethod
    def from_settings(cls, settings: Settings, *, catalog: Catalog | None = None,
                      store: ObjectStore | None = None) -> LocalBackend:
        if catalog is None:
            # Here, not at the top: the catalog loads sqlalchemy (~0.3 s), which a client of a
            # registry server (RemoteBackend, which imports this module) never needs.
            from .catalog.repository import Catalog

            catalog = Catalog(settings.catalog_url, auto_migrate=settings.auto_migrate)
        return cls(catalog, store or open_store(settings.store_url, settings), settings.cache_dir,
                   grace=settings.gc_grace, lease=settings.push_lease,
                   trash=timedelta(days=settings.trash_days), settings=settings)

    def __repr__(self) -> str:
        return f"catalog={redact_url(self.catalog.url)!r}, store={self.store.url!r}"

    def close(self) -> None:
        self.catalog.close()

    def staging_dir(self) -> Path:
        """Where a push serializes, chosen so that handing the file to the store is a rename."""
        if isinstance(self.store, Staging):
            return self.store.staging_dir
        return self.cache.tmp_dir()

    # -- push -----------------------------------------------------------------------------

    def known_shards(self, name: str) -> list[KnownShard]:
        """Verified copies here (the file store's blob, else the cache's) of the shards of
        ``name``'s latest version, which a push compares instead of writing them again."""
        return known_shards(self.resolve, name, self.verified,
                            lambda d: self.store.open_local(mf.blob_key(d)), self.cache.path)

    def begin_push(self, name: str, version: int | None, files: Sequence[VersionFile], *,
                   key: str | None = None, committed: list[VersionRecord] | None = None,
                   ) -> tuple[int, list[VersionFile]]:
        """Reserve a version number for a push of ``files``; the version stays invisible.

        Returns the number and the files the store still lacks (one entry per distinct blob).
        The push with idempotency ``key`` retried gets its number again; once committed, its
        record is added to (an empty) ``committed`` and nothing is to upload."""
        unique = unique_by_digest(files)
        # Ask the store first: a missing bucket or a dead endpoint then fails the push before it
        # spends a version number. That answer is not trusted for dedup: gc may run in between,
        # and gc keeps only blobs that a reservation or a version references.
        self.store.has(mf.blob_key(unique[0].digest))
        number = self.catalog.reserve(name, version, weights_digest(files), total_size(
            [f for f in files if f.role == "weights"]), files, lease=self.lease, key=key,
            committed=committed)
        if committed:
            return number, []
        held = concurrently(lambda f: self._holds(mf.blob_key(f.digest), f.digest, f.size),
                            unique)
        return number, [f for f, ok in zip(unique, held, strict=True) if not ok]

    def _holds(self, key: str, digest: str, size: int) -> bool:
        """Whether the store has intact bytes for ``digest``; a damaged local copy does not
        count, so pushing the same weights again repairs it."""
        if self.store.has(key) != size:
            return False
        local = self.store.open_local(key)
        if local is None:  # a remote store's copy is verified by every pull instead
            self.store.touch(key)  # reused bytes count as just written: gc's grace protects them
            return True
        return self.verified.reuse(local, digest, size, lambda: self.store.touch(key))

    def upload(self, staged: StagedFile) -> None:
        """Store one staged file under its content address (consuming the staged copy)."""
        key = mf.blob_key(staged.digest)
        self.store.put_file(key, staged.ensure(), move=True)
        local = self.store.open_local(key)
        if local is not None:
            self.verified.remember(local, staged.digest)  # push hashed these very bytes

    def commit_push(self, name: str, number: int, manifest: dict[str, Any],
                    tags: dict[str, str], aliases: Iterable[str], *,
                    owed: list[str] | None = None, force: bool = False) -> VersionRecord:
        """Make the reserved version visible with its tags and aliases, then write its
        manifest (and the alias table) to the store.

        The order is the guarantee (registry/publish.py): nothing a failed or losing commit
        leaves behind needs deleting. Once the catalog commit succeeded the push has: a store
        write that fails after it is owed and retried, never raised; its keys go to ``owed``."""
        origin = f"{name}:v{number}"
        mf.validate(manifest, origin=origin)
        files = version_files(manifest)
        absent = self._absent(files)
        if absent:
            f, have = absent[0]
            raise MissingBlobError(
                f"{f.role} file {f.name} ({f.digest}) of {origin} is not in the store "
                f"({have or 0} of {f.size} bytes); upload it before committing",
                files=[f for f, _ in absent])
        # Checked again right before the commit: a gc that chose a blob before this push
        # reserved it may have deleted it since (registry/gc.py, rule 3).
        gone = [f for f, _ in self._absent(files)]
        if gone:
            raise MissingBlobError(
                f"{len(gone)} file(s) of {origin} vanished from the store while it was "
                f"committed ({gone[0].digest}, removed by a gc that ran meanwhile); the "
                "version was not made visible: push it again", files=gone)
        record = self.catalog.commit(name, number, manifest, tags, aliases := list(aliases),
                                     force=force)
        keys = self._publish(name, [number], aliases=bool(aliases))
        if owed is not None:
            owed += keys
        return record

    def _publish(self, name: str, versions: Iterable[int], *, aliases: bool) -> list[str]:
        """Write the store's copies of ``versions``' manifests (and the alias table) from the
        catalog; never raises (registry/publish.py)."""
        return self.copies.publish(self.catalog, self.store, name, versions, aliases=aliases)

    def _absent(self, files: Sequence[VersionFile]) -> list[tuple[VersionFile, int | None]]:
        """Each of ``files`` the store lacks or holds at another size, with the size it has."""
        unique = unique_by_digest(files)
        sizes = concurrently(lambda f: self.store.has(mf.blob_key(f.digest)), unique)
        return [(f, have) for f, have in zip(unique, sizes, strict=True) if have != f.size]

    def expect_upload(self, digest: str) -> int:
        """The size a push in progress declared for blob ``digest`` (a server accepts an upload
        only then, and no more bytes than that); else :class:`UnexpectedUploadError`."""
        size = self.catalog.pending_upload(digest)
        if size is None:
            raise UnexpectedUploadError(
                f"no push in progress lists blob {digest}: begin the push first (POST "
                "/api/v1/models/NAME/pushes) and upload only the files it asks for")
        self.catalog.renew_listing(digest)  # a sign of life of the push: its lease holds
        return size

    def committed_push(self, name: str, number: int,
                       manifest: dict[str, Any]) -> VersionRecord | None:
        """The record of ``name:vN`` if a commit of exactly ``manifest`` made it visible (the
        answer to a retried commit), else None."""
        return self.catalog.committed(name, number, manifest)

    def reservation(self, name: str, number: int) -> Reservation:
        """The push in progress for ``name:vN``; NotFoundError if there is none."""
        reserved = self.catalog.reservation(name, number)
        if reserved is None:
            raise NotFoundError(f"no push of {name}:v{number} is in progress; begin one with "
                                f"POST /api/v1/models/{name}/pushes")
        return reserved

    def stored_size(self, digest: str) -> int:
        """The size of blob ``digest`` in the store; NotFoundError if it is not there."""
        size = self.store.has(mf.blob_key(digest))
        if size is None:
            raise NotFoundError(f"blob {digest} not found in the store")
        return size

    def blob_url(self, digest: str, method: str) -> str | None:
        """A presigned URL to GET or PUT blob ``digest`` straight at the store, when the store
        hands them out (S3); None when bytes must travel through the server."""
        if isinstance(self.store, Presigning):
            return self.store.presign(mf.blob_key(digest), method)
        return None

    def store_verified(self, digest: str, path: Path) -> None:
        """Store a file whose bytes were just hashed to ``digest`` (a server upload), unless
        the store already has the blob; the staged file is consumed either way."""
        key = mf.blob_key(digest)
        if self.store.has(key) == path.stat().st_size:
            path.unlink(missing_ok=True)
            self.store.touch(key)
            return
        self.upload(StagedFile(path, VersionFile("weights", "upload", digest,
                                                 path.stat().st_size)))

    def abort_push(self, name: str, number: int) -> None:
        """Drop a reservation; its number stays retired. Nothing in the store is deleted: a
        push writes its manifest only after its commit, so an aborted one wrote none, and a
        commit that won a race with this abort keeps everything it wrote."""
        self.catalog.abort(name, number)

    def push(self, name: str, version: int | None, staged: Sequence[StagedFile],
             manifest_for: Callable[[int], dict[str, Any]], tags: dict[str, str],
             aliases: Iterable[str], *, idempotency_key: str | None = None) -> PushResult:
        """Reserve a number, upload what the store lacks, make the version visible, then
        write its manifest (:meth:`commit_push`); a push retried with its idempotency key
        after its commit returns that version (catalog/pushes.py)."""
        files = [s.file for s in staged]
        aliases, deferred, done = list(aliases), list[str](), list[VersionRecord]()
        number, missing = self.begin_push(name, version, files, key=idempotency_key,
                                          committed=done)
        if done:
            return PushResult(done[0], files, [])
        try:
            by_digest = {s.digest: s for s in staged}
            def upload(f: VersionFile) -> None:  # each a sign of life: the lease holds
                self.upload(by_digest[f.digest])
                self.catalog.renew(name, number)
            concurrently(upload, missing, workers=UPLOAD_CONCURRENCY)
            try:
                record = self.commit_push(name, number, manifest_for(number), tags, aliases,
                                          owed=deferred)
            except MissingBlobError as exc:
                # A blob this push reused was deleted under it; the staged copy of a reused
                # blob is still here (only uploads consume theirs), or is written again if
                # the push matched it without writing it, so store it and go on.
                lost = [by_digest[f.digest] for f in exc.files]
                if not all(s.available for s in lost):
                    raise
                log.warning("%d blob(s) of %s:v%d vanished during the push; uploading them "
                            "again", len(lost), name, number)
                concurrently(self.upload, lost, workers=UPLOAD_CONCURRENCY)
                record = self.commit_push(name, number, manifest_for(number), tags, aliases,
                                          owed=deferred)
        except BaseException:
            with contextlib.suppress(Exception):
                self.abort_push(name, number)
            raise
        return PushResult(record, files, missing, deferred)

    # -- pull -----------------------------------------------------------------------------

    def resolve(self, ref: Ref) -> VersionRecord:
        return self.catalog.resolve(ref)

    def blob_path(self, digest: str, size: int) -> Path:
        """A local path holding verified bytes of ``digest``: in place, or in the cache."""
        with self.open_blob(digest, size) as fh:
            return Path(str(fh.name))

    def open_blob(self, digest: str, size: int) -> BinaryIO:
        """:meth:`blob_path`'s file, open: a pull maps the very file that was verified."""
        key = mf.blob_key(digest)
        local = self.store.open_local(key)
        if local is not None:
            return self.verified.open(local, digest, what="stored blob", size=size)

        def download(tmp: Path) -> str:
            with transfer(size, f"pull {digest[7:19]}") as progress:
                return self.store.get_to_file(key, tmp, progress=progress, size=size)

        return self.cache.open(digest, download, size)

    # -- reads and changes ----------------------------------------------------------------

    def list_models(self, *, limit: int | None = None, after: str | None = None) -> list[str]:
        return self.catalog.list_models(limit=limit, after=after)

    def list_versions(self, name: str, *, limit: int | None = None,
                      after: int | None = None) -> list[VersionRecord]:
        return self.catalog.list_versions(name, limit=limit, after=after)

    def set_alias(self, name: str, alias: str, version: int, *,
                  force: bool = False) -> VersionRecord:
        record = self.catalog.set_alias(name, alias, version, force=force)
        self._publish(name, (), aliases=True)
        return record

    def delete_alias(self, name: str, alias: str, *, force: bool = False) -> None:
        protected = self.catalog.delete_alias(name, alias, force=force)
        self.copies.publish(self.catalog, self.store, name, (), aliases=True,
                            governance=protected)

    def set_tags(self, name: str, version: int, tags: dict[str, str | None]) -> VersionRecord:
        record = self.catalog.set_tags(name, version, tags)
        # The store copy of the manifest carries the tags too, so a rebuild restores them.
        self._publish(name, [version], aliases=False)
        return record

    def delete_version(self, name: str, version: int, *, force: bool = False,
                       protected_ok: bool | None = None) -> VersionRecord:
        """Move ``name:vN`` to the trash (catalog/governance.py); gc purges it later."""
        record = self.catalog.delete_version(name, version, force=force,
                                             protected_ok=protected_ok)
        self.governance.trashed(name, version)
        return record

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]:
        """Export records of ``name:vN`` (registry/exports/local.py)."""
        return self.exports.list_exports(name, version)

    def register_export(self, name: str, version: int, record: dict[str, Any],
                        path: Path) -> dict[str, Any]:
        return self.exports.register(name, version, record, path)

    # -- maintenance ----------------------------------------------------------------------

    def gc(self) -> GcReport:
        """Delete what no version references, in the store and the local cache, and what
        crashed processes left behind; nothing younger than ``self.grace`` (registry/gc.py)."""
        def referenced() -> set[str]:
            return (self.catalog.referenced_digests(pending_grace=self.grace)
                    | self.exports.referenced())

        temporary = [self.cache.root / "tmp"]
        if isinstance(self.store, Staging):
            temporary.append(self.store.staging_dir)
        def drop_stale() -> int:
            return self.catalog.drop_stale_pending(older_than=min(self.grace, self.lease))

        expired, purged = self.governance.sweep()  # retention, then the trash's window
        report = collect(self.store, referenced, grace=self.grace, drop_stale=drop_stale,
                         cache_blobs=self.cache.root / "blobs", temporary_dirs=temporary)
        report.expired, report.purged = expired, purged
        report.reconciled = self.copies.reconcile(self.catalog, self.store)
        report.orphan_manifests = orphan_manifests(self.store, self.catalog.version_states(),
                                                   grace=self.grace)
        return report

    def rebuild(self) -> int:
        """Rebuild the catalog from the store alone (registry/publish.py, :func:`rebuild`)."""
        return rebuild(self.catalog, self.store, self.copies, self.exports, self.signatures)
