"""``registry://`` URIs, materialized into a folder: what ``registry materialize URI DEST`` runs,
the entry point of a KServe ``ClusterStorageContainer`` (a custom storage initializer).

    registry://NAME            the latest version
    registry://NAME:vN         version N
    registry://NAME@ALIAS      the version the alias points at (a weights digest works too)

The folder is whole or absent: a new DEST is written as a temporary folder beside it and
renamed; an existing empty DEST (a volume KServe mounted at ``/mnt/models``, which cannot be
replaced) is filled from a temporary folder inside it, one rename per entry, ``config.json``
last, so a server that waits for its config reads every other file whole. A DEST that holds
anything already is refused and left as it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, Literal

from ..catalog.records import VersionRecord
from ..errors import NormalizationError, RefError, quoted
from ..io import safewrite
from ..pretrained_files import CONFIG_NAME, INDEX_NAME, listing
from ..refs import Ref, parse

SCHEME = "registry://"
Format = Literal["hf", "safetensors"]
FORMATS: tuple[str, ...] = ("hf", "safetensors")
OpenBlob = Callable[[str, int], BinaryIO]


def parse_uri(uri: object) -> Ref:
    """The ref a ``registry://`` URI names; RefError naming the URI otherwise."""
    if not isinstance(uri, str) or not uri.startswith(SCHEME):
        raise RefError(f"{quoted(uri, 120)} is not a registry URI: use registry://NAME, "
                       "registry://NAME:vN or registry://NAME@ALIAS")
    return parse(uri[len(SCHEME):])


def check_format(fmt: object) -> Format:
    if fmt not in FORMATS:
        raise RefError(f"format {quoted(fmt, 40)} is unknown: use hf (a from_pretrained folder) "
                       "or safetensors (the weights alone)")
    return fmt  # type: ignore[return-value]


def write_weights(opened: Callable[[], AbstractContextManager[tuple[VersionRecord, OpenBlob]]],
                  dest: Path) -> None:
    """The shards of the version ``opened()`` opens (``pipelines.pull.opened_files``) under
    Hugging Face's names, byte for byte from the verified blobs, with
    ``model.safetensors.index.json`` when there are several."""
    with opened() as (record, open_blob):
        manifest = record.manifest
        arch = manifest.get("architecture") or {}
        config = arch.get("config") if isinstance(arch.get("config"), dict) else {}
        for f in listing(manifest, config=config):
            if f.blob is not None and f.blob.role == "weights":
                with open_blob(f.blob.digest, f.blob.size) as source:
                    safewrite.copy_open(dest / f.name, source)
            elif f.name == INDEX_NAME and f.data is not None:
                safewrite.write_bytes(dest / f.name, f.data)


def materialize(dest: str | os.PathLike[str], write: Callable[[Path], object]) -> list[Path]:
    """Run ``write(folder)`` on a temporary folder and put what it wrote at ``dest`` (see the
    module's docstring); returns the files written, by their final paths."""
    target = Path(dest)
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise NormalizationError(f"{str(target)!r} exists and is not a folder; pass a new or "
                                 "empty folder to materialize into")
    fill = target.is_dir()
    if fill and any(target.iterdir()):
        raise NormalizationError(f"{str(target)!r} exists and is not empty; pass a new or empty "
                                 "folder (nothing was written)")
    parent = target if fill else target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.registry-"))
    try:
        write(tmp)
        written = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if p.is_file())
        if not fill:
            os.rename(tmp, target)
        else:
            entries = sorted(tmp.iterdir(), key=lambda p: (p.name == CONFIG_NAME, p.name))
            for entry in entries:
                os.rename(entry, target / entry.name)
        return [target / p for p in written]
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
