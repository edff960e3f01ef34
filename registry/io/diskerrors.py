"""I/O failures on the registry's own files, typed where they happen.

A full disk during a push or a pull surfaced as a raw ``OSError: [Errno 28] No space left on
device`` from deep inside a writer. :func:`typed` wraps a write whose path and size are known
and turns an ``OSError`` into :class:`~registry.errors.DiskFullError` (ENOSPC, EDQUOT: the path,
the bytes needed, the bytes free there) or :class:`~registry.errors.StoreError` (any other I/O
failure: the path and the operation). The writers it wraps already remove what they half wrote.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from ..errors import DiskFullError, RegistryError, StoreError

_FULL = {errno.ENOSPC, errno.EDQUOT}


@contextlib.contextmanager
def typed(path: str | os.PathLike[str], needed: int | None, what: str) -> Iterator[None]:
    """Run the block; an ``OSError`` it raises becomes a typed error naming ``path``."""
    try:
        yield
    except RegistryError:
        raise
    except OSError as exc:
        raise error_for(exc, Path(path), needed, what) from None


def error_for(exc: OSError, path: Path, needed: int | None, what: str) -> StoreError:
    """The typed error for ``exc``, raised while ``what`` wrote ``needed`` bytes at ``path``."""
    where = exc.filename if isinstance(exc.filename, str) else str(path)
    if exc.errno in _FULL:
        free = free_bytes(path)
        need = f"{needed} bytes needed" if needed is not None else "more space needed"
        have = f"{free} free" if free is not None else "free space unknown"
        return DiskFullError(f"{what}: no space left on the device of {where} ({need}, {have}); "
                             "free space there, or set REGISTRY_HOME / REGISTRY_CACHE_DIR (or "
                             "the destination) on a larger disk, and try again")
    return StoreError(f"{what}: {exc.strerror or type(exc).__name__} at {where} "
                      f"(errno {exc.errno}); check that folder's permissions and disk, and try "
                      "again")


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system holding ``path`` (its nearest existing folder)."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None
