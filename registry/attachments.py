"""Files that travel with the weights: ``config.json``, a tokenizer, a model card.

A push takes them from ``files={"tokenizer.json": path}`` and, when the model is a directory (the
output of ``save_pretrained``), from every file in it that is not weights: weights files
(``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``) and shard indexes go through
normalization and are never stored as they are. Each file (at most :data:`MAX_FILE_BYTES`) is
copied into staging while it is hashed, so the bytes stored are the bytes hashed, then stored
content-addressed like a shard and listed in the manifest's ``attachments``.

:func:`pull_files` writes them back under a folder the caller chose, each fetched through the
verified cache; a name is a checked relative path (:func:`registry.files.check_file_name`), and
the folder it lands in is checked again to lie inside the destination.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from .errors import CheckpointError, NormalizationError
from .files import (
    MAX_FILE_BYTES,
    StagedFile,
    VersionFile,
    attached_files,
    check_file_name,
    is_weights_name,
)
from .io import safewrite
from .io.digests import HashingWriter
from .trust import boundedjson

_CHUNK = 1024 * 1024
# A pushed directory's signature (``model_signing sign``), and the name it is attached under.
SIGNATURE_NAME = "model.sig"
PROVENANCE_NAME = "provenance/model.sig"
# Files HF tooling leaves in a model directory that do not belong to the model.
_SKIPPED_DIRS = {"__pycache__"}


def collect(model: object, files: Mapping[str, str | os.PathLike[str]] | None
            ) -> dict[str, Path]:
    """Name -> local path of every file a push attaches: the non-weight files of a directory
    ``model``, then ``files`` (which win over a directory file of the same name)."""
    found: dict[str, Path] = {}
    if isinstance(model, (str, os.PathLike)) and Path(model).is_dir():
        found.update(directory_files(Path(model)))
    if files is None:
        return found
    if not isinstance(files, Mapping):
        raise NormalizationError(f"files must be a dict of name -> path, got "
                                 f"{type(files).__name__}")
    for name, path in files.items():
        name = check_file_name(name)
        if is_weights_name(name):
            raise NormalizationError(
                f"file {name!r} is a weights file or shard index: weights are pushed as the model "
                "(a module, a state dict, a checkpoint file or directory), not attached")
        if not isinstance(path, (str, os.PathLike)) or not Path(path).is_file():
            raise NormalizationError(f"file {name!r}: {str(path)[:200]!r} does not exist or is "
                                     "not a file; pass the path of the file to attach")
        found[name] = Path(path)
    return dict(sorted(found.items()))


def as_provenance(named: Mapping[str, Path]) -> dict[str, Path]:
    """A pushed directory's files as they are attached: its ``model.sig`` (``model_signing
    sign``'s signature of the files as they were; registry/signing/push.py checks it) under
    :data:`PROVENANCE_NAME`, since the version's files are normalized, not the ones it signed."""
    if SIGNATURE_NAME not in named:
        return dict(named)
    out = dict(named)
    out[PROVENANCE_NAME] = out.pop(SIGNATURE_NAME)
    return dict(sorted(out.items()))


def directory_files(directory: Path) -> dict[str, Path]:
    """Every non-weight file under ``directory`` by its relative name; hidden files and folders
    (``.git``, ``.cache``) are not part of a model and are left out. A linked file is read
    through its link only where it resolves inside ``directory`` or, for a Hugging Face cache
    snapshot (all links), into that cache's own ``blobs/``: any other link (``tokenizer.json ->
    ~/.ssh/id_rsa`` in an unpacked tarball) is refused, naming it. Linked folders are not
    followed."""
    out: dict[str, Path] = {}
    base = directory.resolve()
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS)
        for file_name in sorted(names):
            path = Path(root) / file_name
            name = path.relative_to(directory).as_posix()
            if file_name.startswith(".") or is_weights_name(name) or not path.is_file():
                continue
            if path.is_symlink() and not _link_allowed(path.resolve(), base):
                raise NormalizationError(
                    f"{str(path)!r} is a link to {str(path.resolve())!r}, outside the folder "
                    "being pushed; copy the file into the folder or remove the link")
            out[check_file_name(name)] = path
    return out


def _link_allowed(target: Path, base: Path) -> bool:
    """Whether a link in folder ``base`` may be followed to ``target``: inside ``base``, or a
    Hugging Face cache's ``<repo>/blobs/<hash>`` when ``base`` is under ``<repo>/snapshots``."""
    if target == base or base in target.parents:
        return True
    blobs = target.parent
    return blobs.name == "blobs" and blobs.parent / "snapshots" in base.parents


def stage(named: Mapping[str, Path], staging: Path) -> list[StagedFile]:
    """Copy each file into ``staging``, hashing as it copies; refuse one over the limit. On
    failure nothing is left behind."""
    staged: list[StagedFile] = []
    try:
        for name, path in named.items():
            staged.append(_stage_one(name, path, staging))
    except BaseException:
        for s in staged:
            s.path.unlink(missing_ok=True)
        raise
    return staged


