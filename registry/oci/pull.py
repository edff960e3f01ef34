"""Read a ModelPack artifact back: its manifest checked, each layer fetched into the verified
cache (hashed while it arrives, refused past its declared size), and the version it holds.

An artifact this registry pushed carries its own manifest as a layer: the version comes back
as it was, every file cross-checked against the layers. Another producer's artifact (plain
safetensors and config layers) is laid out as a checkpoint directory of links into the cache,
which a push then normalizes like any checkpoint directory.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .. import manifest as mf
from .._progress import transfer
from ..cache import BlobCache
from ..catalog.records import VersionRecord
from ..digests import hexdigest, sha256_bytes
from ..errors import DigestMismatchError, OciArtifactError
from ..files import StagedFile, VersionFile, version_files
from ..parallel import DOWNLOAD_CONCURRENCY, concurrently
from . import modelpack
from .transport import OciClient

BlobPath = Callable[[str, int], Path]
MAX_REGISTRY_MANIFEST_BYTES = 256 * 2**20
# Left free on the cache's disk by a pull: a layer that would fill it is refused up front.
DISK_RESERVE = 2**30


def open_artifact(client: OciClient, cache_root: Path) -> tuple[modelpack.Artifact, str]:
    """The checked artifact ``client.ref`` names, and its manifest digest."""
    ref = client.ref
    body, media_type = client.get_manifest(ref.reference or "latest")
    digest = sha256_bytes(body)
    if ref.digest is not None and digest != ref.digest:
        raise DigestMismatchError(f"{ref} answered a manifest whose sha256 is {digest}; it was "
                                  "not used")
    cache_root.mkdir(parents=True, exist_ok=True)
    free = max(shutil.disk_usage(cache_root).free - DISK_RESERVE, 0)
    return modelpack.read(body, media_type, origin=str(ref), max_bytes=free), digest


class LayerFetcher:
    """``fetcher(digest, size)``: a verified cache path for a layer of ``artifact``, downloaded
    (and hashed as it arrives) only when the cache lacks it. :meth:`prefetch` starts layers in
    the background, so the weights arrive while the version's own manifest is still read; a
    layer asked for twice is fetched once."""

    def __init__(self, client: OciClient, cache: BlobCache, artifact: modelpack.Artifact) -> None:
        self.client, self.cache = client, cache
        self.declared = {layer.digest: layer.size for layer in artifact.layers}
        self._pool = ThreadPoolExecutor(DOWNLOAD_CONCURRENCY, thread_name_prefix="registry-oci")
        self._started: dict[str, Future[Path]] = {}
        self._lock = threading.Lock()

    def __call__(self, digest: str, size: int) -> Path:
        return self._start(digest, size).result()

    def prefetch(self, layers: list[modelpack.Layer]) -> None:
        for layer in layers:
            self._start(layer.digest, layer.size)

    def close(self) -> None:
        for future in self._started.values():
            future.cancel()
        self._pool.shutdown(wait=True)

    def _start(self, digest: str, size: int) -> Future[Path]:
        if self.declared.get(digest) != size:
            raise OciArtifactError(f"{self.client.ref} has no layer {digest} of {size} bytes")
        with self._lock:
            if digest not in self._started:
                self._started[digest] = self._pool.submit(self._fetch, digest, size)
            return self._started[digest]

    def _fetch(self, digest: str, size: int) -> Path:
        def download(tmp: Path) -> str:
            with transfer(size, f"pull {digest[7:19]}") as progress:
                return self.client.download(digest, size, tmp, progress)

        return self.cache.get(digest, download)


def fetcher(client: OciClient, cache: BlobCache, artifact: modelpack.Artifact) -> LayerFetcher:
    return LayerFetcher(client, cache, artifact)


def registry_record(artifact: modelpack.Artifact, blob_path: BlobPath,
                    origin: str) -> VersionRecord | None:
    """The version an artifact of this registry holds (None for another producer's): its own
    manifest, checked, naming only files that are layers of the artifact."""
    found = artifact.of_type(modelpack.REGISTRY_MANIFEST)
    if not found:
        return None
    layer = found[0]
    if layer.size > MAX_REGISTRY_MANIFEST_BYTES:
        raise OciArtifactError(f"{origin}: its registry manifest declares {layer.size} bytes, "
                               f"more than {MAX_REGISTRY_MANIFEST_BYTES}")
    manifest = mf.loads(blob_path(layer.digest, layer.size).read_bytes(), origin=origin)
    layers = {(x.digest, x.size) for x in artifact.layers}
    for f in version_files(manifest):
        if (f.digest, f.size) not in layers:
            raise OciArtifactError(f"{origin}: its manifest lists {f.role} file {f.name} "
                                   f"({f.digest}, {f.size} bytes), which is not a layer of the "
                                   "artifact; it was not used")
    size = sum(f["size"] for f in manifest["files"])
    return VersionRecord(manifest["name"], manifest["version"], manifest["digest"], size,
                         manifest, dict(manifest.get("tags", {})), [])


def fetch_all(artifact: modelpack.Artifact, blob_path: BlobPath) -> dict[str, Path]:
    """Every layer in the verified cache (side by side): digest -> path."""
    unique = list({layer.digest: layer for layer in artifact.layers}.values())
    paths = concurrently(lambda layer: blob_path(layer.digest, layer.size), unique,
                         workers=DOWNLOAD_CONCURRENCY)
    return {layer.digest: path for layer, path in zip(unique, paths, strict=True)}


def checkpoint_dir(artifact: modelpack.Artifact, blobs: dict[str, Path], root: Path,
                   manifest_digest: str, origin: str) -> Path:
    """Another producer's artifact as a checkpoint directory under ``root`` (in the cache):
    each layer linked at its checked file path. It must hold safetensors weights."""
    weights = [x for x in artifact.of_type(modelpack.WEIGHT)
               if x.filepath.endswith(".safetensors")]
    if not weights:
        raise OciArtifactError(f"{origin} holds no safetensors weights layer "
                               f"({modelpack.WEIGHT} with a *.safetensors file path)")
    target = root / hexdigest(manifest_digest)
    shutil.rmtree(target, ignore_errors=True)
    for layer in artifact.layers:
        if layer.media_type == modelpack.REGISTRY_MANIFEST:
            continue
        link = target / layer.filepath  # filepath passed files.check_file_name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(blobs[layer.digest], link)
    return target


def stage(record: VersionRecord, blob_path: BlobPath, staging: Path) -> list[StagedFile]:
    """Copies of a version's files, verified, ready for a push into the catalog."""
    staged: list[StagedFile] = []
    try:
        for f in version_files(record.manifest):
            copy = staging / f"oci-{hexdigest(f.digest)[:16]}-{len(staged)}"
            shutil.copyfile(blob_path(f.digest, f.size), copy)
            staged.append(StagedFile(copy, VersionFile(f.role, f.name, f.digest, f.size,
                                                       f.tensors)))
    except BaseException:
        for s in staged:
            s.path.unlink(missing_ok=True)
        raise
    return staged
