"""The three operations the facade calls, each composed from the room's parts."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..caching.cache import BlobCache
from ..catalog.records import VersionRecord
from ..errors import OciArtifactError
from ..io.digests import sha256_bytes
from ..settings import Settings
from ..signing import SignatureStore
from . import foreign, signed
from .auth import credential_for
from .modelpack import WEIGHT, Artifact
from .pull import (
    BlobPath,
    LayerFetcher,
    fetcher,
    free_bytes,
    open_artifact,
    registry_record,
    stage,
)
from .push import MountMemo, push_version
from .refs import parse_oci_ref
from .results import OciPush
from .transport import OciClient
from .unpack import Expansion

if TYPE_CHECKING:
    from ..backends import Backend

log = logging.getLogger(__name__)


def connect(target: str, settings: Settings, *, plain_http: bool = False) -> OciClient:
    """A client for the registry and repository ``target`` names, with its credentials."""
    ref = parse_oci_ref(target, plain_http=plain_http)
    return OciClient(ref, credential=credential_for(ref.host, settings.oci_auth,
                                                    settings.docker_config),
                     ca_bundle=settings.oci_ca_bundle, min_rate=settings.oci_min_rate,
                     grace=settings.oci_blob_grace.total_seconds())


def pinned(source: str, settings: Settings, *, plain_http: bool = False) -> str:
    """``source`` fixed to the manifest its tag names now (``oci://HOST/REPO@sha256:...``), so
    that the reads of one command (``show`` and then the pull) all see one artifact while the
    tag moves on. The digest is the sha256 of the manifest's bytes, which every later read by
    it checks again (``open_artifact``)."""
    ref = parse_oci_ref(source, plain_http=plain_http)
    if ref.digest is not None:
        return source
    with connect(source, settings, plain_http=plain_http) as client:
        body, _media_type = client.get_manifest(ref.reference or "latest")
    return str(dataclasses.replace(ref, tag=None, digest=sha256_bytes(body)))


def push(record: VersionRecord, target: str, settings: Settings, blob_path: BlobPath, *,
         plain_http: bool = False, signatures: SignatureStore | None = None) -> OciPush:
    """Write ``record`` as an artifact, its signatures (from ``signatures``) as layers."""
    extra = signed.layers(signatures, record.manifest)
    with connect(target, settings, plain_http=plain_http) as client:
        return push_version(record, client, blob_path,
                            MountMemo(settings.cache_dir / "oci", client.ref.host), extra)


@contextmanager
def opened(source: str, settings: Settings, *,
           plain_http: bool = False) -> Iterator[tuple[VersionRecord, Callable[[str, int], int]]]:
    """The version an artifact holds, and how to open each of its weight files: the second
    gives a descriptor of the verified cache file (the caller's ``open()`` of it maps that very
    file, never the path again). An artifact of this registry comes back as it was pushed;
    another producer's is normalized like a checkpoint directory (foreign.py)."""
    with connect(source, settings, plain_http=plain_http) as client:
        artifact, digest = open_artifact(client, settings.cache_dir)
        layers = fetcher(client, BlobCache(settings.cache_dir), artifact)
        try:
            layers.prefetch(artifact.of_type(WEIGHT))  # while the manifest layer is read
            record, ours = _held(client, artifact, digest, layers, settings)
            carried = signed.ArtifactSignatures(artifact, layers, str(client.ref))
            signed.enforce(carried, record.manifest, settings)  # unsigned: refused by require
            if ours:
                yield record, layers.open_fd
                return
        finally:
            layers.close()
    cache = BlobCache(settings.cache_dir)

    def cached(digest: str, size: int) -> int:  # the normalized shards and files, in the cache
        def gone(_tmp: Path) -> str:
            raise OciArtifactError(f"file {digest} of {source}, normalized by this pull, left "
                                   "the cache meanwhile; pull again")

        with cache.open(digest, gone, size) as fh:
            return os.dup(fh.fileno())

    yield record, cached


def described(source: str, settings: Settings, *, plain_http: bool = False
              ) -> tuple[VersionRecord, list[dict[str, Any]]]:
    """The version an artifact holds and the signature records it carries (listed, not
    verified), as ``show`` gives a version: an artifact of this registry is read from its
    manifest and signature layers alone, no weight fetched; another producer's is normalized
    as a pull normalizes it (its layers fetched once into the cache)."""
    with connect(source, settings, plain_http=plain_http) as client:
        artifact, digest = open_artifact(client, settings.cache_dir)
        layers = fetcher(client, BlobCache(settings.cache_dir), artifact)
        try:
            record, _ = _held(client, artifact, digest, layers, settings)
            carried = signed.ArtifactSignatures(artifact, layers, str(client.ref))
            return record, carried.listed(record.name, record.version)
        finally:
            layers.close()


def _held(client: OciClient, artifact: Artifact, digest: str, layers: LayerFetcher,
          settings: Settings) -> tuple[VersionRecord, bool]:
    """The version an artifact holds, and whether this registry pushed it (its own manifest
    layer, read alone) or another producer did (normalized: every layer fetched)."""
    record = registry_record(artifact, layers, str(client.ref))
    if record is not None:
        return record, True
    return foreign.version(
        artifact, layers, settings, manifest_digest=digest, origin=str(client.ref),
        repository=client.ref.repository, budget=free_bytes(settings.cache_dir)), False


def import_artifact(source: str, name: str | None, settings: Settings, staging: Path,
                    commit: Callable[..., Any], push_directory: Callable[[Path, str], Any], *,
                    plain_http: bool, tags: dict[str, str], aliases: Sequence[str],
                    signatures: SignatureStore | None = None) -> Any:
    """Import ``source`` as a new version: an artifact of this registry through ``commit``
    (the backend's push: same blobs, same digests, one transaction), another producer's as
    a checkpoint directory through ``push_directory``. Every layer is in the verified cache
    before anything is committed, so a failed download leaves no version behind. The
    signatures an artifact carries pass the pull policy first, and are stored with the
    version (in ``signatures``) when it keeps the name and number they sign."""
    with connect(source, settings, plain_http=plain_http) as client:
        artifact, digest = open_artifact(client, settings.cache_dir)
        layers = fetcher(client, BlobCache(settings.cache_dir), artifact)
        try:
            return _import(artifact, layers, client, name, settings, staging, commit,
                           push_directory, tags, aliases, signatures)
        finally:
            layers.close()


def _import(artifact: Artifact, layers: LayerFetcher, client: OciClient, name: str | None,
            settings: Settings, staging: Path, commit: Callable[..., Any],
            push_directory: Callable[[Path, str], Any], tags: dict[str, str],
            aliases: Sequence[str], store: SignatureStore | None) -> Any:
    origin = str(client.ref)
    record = registry_record(artifact, layers, origin)
    carried = signed.ArtifactSignatures(artifact, layers, origin)
    if record is None:
        layers.prefetch(artifact.layers)
        directory = foreign.checkout(artifact, layers, settings.cache_dir / "oci" / "checkouts",
                                     origin=origin, budget=free_bytes(settings.cache_dir),
                                     expansion=Expansion(settings.oci_max_expansion,
                                                         settings.oci_max_unpacked))
        try:
            return push_directory(directory,
                                  name or client.ref.repository.rsplit("/", 1)[-1])
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    signed.enforce(carried, record.manifest, settings)
    target = name or record.name
    # Signatures sign the name and number too: they come along when both are kept.
    listed = carried.listed(record.name, record.version)
    keep = bool(listed) and target == record.name
    if listed and not keep:
        log.warning("%s: its signatures sign %s:v%d and were not imported with %s; import it "
                    "under its own name to keep them", origin, record.name, record.version,
                    target)
    staged = stage(record, layers, staging)
    tag_map = {**record.tags, **tags}
    try:
        done = commit(target, record.version if keep else None, staged,
                      lambda v: {**record.manifest, "name": target, "version": v,
                                 "tags": tag_map}, tag_map, aliases)
    finally:
        for s in staged:
            s.path.unlink(missing_ok=True)
    if keep and store is not None:
        carried.copy_to(store, done.record.manifest)
    return done


@dataclasses.dataclass(frozen=True)
class Door:
    """The OCI door of one registry, a field of :class:`registry.Registry`: its versions
    pushed to OCI registries as ModelPack artifacts, artifacts imported as versions, and
    artifacts described, over the registry's backend and settings."""

    backend: Backend
    settings: Settings

    def describe(self, source: str) -> tuple[VersionRecord, list[dict[str, Any]]]:
        """:func:`described`: the version an artifact holds and the signatures it lists."""
        return described(source, self.settings)

    def push(self, record: VersionRecord, target: str, *, plain_http: bool) -> OciPush:
        """:func:`push` of a resolved, checked ``record`` with the signatures it has here."""
        return push(record, target, self.settings, self.backend.blob_path,
                    plain_http=plain_http, signatures=self.backend.signatures)

    def import_artifact(self, source: str, name: str | None,
                        push_directory: Callable[[Path, str], Any], *, plain_http: bool,
                        tags: dict[str, str], aliases: Sequence[str]) -> Any:
        """:func:`import_artifact` into this registry: committed by its backend's push, or
        pushed as a checkpoint directory by ``push_directory``."""
        return import_artifact(source, name, self.settings, self.backend.staging_dir(),
                               self.backend.push, push_directory, plain_http=plain_http,
                               tags=tags, aliases=aliases, signatures=self.backend.signatures)
