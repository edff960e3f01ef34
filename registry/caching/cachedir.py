"""The local cache seen whole: which versions it holds (``registry cache ls``) and bounding it
(``registry cache prune``), safe beside pulls running at the same moment.

Beside the layout of registry/caching/cache.py, a pull or a prefetch writes down the version it
read::

    versions/<sha256(name:vN)[:32]>.json   {"name", "version", "digest", "files": [[digest, size]]}

so the listing can say which versions the blobs make up. The memo's mtime is the version's last
use; a blob's last use is its lock file's mtime (touched by every open, registry/caching/cache.py).
The Hub door's derived revisions (``hub/<commit>/``, a dtype variant or a rewritten directory
made by ``registry serve``: registry/doors/hubcache.py) are listed and pruned beside the blobs,
by their last use too.

What prune guarantees: a blob is removed only while its lock is held exclusively by prune,
taken without waiting (``BlobCache.try_remove``). A pull holds that lock shared from before it
opens the blob until it closes the verified file, and a download holds it exclusively, so a blob
being downloaded, verified or read is skipped (reported busy), never removed under its reader.
A file a pull already mapped and closed may be removed: on Linux its mapping keeps the bytes
until it is unmapped (the disk space comes back then). A partial download is removed only when
no download holds its blob's lock (its process died). A derived revision is removed only while
its lock is held exclusively by prune, taken without waiting (never one being derived), renamed
away in one step: a file the door has opened keeps its bytes, and a revision asked for after its
removal is derived again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..catalog.records import VersionRecord
from ..doors import hubcache
from ..doors.hubcache import DerivedRevision
from ..errors import RefError
from ..files import version_files
from ..io.digests import check_digest
from ..trust import boundedjson
from .cache import LOCK_SUFFIX, SIGNATURE_MEMOS, BlobCache

VERSIONS = "versions"
HUB = "hub"  # the Hub door's derived revisions
MAX_VERSION_MEMO_BYTES = 4 * 2**20  # a memo lists a version's blobs: a few KB
# A download's temporary file is named after its blob: 16 hex digits, a dash
# (registry/caching/cache.py).
_DOWNLOAD_PREFIX = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class CachedVersion:
    """A version the cache holds blobs of."""

    ref: str  # name:vN
    digest: str
    files: int
    bytes: int
    held_files: int
    held_bytes: int
    last_used: datetime

    @property
    def complete(self) -> bool:
        return self.held_files == self.files


@dataclass(frozen=True)
class CacheListing:
    """What ``registry cache ls`` shows."""

    root: Path
    versions: list[CachedVersion]
    blobs: int
    blob_bytes: int
    unlisted_blobs: int  # blobs no listed version names (an OCI layer, a pushed file)
    unlisted_bytes: int
    signature_memos: int
    signature_bytes: int
    temporary_bytes: int
    hub_revisions: list[DerivedRevision] = field(default_factory=list)

    @property
    def hub_bytes(self) -> int:
        return sum(r.bytes for r in self.hub_revisions)

    @property
    def total_bytes(self) -> int:
        return self.blob_bytes + self.signature_bytes + self.temporary_bytes + self.hub_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "total_bytes": self.total_bytes,
                "blobs": self.blobs, "blob_bytes": self.blob_bytes,
                "unlisted_blobs": self.unlisted_blobs, "unlisted_bytes": self.unlisted_bytes,
                "signature_memos": self.signature_memos,
                "signature_bytes": self.signature_bytes,
                "temporary_bytes": self.temporary_bytes,
                "versions": [{"ref": v.ref, "digest": v.digest, "files": v.files,
                              "bytes": v.bytes, "held_files": v.held_files,
                              "held_bytes": v.held_bytes, "complete": v.complete,
                              "last_used": v.last_used.isoformat()} for v in self.versions],
                "hub_bytes": self.hub_bytes,
                "hub_revisions": [{"commit": r.commit, "origin": r.origin, "files": r.files,
                                   "bytes": r.bytes, "last_used": _utc(r.last_used).isoformat()}
                                  for r in self.hub_revisions]}


@dataclass
class PruneReport:
    """What ``registry cache prune`` removed, and the blobs it left because a pull used them."""

    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    busy: list[str] = field(default_factory=list)
    kept: int = 0  # blobs of --keep versions
    signature_memos: int = 0
    temporary_files: int = 0
    remaining_bytes: int = 0
    # Derived revisions of the Hub door removed (name:vN+dtype, or the commit), and those
    # being derived now, skipped (their commits). Their bytes count in freed/remaining_bytes.
    hub_revisions: list[str] = field(default_factory=list)
    hub_busy: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"removed": self.removed, "freed_bytes": self.freed_bytes, "busy": self.busy,
                "kept": self.kept, "signature_memos": self.signature_memos,
                "temporary_files": self.temporary_files,
                "remaining_bytes": self.remaining_bytes, "hub_revisions": self.hub_revisions,
                "hub_busy": self.hub_busy}


# -- version memos ---------------------------------------------------------------------------


def remember(cache_dir: Path, record: VersionRecord) -> None:
    """Write down (or mark as just used) that the cache serves ``record``'s blobs."""
    memo = _memo_path(cache_dir, f"{record.name}:v{record.version}")
    with contextlib.suppress(OSError):  # a memo only feeds the listing
        if memo.exists():
            os.utime(memo)
            return
        memo.parent.mkdir(parents=True, exist_ok=True)
        files = [[f.digest, f.size] for f in version_files(record.manifest)]
        fd, tmp = tempfile.mkstemp(dir=memo.parent, prefix=".memo-")
        with os.fdopen(fd, "w") as fh:
            json.dump({"name": record.name, "version": record.version,
                       "digest": record.digest, "files": files}, fh)
        os.replace(tmp, memo)


