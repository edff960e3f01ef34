"""The three operations the facade calls, each composed from the room's parts."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..cache import BlobCache
from ..catalog.records import VersionRecord
from ..errors import OciArtifactError
from ..settings import Settings
from .auth import credential_for
from .modelpack import WEIGHT, Artifact
from .pull import (
    BlobPath,
    LayerFetcher,
    checkpoint_dir,
    fetch_all,
    fetcher,
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
           plain_http: bool = False) -> Iterator[tuple[VersionRecord, BlobPath]]:
    """The version an artifact of this registry holds, and ``blob_path`` for its layers
    (fetched into the verified cache as the pull asks for them)."""
    with connect(source, settings, plain_http=plain_http) as client:
        artifact, _digest = open_artifact(client, settings.cache_dir)
        blob_path = fetcher(client, BlobCache(settings.cache_dir), artifact)
        try:
            blob_path.prefetch(artifact.of_type(WEIGHT))  # while the manifest layer is read
            record = registry_record(artifact, blob_path, str(client.ref))
            if record is None:
                raise OciArtifactError(
                    f"{source} was written by another ModelPack producer; import it first (it "
                    "is normalized like a checkpoint directory): "
                    f"`registry oci pull {source} NAME`")
            yield record, blob_path
        finally:
            blob_path.close()


def import_artifact(source: str, name: str | None, settings: Settings, staging: Path,
                    commit: Callable[..., Any], push_directory: Callable[[Path, str], Any], *,
                    plain_http: bool, tags: dict[str, str], aliases: Sequence[str]) -> Any:
    """Import ``source`` as a new version: an artifact of this registry through ``commit``
    (the backend's push: same blobs, same digests, one transaction), another producer's as
    a checkpoint directory through ``push_directory``. Every layer is in the verified cache
    before anything is committed, so a failed download leaves no version behind."""
    with connect(source, settings, plain_http=plain_http) as client:
        artifact, digest = open_artifact(client, settings.cache_dir)
        blob_path = fetcher(client, BlobCache(settings.cache_dir), artifact)
        try:
            return _import(artifact, digest, blob_path, client, name, settings, staging, commit,
                           push_directory, tags, aliases)
        finally:
            blob_path.close()


def _import(artifact: Artifact, digest: str, blob_path: LayerFetcher, client: OciClient,
            name: str | None, settings: Settings, staging: Path, commit: Callable[..., Any],
            push_directory: Callable[[Path, str], Any], tags: dict[str, str],
            aliases: Sequence[str]) -> Any:
    record = registry_record(artifact, blob_path, str(client.ref))
    if record is None:
        blobs = fetch_all(artifact, blob_path)
        directory = checkpoint_dir(artifact, blobs, settings.cache_dir / "oci" / "checkouts",
                                   digest, str(client.ref))
        try:
            return push_directory(directory,
                                  name or client.ref.repository.rsplit("/", 1)[-1])
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    staged = stage(record, blob_path, staging)
    target = name or record.name
    tag_map = {**record.tags, **tags}
    try:
        return commit(target, None, staged,
                      lambda v: {**record.manifest, "name": target, "version": v,
                                 "tags": tag_map}, tag_map, aliases)
    finally:
        for s in staged:
            s.path.unlink(missing_ok=True)
