"""Read a ModelPack artifact back: its manifest checked, each layer fetched into the verified
cache (hashed while it arrives, refused past its declared size), and the version it holds.

An artifact this registry pushed carries its own manifest as a layer: the version comes back
as it was, every file cross-checked against the layers. Another producer's artifact (plain
safetensors and config layers) is read by foreign.py. A layer is used only through the
verified open of its cache file (:meth:`LayerFetcher.open`), never reopened by its path.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from .. import manifest as mf
from .._progress import transfer
from ..caching.cache import BlobCache
from ..catalog.records import VersionRecord
from ..errors import DigestMismatchError, OciArtifactError
from ..files import StagedFile, VersionFile, version_files
from ..io.digests import hexdigest, sha256_bytes
from ..io.parallel import DOWNLOAD_CONCURRENCY
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
    return modelpack.read(body, media_type, origin=str(ref),
                          max_bytes=free_bytes(cache_root)), digest


def free_bytes(cache_root: Path) -> int:
    """What a pull may write under the cache: its disk's free space less a reserve."""
    cache_root.mkdir(parents=True, exist_ok=True)
    return max(shutil.disk_usage(cache_root).free - DISK_RESERVE, 0)


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

    def open(self, digest: str, size: int) -> BinaryIO:
        """The layer's cache file, fetched if needed, open: checked against its digest on this
        very open file (the verification memo, else hashed through it), as Backend.open_blob
        hands out stored blobs."""
        self._start(digest, size).result()
        return self.cache.open(digest, lambda tmp: self._download(digest, size, tmp), size)

    def open_fd(self, digest: str, size: int) -> int:
        """:meth:`open`'s file as a descriptor of its own: what a caller that passes the
        result to ``open()`` gets is the verified file, never the path opened again."""
        with self.open(digest, size) as fh:
            return os.dup(fh.fileno())

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
        return self.cache.get(digest, lambda tmp: self._download(digest, size, tmp), size)

    def _download(self, digest: str, size: int, tmp: Path) -> str:
        with transfer(size, f"pull {digest[7:19]}") as progress:
            return self.client.download(digest, size, tmp, progress)


def fetcher(client: OciClient, cache: BlobCache, artifact: modelpack.Artifact) -> LayerFetcher:
    return LayerFetcher(client, cache, artifact)


def registry_record(artifact: modelpack.Artifact, layers: LayerFetcher,
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
    with layers.open(layer.digest, layer.size) as fh:
        manifest = mf.loads(fh.read(), origin=origin)
    held = {(x.digest, x.size) for x in artifact.layers}
    for f in version_files(manifest):
        if (f.digest, f.size) not in held:
            raise OciArtifactError(f"{origin}: its manifest lists {f.role} file {f.name} "
                                   f"({f.digest}, {f.size} bytes), which is not a layer of the "
                                   "artifact; it was not used")
    size = sum(f["size"] for f in manifest["files"])
    return VersionRecord(manifest["name"], manifest["version"], manifest["digest"], size,
                         manifest, dict(manifest.get("tags", {})), [])


def stage(record: VersionRecord, layers: LayerFetcher, staging: Path) -> list[StagedFile]:
    """Copies of a version's files, read from their verified open files, ready for a push into
    the catalog."""
    staged: list[StagedFile] = []
    try:
        for f in version_files(record.manifest):
            copy = staging / f"oci-{hexdigest(f.digest)[:16]}-{len(staged)}"
            with layers.open(f.digest, f.size) as src, open(copy, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            staged.append(StagedFile(copy, VersionFile(f.role, f.name, f.digest, f.size,
                                                       f.tensors)))
    except BaseException:
        for s in staged:
            s.path.unlink(missing_ok=True)
        raise
    return staged
