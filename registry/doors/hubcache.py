"""Derived revisions of the Hub door on this node: ``<cache>/hub/<commit>/``, each folder
holding the files ``save_pretrained`` wrote, :data:`ORIGIN_NAME` (the version and dtype it was
derived from) and, written last, :data:`LISTING_NAME` (name -> sha256 hex and size): a folder
with a listing is whole. The folder's mtime is the revision's last use (touched by every file
the door serves from it).

    hub/<commit>/                 a derived revision (renamed into place whole)
    hub/.<commit>-<random>/       one being derived (registry/doors/hfderive.py)
    hub/.gone-<commit>-<random>/  one being removed (renamed away first, then deleted)
    hub/.locks/<commit>.lock      held while a revision is derived or removed

Removal beside readers (``registry cache prune``, :func:`remove`): a revision is removed only
while its lock is held exclusively, taken without waiting, so never while it is being derived;
it is renamed away in one step, so a reader sees the whole folder or none. A file the door has
already opened keeps its bytes (Linux keeps an open file's data until it is closed); a reader
that listed the folder before it went and opens a file after derives it again
(:meth:`registry.doors.hf.HubDoor.open`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ManifestError
from ..files import check_file_name
from ..trust import boundedjson

LISTING_NAME = ".registry-hub-files.json"
ORIGIN_NAME = ".registry-hub-origin.json"
MAX_LISTING_BYTES = 4 * 2**20
LOCKS = ".locks"
_COMMIT = re.compile(r"[0-9a-f]{40}")
# A folder being derived (``.<commit>-``) or removed (``.gone-<commit>-``).
_PARTIAL = re.compile(r"\.(?:gone-)?([0-9a-f]{40})-.+")


@dataclass(frozen=True)
class DerivedRevision:
    """A derived revision in the cache: its commit, what it was derived from
    (``name:vN+dtype``; empty for a folder written before origins were recorded), its files
    and bytes, and its last use (a timestamp)."""

    commit: str
    origin: str
    name: str
    version: int
    files: int
    bytes: int
    last_used: float


def read_listing(root: Path) -> dict[str, tuple[str, int, Path]] | None:
    """name -> (sha256 hex, size, path) of a finished folder; None if it has no listing yet."""
    try:
        with open(root / LISTING_NAME, "rb") as fh:
            data = fh.read(MAX_LISTING_BYTES + 1)
    except FileNotFoundError:
        return None
    listed = boundedjson.loads(data) if len(data) <= MAX_LISTING_BYTES else None
    if not isinstance(listed, dict):
        raise ManifestError(f"{root / LISTING_NAME} is not a listing this registry wrote; "
                            "delete the folder and it is derived again")
    out: dict[str, tuple[str, int, Path]] = {}
    for name, entry in sorted(listed.items()):
        name = check_file_name(name)
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], int)):
            raise ManifestError(f"{root / LISTING_NAME} lists {name!r} oddly; delete the folder "
                                "and it is derived again")
        out[name] = (entry[0], entry[1], root / name)
    return out


def write_listing(root: Path, files: Mapping[str, tuple[str, int]]) -> None:
    """Record a derived folder's files (written last: its presence means the folder is whole)."""
    (root / LISTING_NAME).write_text(json.dumps({k: list(v) for k, v in files.items()}))


def write_origin(root: Path, name: str, version: int, dtype: str | None) -> None:
    """Record which version (and dtype) a derived folder was made from, for ``cache ls`` and
    ``cache prune --keep``."""
    (root / ORIGIN_NAME).write_text(json.dumps({"name": name, "version": version,
                                                "dtype": dtype}))


def touch(root: Path) -> None:
    """Mark the derived revision at ``root`` as just used."""
    with contextlib.suppress(OSError):  # the mark only orders prune's choices
        os.utime(root)


@contextlib.contextmanager
def locked(hub_dir: Path, commit: str, *, wait: bool = True) -> Iterator[None]:
    """Hold the lock of revision ``commit`` exclusively; BlockingIOError when ``wait`` is False
    and another process holds it."""
    path = hub_dir / LOCKS / f"{commit}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass  # removed by a prune while we waited: lock the one at the path now
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)


def revisions(hub_dir: Path) -> list[DerivedRevision]:
    """Every whole derived revision under ``hub_dir`` (a folder without a listing, or one whose
    listing is damaged, is a partial one: :func:`sweep` judges it)."""
    found: list[DerivedRevision] = []
    if not hub_dir.is_dir():
        return found
    for root in sorted(hub_dir.iterdir()):
        if not _COMMIT.fullmatch(root.name):
            continue
        try:
            listed = read_listing(root)
            used = root.stat().st_mtime
        except (OSError, ManifestError, ValueError):
            continue
        if listed is None:
            continue
        name, version, dtype = _origin(root)
        origin = f"{name}:v{version}{'+' + dtype if dtype else ''}" if name else ""
        found.append(DerivedRevision(root.name, origin, name, version, len(listed),
                                     _bytes_under(root), used))
    return found


def remove(hub_dir: Path, commit: str) -> int | None:
    """Remove revision ``commit`` unless it is being derived or removed now (its lock taken
    without waiting); the bytes freed, or None when it is busy."""
    try:
        with locked(hub_dir, commit, wait=False):
            root = hub_dir / commit
            gone = Path(tempfile.mkdtemp(dir=hub_dir, prefix=f".gone-{commit}-"))
            try:
                os.rename(root, gone / commit)  # one step: readers see it whole or not at all
            except FileNotFoundError:
                return 0
            finally:
                freed = _bytes_under(gone)
                shutil.rmtree(gone, ignore_errors=True)
            return freed
    except BlockingIOError:
        return None


def sweep(hub_dir: Path) -> int:
    """Remove the folders of derivations or removals that died (their revision's lock free);
    the count removed. A derivation running now holds its lock and is left alone."""
    removed = 0
    if not hub_dir.is_dir():
        return removed
    for path in sorted(hub_dir.iterdir()):
        partial = _PARTIAL.fullmatch(path.name)
        if partial is None or not path.is_dir():
            continue
        try:
            with locked(hub_dir, partial.group(1), wait=False):
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        except BlockingIOError:
            continue
    return removed


def _origin(root: Path) -> tuple[str, int, str | None]:
    try:
        with open(root / ORIGIN_NAME, "rb") as fh:
            note = boundedjson.loads(fh.read(4096))
        name, version, dtype = note["name"], note["version"], note["dtype"]
        if isinstance(name, str) and type(version) is int and (dtype is None
                                                               or isinstance(dtype, str)):
            return name[:200], version, dtype
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return "", 0, None


def _bytes_under(root: Path) -> int:
    total = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total
