"""Prefetch: every blob of a version verified in the local cache, no model built.

What an init container, a DaemonSet warming a node's cache or KServe's LocalModelCache job
runs before the model server starts: ``registry prefetch REF...``. It resolves the ref as a pull
does (the record checked, the signature policy applied), then opens each blob through the
backend's verified cache (``Backend.open_blob``: one download per blob per cache, however many
processes ask; registry/caching/cache.py) and records the version in the cache
(registry/caching/cachedir.py).
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._progress import transfer
from ..catalog.records import VersionRecord
from ..errors import RefError
from ..files import VersionFile, attached_files, total_size, unique_by_digest, weight_files
from ..io.parallel import DOWNLOAD_CONCURRENCY, concurrently
from ..refs import Ref, parse
from ..signing import service as signing
from ..trust.record_check import checked
from . import cachedir
from .cache import SIGNATURE_MEMOS, BlobCache

if TYPE_CHECKING:
    from ..backends import Backend
    from ..settings import Settings


@dataclass(frozen=True)
class PrefetchReport:
    """What :meth:`Registry.prefetch` found and fetched for one version."""

    ref: str  # name:vN
    digest: str
    files: int  # distinct blobs of the version (and of its base, for an adapter)
    bytes: int
    fetched: int  # of them, downloaded by this call (0: the cache held them all)
    fetched_bytes: int

    @property
    def already_cached(self) -> bool:
        """Whether every blob was in the cache already: this call fetched nothing."""
        return self.fetched == 0

    def summary(self) -> str:
        """One line for a terminal."""
        held = f"{self.files} file(s), {self.bytes} bytes"
        if self.already_cached:
            return f"{self.ref}: already in the cache ({held}); nothing fetched"
        return (f"{self.ref}: fetched {self.fetched} of {held} ({self.fetched_bytes} bytes); "
                "all verified in the cache")


def prefetch(backend: Backend, settings: Settings, ref: str | Ref, *, files: bool = True,
             jobs: int = DOWNLOAD_CONCURRENCY) -> PrefetchReport:
    """Every blob of ``ref`` (its shards; with ``files`` its attached files; an adapter's
    base's shards too) verified in the cache; what was fetched."""
    if isinstance(ref, str) and ref.startswith("oci://"):
        raise RefError(f"prefetch takes a ref of this registry, not {ref!r}; an OCI artifact is "
                       "fetched into the cache by `registry oci pull` (or served to nodes by a "
                       "peer-to-peer engine in front of the OCI registry: docs/serving.md)")
    if jobs < 1:
        raise RefError(f"jobs={jobs!r} must be at least 1")
    record = resolved(backend, settings, parse(ref))
    wanted = blobs_of(record, files=files)
    base = record.manifest.get("adapter", {}).get("base") if "adapter" in record.manifest \
        else None
    if isinstance(base, dict):  # an adapter is pulled on its base: the base's shards too
        base_record = resolved(backend, settings, Ref(str(base.get("name")),
                                                      digest=str(base.get("digest"))))
        wanted = unique_by_digest(wanted + blobs_of(base_record, files=False))
        cachedir.remember(settings.cache_dir, base_record)
    cache = BlobCache(settings.cache_dir)  # the one the backend downloads into
    missing = [f for f in wanted if not cache.holds(f.digest, f.size)]
    origin = f"{record.name}:v{record.version}"
    with transfer(total_size(missing), f"prefetch {origin}") as progress:
        opened = fetch_all(backend, missing, progress, jobs)
    # A store on this filesystem is read in place (verified there): nothing was fetched.
    missing = [f for f, path in zip(missing, opened, strict=True)
               if path.is_relative_to(cache.root)]
    cachedir.remember(settings.cache_dir, record)
    return PrefetchReport(origin, record.digest, len(wanted), total_size(wanted), len(missing),
                          total_size(missing))


def resolved(backend: Backend, settings: Settings, ref: Ref) -> VersionRecord:
    """The record ``ref`` names, checked and passed by the signature policy, as a pull's."""
    record = checked(backend.resolve(ref))
    signing.enforce(backend.signatures, record.manifest, settings.verify,
                    public_keys=settings.trusted_keys, certificates=settings.trusted_certs,
                    remembered=settings.cache_dir / SIGNATURE_MEMOS)
    return record


def blobs_of(record: VersionRecord, *, files: bool) -> list[VersionFile]:
    """The distinct blobs a pull of ``record`` reads (with ``files``, its attached files)."""
    chosen = weight_files(record.manifest)
    if files:
        chosen += attached_files(record.manifest)
    return unique_by_digest(chosen)


def fetch_all(backend: Backend, missing: Sequence[VersionFile], progress: Callable[[int], None],
              jobs: int) -> list[Path]:
    """Each of ``missing`` opened through the backend (downloaded into the cache and verified,
    or verified where it lies); the paths they were opened at."""
    def fetch(f: VersionFile) -> Path:
        with backend.open_blob(f.digest, f.size) as fh:
            progress(f.size)
            return Path(str(fh.name))
    return concurrently(fetch, missing, workers=jobs)