def _memo_path(cache_dir: Path, ref: str) -> Path:
    return cache_dir / VERSIONS / f"{hashlib.sha256(ref.encode()).hexdigest()[:32]}.json"


def _version_memos(cache_dir: Path) -> Iterable[tuple[Path, dict[str, Any]]]:
    """Each readable version memo; one that is damaged or not ours is skipped."""
    root = cache_dir / VERSIONS
    if not root.is_dir():
        return
    for path in sorted(root.glob("*.json")):
        try:
            if path.stat().st_size > MAX_VERSION_MEMO_BYTES:
                continue
            memo = boundedjson.loads(path.read_text())
            files = [(check_digest(d), int(s)) for d, s in memo["files"]]
            yield path, {"ref": f"{memo['name']}:v{int(memo['version'])}",
                         "digest": str(memo["digest"]), "files": files}
        except (OSError, ValueError, KeyError, TypeError, RefError):
            continue


# -- the listing -----------------------------------------------------------------------------


def _blobs(cache: BlobCache) -> dict[str, tuple[int, float]]:
    """Every blob in the cache: digest -> (size, last use as a timestamp)."""
    found: dict[str, tuple[int, float]] = {}
    folder = cache.root / "blobs" / "sha256"
    if not folder.is_dir():
        return found
    for path in folder.iterdir():
        try:
            digest = check_digest(f"sha256:{path.name}")
            st = path.lstat()
        except (RefError, OSError):
            continue
        used = st.st_mtime
        with contextlib.suppress(OSError):
            used = max(used, cache.lock_path(digest).stat().st_mtime)
        found[digest] = (st.st_size, used)
    return found


def _files_under(folder: Path) -> list[tuple[Path, os.stat_result]]:
    out = []
    if folder.is_dir():
        for root, _dirs, names in os.walk(folder):
            for name in names:
                with contextlib.suppress(OSError):
                    path = Path(root, name)
                    out.append((path, path.lstat()))
    return out


def listing(cache_dir: Path) -> CacheListing:
    """The versions and bytes the cache at ``cache_dir`` holds."""
    cache = BlobCache(cache_dir)
    blobs = _blobs(cache)
    versions, listed = [], set[str]()
    for path, memo in _version_memos(cache_dir):
        held = [(d, s) for d, s in dict(memo["files"]).items() if d in blobs]
        listed.update(d for d, _ in held)
        if not held:
            continue  # none of its blobs is here (read in place from a file store, or pruned)
        unique = dict(memo["files"])
        versions.append(CachedVersion(
            memo["ref"], memo["digest"], len(unique), sum(unique.values()), len(held),
            sum(s for _, s in held),
            datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)))
    unlisted = [size for d, (size, _) in blobs.items() if d not in listed]
    signatures = _files_under(cache_dir / SIGNATURE_MEMOS)
    temporary = _files_under(cache_dir / "tmp")
    return CacheListing(cache_dir, sorted(versions, key=lambda v: v.ref), len(blobs),
                        sum(s for s, _ in blobs.values()), len(unlisted), sum(unlisted),
                        len(signatures), sum(st.st_size for _, st in signatures),
                        sum(st.st_size for _, st in temporary),
                        hubcache.revisions(cache_dir / HUB))


def _utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, timezone.utc)


# -- prune -----------------------------------------------------------------------------------


