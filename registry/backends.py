"""Backends: where the push and pull pipelines send their catalog and store operations.

``LocalBackend`` pairs a SQL catalog with an object store; the embedded registry and the server
both run on it, so each operation has one implementation.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from . import manifest as mf
from . import validate
from ._progress import transfer
from .cache import BlobCache, VerifiedFiles
from .catalog.records import VersionRecord
from .errors import (
    MissingBlobError,
    NotFoundError,
    UnexpectedUploadError,
)
from .files import (
    StagedFile,
    VersionFile,
    total_size,
    unique_by_digest,
    version_files,
    weights_digest,
)
from .gc import DEFAULT_GRACE, GcReport
from .parallel import UPLOAD_CONCURRENCY, concurrently
from .refs import Ref
from .settings import Settings
from .signing import LocalSignatures, SignatureStore
from .store import ObjectStore, Presigning, Staging, open_store
from .unchanged import KnownShard, known_shards

if TYPE_CHECKING:
    from .catalog.repository import Catalog, Reservation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PushResult:
    """A committed push: the version, and which of its blobs had to be uploaded."""

    record: VersionRecord
    files: list[VersionFile]
    uploaded: list[VersionFile]

    def report(self) -> dict[str, int]:
        """What ``metadata["push"]`` says (the stored manifest never depends on it)."""
        weights = [f for f in self.files if f.role == "weights"]
        sent = [f for f in self.uploaded if f.role == "weights"]
        return {"shards": len(weights), "shards_uploaded": len(sent),
                "bytes": total_size(weights), "bytes_uploaded": total_size(sent),
                "files": len(self.files) - len(weights),
                "files_uploaded": len(self.uploaded) - len(sent)}


class Backend(Protocol):
    """What the Registry facade needs; LocalBackend and the server's remote client implement it."""

    def staging_dir(self) -> Path: ...

    def known_shards(self, name: str) -> list[KnownShard]: ...

    def push(self, name: str, version: int | None, staged: Sequence[StagedFile],
             manifest_for: Callable[[int], dict[str, Any]], tags: dict[str, str],
             aliases: Iterable[str]) -> PushResult: ...

    def resolve(self, ref: Ref) -> VersionRecord: ...

    def blob_path(self, digest: str, size: int) -> Path: ...

    def open_blob(self, digest: str, size: int) -> BinaryIO: ...

    def list_models(self) -> list[str]: ...
    def list_versions(self, name: str) -> list[VersionRecord]: ...
    def set_alias(self, name: str, alias: str, version: int) -> VersionRecord: ...
    def delete_alias(self, name: str, alias: str) -> None: ...
    def set_tags(self, name: str, version: int, tags: dict[str, str | None]) -> VersionRecord: ...
    def delete_version(self, name: str, version: int, *,
                       force: bool = False) -> VersionRecord: ...

    def gc(self) -> GcReport: ...
    def rebuild(self) -> int: ...

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]: ...

    def register_export(self, name: str, version: int, record: dict[str, Any],
                        path: Path) -> dict[str, Any]: ...
    @property
    def signatures(self) -> SignatureStore: ...  # records and bundles (registry/signing)

    def close(self) -> None: ...


