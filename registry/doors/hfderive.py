"""Derived revisions of the Hub door, written once by ``save_pretrained``'s own writer.

:func:`derive` writes a revision's directory into a temporary folder beside its place, hashes
every file, records the listing last and renames the folder into place: a reader sees the whole
folder or none, and two processes deriving the same revision keep the first rename. This module
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
from ..digests import sha256_file
from ..files import is_weights_name
from ..pretrained import write_pretrained, write_shards
from ..pretrained_files import is_transformers
from .hubcache import write_listing


def derive(manifest: Mapping[str, Any], open_blob: Callable[[str, int], BinaryIO], root: Path,
           dtype: str | None, origin: str) -> None:
    """Write the directory ``save_pretrained(..., dtype)`` writes for ``manifest`` into
    ``root`` (a version without a transformers config: its attached files and its shards,
    cast), unless another process did first."""
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
    try:
        if "adapter" in manifest or is_transformers(manifest):
            write_pretrained(manifest, open_blob, tmp, dtype or "auto", origin)
        else:
            attachments.pull_files(manifest, open_blob, tmp, skip=is_weights_name)
            write_shards(manifest, open_blob, tmp, dtype or "auto", origin)
        files = {p.relative_to(tmp).as_posix(): (sha256_file(p)[7:], p.stat().st_size)
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        write_listing(tmp, files)
        with contextlib.suppress(OSError):  # another process renamed its copy first
            os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
