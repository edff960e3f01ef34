"""Derived revisions of the Hub door on this node: ``<cache>/hub/<commit>/``, each folder
holding the files ``save_pretrained`` wrote and, written last, :data:`LISTING_NAME` (name ->
sha256 hex and size): a folder with a listing is whole."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from .. import boundedjson
from ..errors import ManifestError
from ..files import check_file_name

LISTING_NAME = ".registry-hub-files.json"
MAX_LISTING_BYTES = 4 * 2**20


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
