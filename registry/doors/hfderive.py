"""Derived revisions of the Hub door, written once by ``save_pretrained``'s own writer.

:func:`derive` writes a revision's directory into a temporary folder beside its place, hashes
every file, records its origin and then the listing, and renames the folder into place: a reader
sees the whole folder or none. It holds the revision's lock meanwhile (registry/doors/hubcache.py),
so two processes derive a revision once, and a ``cache prune`` never takes a folder being
written. This module
loads torch; :mod:`registry.doors.hf` imports it on the first derived revision only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from .. import attachments
from ..files import is_weights_name
from ..io.digests import sha256_file
from ..pretrained import write_pretrained, write_shards
from ..pretrained_files import is_transformers
from .hubcache import locked, read_listing, write_listing, write_origin


def derive(manifest: Mapping[str, Any], open_blob: Callable[[str, int], BinaryIO], root: Path,
           dtype: str | None, name: str, version: int) -> None:
    """Write the directory ``save_pretrained(..., dtype)`` writes for version ``name:vN``
    (``manifest``) into ``root`` (a version without a transformers config: its attached files
    and its shards, cast), unless another process did first."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with locked(root.parent, root.name):
        if read_listing(root) is None:
            _derive(manifest, open_blob, root, dtype, name, version)


def _derive(manifest: Mapping[str, Any], open_blob: Callable[[str, int], BinaryIO], root: Path,
            dtype: str | None, name: str, version: int) -> None:
    origin = f"{name}:v{version}"
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
    try:
        if "adapter" in manifest or is_transformers(manifest):
            write_pretrained(manifest, open_blob, tmp, dtype or "auto", origin)
        else:
            attachments.pull_files(manifest, open_blob, tmp, skip=is_weights_name)
            write_shards(manifest, open_blob, tmp, dtype or "auto", origin)
        files = {p.relative_to(tmp).as_posix(): (sha256_file(p)[7:], p.stat().st_size)
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        write_origin(tmp, name, version, dtype)
        write_listing(tmp, files)
        with contextlib.suppress(OSError):  # a folder without a listing in the way: the door says
            os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