class LocalBackend:
    """A SQL catalog plus an object store, driven in-process."""

    def __init__(self, catalog: Catalog, store: ObjectStore, cache_dir: Path, *,
                 grace: timedelta = DEFAULT_GRACE) -> None:
        self.catalog = catalog
        self.store = store
        # How long a reservation, a temporary file or an unreferenced blob is left to its
        # writer before gc may remove it (REGISTRY_GC_GRACE; registry/gc.py).
        self.grace = grace
        self.cache = BlobCache(cache_dir)
        self.verified = VerifiedFiles(cache_dir / "verified")
        self.signatures = LocalSignatures(catalog, store)

    @classmethod
    def from_settings(cls, settings: Settings, *, catalog: Catalog | None = None,
                      store: ObjectStore | None = None) -> LocalBackend:
        if catalog is None:
            from .catalog.repository import Catalog

            catalog = Catalog(settings.catalog_url, auto_migrate=settings.auto_migrate)
        return cls(
            catalog,
            store or open_store(settings.store_url, settings),
            settings.cache_dir,
            grace=settings.gc_grace,
        )

    def __repr__(self) -> str:
        from .settings import redact_url

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

    def begin_push(self, name: str, version: int | None,
                   files: Sequence[VersionFile]) -> tuple[int, list[VersionFile]]:
        """Reserve a version number for a push of ``files``; the version stays invisible.

        Returns the number and the files the store still lacks (one entry per distinct blob).
        """
        unique = unique_by_digest(files)
        # Ask the store first: a missing bucket or a dead endpoint then fails the push before it
        # spends a version number. That answer is not trusted for dedup: gc may run in between,
        # and gc keeps only blobs that a reservation or a version references.
        self.store.has(mf.blob_key(unique[0].digest))
        number = self.catalog.reserve(name, version, weights_digest(files), total_size(
            [f for f in files if f.role == "weights"]), files)
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
                    tags: dict[str, str], aliases: Iterable[str]) -> VersionRecord:
        """Write the manifest, then make the reserved version visible with its tags and aliases."""
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
        self.store.put_bytes(mf.manifest_key(name, number), mf.dumps(manifest))
        try:
            # Checked again now that the manifest is written: a gc that chose a blob before
            # this push reserved it may have deleted it since (registry/gc.py, rule 3).
            gone = [f for f, _ in self._absent(files)]
            if gone:
                raise MissingBlobError(
                    f"{len(gone)} file(s) of {origin} vanished from the store while it was "
                    f"committed ({gone[0].digest}, removed by a gc that ran meanwhile); the "
                    "version was not made visible: push it again", files=gone)
            record = self.catalog.commit(name, number, manifest, tags, aliases)
        except BaseException:
            # A manifest without a committed row would come back on `registry db rebuild`.
            with contextlib.suppress(Exception):
                self.store.delete(mf.manifest_key(name, number))
            raise
        if record.aliases:
            self._write_aliases(name)
        return record

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
        return size

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
        """Drop a reservation; its number stays retired and no manifest is left behind."""
        self.catalog.abort(name, number)
        self.store.delete(mf.manifest_key(name, number))

    def push(
        self,
        name: str,
        version: int | None,
        staged: Sequence[StagedFile],
        manifest_for: Callable[[int], dict[str, Any]],
        tags: dict[str, str],
        aliases: Iterable[str],
    ) -> PushResult:
        """Reserve a number, upload what the store lacks, write the manifest, then make the
        version visible."""
        files = [s.file for s in staged]
        number, missing = self.begin_push(name, version, files)
        try:
            by_digest = {s.digest: s for s in staged}
            concurrently(lambda f: self.upload(by_digest[f.digest]), missing,
                         workers=UPLOAD_CONCURRENCY)
            try:
                record = self.commit_push(name, number, manifest_for(number), tags, aliases)
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
                record = self.commit_push(name, number, manifest_for(number), tags, aliases)
        except BaseException:
            with contextlib.suppress(Exception):
                self.abort_push(name, number)
            raise
        return PushResult(record, files, missing)

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
                return self.store.get_to_file(key, tmp, progress=progress)

        return self.cache.open(digest, download, size)

    # -- reads and changes ----------------------------------------------------------------

    def list_models(self, *, limit: int | None = None, after: str | None = None) -> list[str]:
        return self.catalog.list_models(limit=limit, after=after)

    def list_versions(self, name: str, *, limit: int | None = None,
                      after: int | None = None) -> list[VersionRecord]:
        return self.catalog.list_versions(name, limit=limit, after=after)

    def set_alias(self, name: str, alias: str, version: int) -> VersionRecord:
        record = self.catalog.set_alias(name, alias, version)
        self._write_aliases(name)
        return record

    def delete_alias(self, name: str, alias: str) -> None:
        self.catalog.delete_alias(name, alias)
        self._write_aliases(name)

    def set_tags(self, name: str, version: int, tags: dict[str, str | None]) -> VersionRecord:
        record = self.catalog.set_tags(name, version, tags)
        # The store copy of the manifest carries the tags too, so a rebuild restores them.
        self.store.put_bytes(mf.manifest_key(name, version),
                             mf.dumps({**record.manifest, "tags": record.tags}))
        return record

    def delete_version(self, name: str, version: int, *,
                       force: bool = False) -> VersionRecord:
        from .exports import local as exports

        record = self.catalog.delete_version(name, version, force=force)
        self.store.put_bytes(mf.tombstone_key(name, version), b"")
        self.store.delete(mf.manifest_key(name, version))
        exports.drop(self, name, version)
        self._write_aliases(name, allow_missing=True)
        return record

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]:
        """Export records of ``name:vN`` (registry/exports/local.py)."""
        from .exports import local as exports

        return exports.list_exports(self, name, version)

    def register_export(self, name: str, version: int, record: dict[str, Any],
                        path: Path) -> dict[str, Any]:
        from .exports import local as exports

        return exports.register(self, name, version, record, path)

    def _write_aliases(self, name: str, *, allow_missing: bool = False) -> None:
        try:
            table = self.catalog.aliases(name)
        except NotFoundError:
            if not allow_missing:
                raise
            table = {}
        self.store.put_bytes(mf.aliases_key(name), json.dumps(table, sort_keys=True).encode())

    # -- maintenance ----------------------------------------------------------------------

    def gc(self) -> GcReport:
        """Delete what no version references, in the store and the local cache, and what
        crashed processes left behind; nothing younger than ``self.grace`` (registry/gc.py)."""
        from .exports import local as exports
        from .gc import collect

        def referenced() -> set[str]:
            return (self.catalog.referenced_digests(pending_grace=self.grace)
                    | exports.referenced(self))

        temporary = [self.cache.root / "tmp"]
        if isinstance(self.store, Staging):
            temporary.append(self.store.staging_dir)
        def drop_stale() -> int:
            return self.catalog.drop_stale_pending(
                older_than=self.grace,
                before_drop=lambda name, n: self.store.delete(mf.manifest_key(name, n)))

        return collect(self.store, referenced, grace=self.grace, drop_stale=drop_stale,
                       cache_blobs=self.cache.root / "blobs", temporary_dirs=temporary)

    def rebuild(self) -> int:
        """Rebuild the catalog from the store alone; return the number of versions restored.

        Every store object (manifests, export and signature lists) is checked first; one the
        registry cannot have written (``manifests/../../evil/v1.json``, bad JSON, a manifest
        failing its schema or digest) refuses the rebuild, naming it; the catalog is unchanged.
        """
        manifests: list[dict[str, Any]] = []
        retired: set[tuple[str, int]] = set()
        for key in self.store.list("manifests/"):
            name, version, suffix = validate.manifest_key(key)
            if suffix == ".json":
                data = validate.stored_bytes(self.store.has(key), key, self.store.get_bytes)
                manifests.append(validate.stored_manifest(
                    mf.loads(data, origin=key), name=name, version=version, origin=key))
            elif suffix == ".deleted":
                retired.add((name, version))
        aliases: dict[str, dict[str, int]] = {}
        for key in self.store.list("aliases/"):
            name = validate.aliases_key(key)
            data = validate.stored_bytes(self.store.has(key), key, self.store.get_bytes)
            aliases[name] = validate.alias_table(validate.stored_json(data, key), key)
        # A tombstone is written before its manifest is removed: if both are there, the
        # deletion happened.
        manifests = [m for m in manifests if (m["name"], m["version"]) not in retired]
        manifests.sort(key=lambda m: (m["name"], m["version"]))
        from .exports import local as exports
        found, signed = exports.stored(self), self.signatures.stored()
        count = self.catalog.restore(manifests, sorted(retired), aliases)
        exports.restore(self, found)
        self.signatures.restore(signed)
        return count