def prune(cache_dir: Path, *, keep: Iterable[str] = (), keep_versions: Iterable[str] = (),
          max_size: int | None = None, older_than: timedelta | None = None,
          now: datetime | None = None) -> PruneReport:
    """Remove blobs (never one in ``keep``, never one a pull uses now), the Hub door's derived
    revisions (never one of a version in ``keep_versions``, ``name:vN``; never one being
    derived now), signature memos and dead temporary files: those unused for ``older_than``;
    then the least recently used until the cache holds at most ``max_size`` bytes; with
    neither, everything not kept."""
    cache = BlobCache(cache_dir)
    report = PruneReport()
    moment = (now or datetime.now(timezone.utc)).timestamp()
    keep = set(keep)
    blobs = _blobs(cache)
    hub_dir = cache_dir / HUB
    derived = {r.commit: r for r in hubcache.revisions(hub_dir)}
    wanted = set(keep_versions)
    spare = {c for c, r in derived.items() if f"{r.name}:v{r.version}" in wanted}
    report.kept = sum(1 for d in blobs if d in keep)
    signatures = sorted(_files_under(cache_dir / SIGNATURE_MEMOS),
                        key=lambda item: item[1].st_mtime)
    everything = max_size is None and older_than is None

    def old(used: float) -> bool:
        return everything or (older_than is not None
                              and moment - used > older_than.total_seconds())

    def remove(digest: str) -> None:
        freed = cache.try_remove(digest)
        if freed is None:
            report.busy.append(digest)
            return
        report.removed.append(digest)
        report.freed_bytes += freed
        del blobs[digest]

    def drop(commit: str) -> None:
        freed = hubcache.remove(hub_dir, commit)
        if freed is None:
            report.hub_busy.append(commit)
            return
        report.hub_revisions.append(derived[commit].origin or commit)
        report.freed_bytes += freed
        del derived[commit]

    # Least recently used first: what --max-size removes once --older-than has run.
    for digest, (_size, used) in sorted(blobs.items(), key=lambda item: item[1][1]):
        if digest not in keep and old(used):
            remove(digest)
    for commit, rev in sorted(derived.items(), key=lambda item: item[1].last_used):
        if commit not in spare and old(rev.last_used):
            drop(commit)
    for path, st in list(signatures):
        if old(st.st_mtime):
            _unlink(path, report)
            signatures.remove((path, st))
    report.temporary_files = _sweep_temporary(cache) + hubcache.sweep(hub_dir)
    if max_size is not None:
        size = (sum(s for s, _ in blobs.values()) + sum(st.st_size for _, st in signatures)
                + sum(r.bytes for r in derived.values()))
        lru = sorted([(used, False, d) for d, (_s, used) in blobs.items() if d not in keep]
                     + [(r.last_used, True, c) for c, r in derived.items() if c not in spare])
        for _used, is_revision, key in lru:
            if size <= max_size:
                break
            held, gone = (derived[key].bytes, derived) if is_revision else (blobs[key][0], blobs)
            if is_revision:
                drop(key)
            else:
                remove(key)
            if key not in gone:
                size -= held
        for path, st in signatures:  # the oldest checks first
            if size <= max_size:
                break
            _unlink(path, report)
            size -= st.st_size
    _drop_empty_version_memos(cache_dir, set(blobs))
    report.remaining_bytes = sum(s for s, _ in blobs.values()) + sum(
        st.st_size for _, st in _files_under(cache_dir / SIGNATURE_MEMOS)) + sum(
        r.bytes for r in derived.values())
    return report


def _unlink(path: Path, report: PruneReport) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        report.signature_memos += 1


def _sweep_temporary(cache: BlobCache) -> int:
    """Remove the partial files of downloads that died (``<hex16>-*``, their blob's lock free:
    a live download holds it). Other temporary files (a push staging its shards here) are
    left to ``registry gc`` and its grace."""
    removed = 0
    locks = cache.root / "locks" / "sha256"
    for path, _st in _files_under(cache.root / "tmp"):
        prefix = path.name.split("-", 1)[0]
        if not _DOWNLOAD_PREFIX.fullmatch(prefix):
            continue
        found = list(locks.glob(f"{prefix}*{LOCK_SUFFIX}"))
        if not found or any(_held(lock) for lock in found):
            continue  # not a download, or one still running
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def _held(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _drop_empty_version_memos(cache_dir: Path, held: set[str]) -> None:
    for path, memo in _version_memos(cache_dir):
        if not any(d in held for d, _ in memo["files"]):
            path.unlink(missing_ok=True)