def _too_large(name: str, size: int) -> NormalizationError:
    return NormalizationError(
        f"file {name!r} is {size} bytes, over the limit of {MAX_FILE_BYTES} bytes "
        f"({MAX_FILE_BYTES // 2**20} MiB) for a file attached to a version; leave it out "
        "(weights files belong in the model, not in files=)")


def _stage_one(name: str, path: Path, staging: Path) -> StagedFile:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise _too_large(name, size)
        target = staging / f"file-{uuid.uuid4().hex}"
        try:
            with open(path, "rb") as src, open(target, "wb") as fh, HashingWriter(fh) as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    if out.written > MAX_FILE_BYTES:  # grew while being read
                        raise _too_large(name, out.written)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise CheckpointError(f"file {name!r} ({str(path)[:200]!r}) cannot be read: "
                              f"{exc.strerror or type(exc).__name__}") from None
    return StagedFile(target, VersionFile("file", name, out.digest(), out.written))


def manifest_entries(staged: list[StagedFile]) -> list[dict[str, Any]]:
    """The manifest's ``attachments``: name, digest and size of each file, by name."""
    return [{"name": s.file.name, "digest": s.digest, "size": s.size}
            for s in sorted(staged, key=lambda s: s.file.name)]


# -- the architecture a save_pretrained directory records --------------------------------------

MAX_CONFIG_BYTES = 16 * 2**20


def transformers_architecture(directory: Path) -> dict[str, Any] | None:
    """``{"kind": "transformers", "class": "transformers:<Class>", "config": {...},
    "generation_config": {...}}`` from a ``save_pretrained`` directory's ``config.json`` (and
    ``generation_config.json`` when present); None when it has no config naming its class."""
    config = _json_file(directory / "config.json")
    if config is None:
        return None
    classes = config.get("architectures")
    if not isinstance(classes, list) or not classes or not isinstance(classes[0], str) \
            or not classes[0].isidentifier():
        return None
    out: dict[str, Any] = {"kind": "transformers", "class": f"transformers:{classes[0]}",
                           "config": config}
    generation = _json_file(directory / "generation_config.json")
    if generation is not None:
        out["generation_config"] = generation
    return out


def _json_file(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{str(path)!r} is larger than {MAX_CONFIG_BYTES} bytes; it is "
                              "not a model config")
    try:
        data = boundedjson.loads(path.read_text(encoding="utf-8"),
                                parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{str(path)!r} is not valid JSON ({str(exc)[:120]}); fix or "
                              "remove it before pushing the directory") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{str(path)!r} holds a {type(data).__name__}, not a JSON object")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- pulling them back --------------------------------------------------------------------------

def destination(root: Path, name: str) -> Path:
    """Where file ``name`` goes under ``root``: a checked name, in a folder made one level at a
    time that resolves inside ``root`` (a linked sub-folder pointing elsewhere is refused before
    anything is made)."""
    check_file_name(name)
    parent, _, base = name.rpartition("/")
    return safewrite.folder(root, parent) / base


def write_file(target: Path, source: BinaryIO) -> None:
    """Copy the open file ``source`` (the very file that was verified) to ``target`` through a
    new temporary file in the same folder, so a reader never sees half a file and an existing
    link at ``target`` is replaced, not followed."""
    safewrite.copy_open(target, source)


def write_bytes(target: Path, data: bytes) -> None:
    safewrite.write_bytes(target, data)


def _clashes(names: list[str]) -> None:
    """Refuse a file list where one name is a folder of another (``x`` and ``x/y``): one of
    them could not be written, and which would depend on the order."""
    folders = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
    for name in names:
        if name in folders:
            raise NormalizationError(f"file {name!r} is also a folder of another file of this "
                                     "version, so the version cannot be written as files")


def pull_files(manifest: Mapping[str, Any], open_blob: Callable[[str, int], BinaryIO],
               dest_dir: str | os.PathLike[str], *, skip: Callable[[str], bool] = lambda _n: False
               ) -> Path:
    """Write every attached file of ``manifest`` under ``dest_dir`` (created if missing), each
    copied from the file ``open_blob(digest, size)`` verified (``Backend.open_blob``), never from
    its path opened again; returns ``dest_dir``."""
    root = Path(dest_dir)
    if root.exists() and not root.is_dir():
        raise NormalizationError(f"{str(root)!r} exists and is not a folder; pass a folder to "
                                 "write the files into")
    files = [f for f in attached_files(manifest) if not skip(f.name)]
    _clashes([f.name for f in files])
    safewrite.folder(root)
    for f in files:
        with open_blob(f.digest, f.size) as source:
            write_file(destination(root, f.name), source)
    return root
