"""The three operations the facade calls, each composed from the room's parts."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..cache import BlobCache
from ..catalog.records import VersionRecord
from ..errors import OciArtifactError
from ..settings import Settings
from . import foreign
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


def connect(target: str, settings: Settings, *, plain_http: bool = False) -> OciClient:
    """A client for the registry and repository ``target`` names, with its credentials."""
    ref = parse_oci_ref(target, plain_http=plain_http)
    return OciClient(ref, credential=credential_for(ref.host, settings.oci_auth,
                                                    settings.docker_config),
                     ca_bundle=settings.oci_ca_bundle)


def push(record: VersionRecord, target: str, settings: Settings, blob_path: BlobPath, *,
         plain_http: bool = False) -> OciPush:
    with connect(target, settings, plain_http=plain_http) as client:
        return push_version(record, client, blob_path,
                            MountMemo(settings.cache_dir / "oci", client.ref.host))


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
            record = registry_record(artifact, layers, str(client.ref))
            if record is not None:
                yield record, layers.open_fd
                return
            record = foreign.version(
                artifact, layers, settings.cache_dir, manifest_digest=digest,
                origin=str(client.ref), repository=client.ref.repository,
                shard_size=settings.shard_size, budget=free_bytes(settings.cache_dir))
        finally:
            layers.close()
    cache = BlobCache(settings.cache_dir)

    def cached(digest: str, size: int) -> int:  # the normalized shards, in the cache
        def gone(_tmp: Path) -> str:
            raise OciArtifactError(f"shard {digest} of {source}, normalized by this pull, left "
                                   "the cache meanwhile; pull again")

        with cache.open(digest, gone, size) as fh:
            return os.dup(fh.fileno())

    yield record, cached


def import_artifact(source: str, name: str | None, settings: Settings, staging: Path,
                    commit: Callable[..., Any], push_directory: Callable[[Path, str], Any], *,
                    plain_http: bool, tags: dict[str, str], aliases: Sequence[str]) -> Any:
    """Import ``source`` as a new version: an artifact of this registry through ``commit``
    (the backend's push: same blobs, same digests, one transaction), another producer's as
    a checkpoint directory through ``push_directory``. Every layer is in the verified cache
    before anything is committed, so a failed download leaves no version behind."""
    with connect(source, settings, plain_http=plain_http) as client:
        artifact, digest = open_artifact(client, settings.cache_dir)
        layers = fetcher(client, BlobCache(settings.cache_dir), artifact)
        try:
            return _import(artifact, digest, layers, client, name, settings, staging, commit,
                           push_directory, tags, aliases)
        finally:
            layers.close()


def _import(artifact: Artifact, digest: str, layers: LayerFetcher, client: OciClient,
            name: str | None, settings: Settings, staging: Path, commit: Callable[..., Any],
            push_directory: Callable[[Path, str], Any], tags: dict[str, str],
            aliases: Sequence[str]) -> Any:
    record = registry_record(artifact, layers, str(client.ref))
    if record is None:
        layers.prefetch(artifact.layers)
        directory = foreign.checkout(artifact, layers, settings.cache_dir / "oci" / "checkouts",
                                     origin=str(client.ref),
                                     budget=free_bytes(settings.cache_dir))
        try:
            return push_directory(directory,
                                  name or client.ref.repository.rsplit("/", 1)[-1])
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    staged = stage(record, layers, staging)
    target = name or record.name
    tag_map = {**record.tags, **tags}
    try:
        return commit(target, None, staged,
                      lambda v: {**record.manifest, "name": target, "version": v,
                                 "tags": tag_map}, tag_map, aliases)
    finally:
        for s in staged:
            s.path.unlink(missing_ok=True)
