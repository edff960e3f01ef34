"""A version is a set of files: the one place that knows which blobs a version owns.

Every blob a version owns is content-addressed (``blobs/sha256/<hex>``) and has a role:

- ``weights``: a safetensors shard; the manifest's ``files`` lists them, each with the tensor
  keys it holds (format 2). A format-1 manifest has one shard holding every tensor.
- ``file``: a file that travels with the weights (``config.json``, ``tokenizer.json``), listed in
  the manifest's ``attachments`` with its relative path as ``name``.
- ``export``: an ONNX, pt2 or TorchScript artifact derived from the version after it was
  committed; never in the immutable manifest, but in ``registry/exports`` records.
- ``signature``: an OMS bundle signing the version's files (registry/signing); added after the
  commit like an export, listed in ``manifests/<name>/v<N>.signatures.json``.

Upload-if-missing, the catalog's per-version file rows (what gc keeps and what a server accepts
uploads for), presigned transfers and the MLflow tags all work on :class:`VersionFile` lists
built here, so none of them assumes a version is one blob.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import DigestMismatchError, ManifestError, RefError
from .io.digests import version_digest

Role = Literal["weights", "file", "export", "signature"]
# Roles a push may list (exports are registered after the version exists).
ROLES: tuple[str, ...] = ("weights", "file")
# The largest file attached to a version (registry/attachments.py; a server refuses more).
MAX_FILE_BYTES = 100 * 2**20

# Weights files and shard indexes: a push normalizes them (registry/io/checkpoints.py), never
# stores them as attached files.
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
SAFETENSORS_SUFFIX = ".safetensors"
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_SUFFIXES = (SAFETENSORS_SUFFIX, *PICKLE_SUFFIXES)

_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}")
MAX_NAME_PARTS = 8
MAX_NAME_CHARS = 255


def check_file_name(name: object) -> str:
    """``name`` if it is a safe relative path for a file of a version (``tokenizer.json``,
    ``1_Pooling/config.json``), else :class:`RefError`: it becomes a path under a folder the
    user chose, so nothing may climb out of it or name a hidden or absolute path."""
    if isinstance(name, str) and len(name) <= MAX_NAME_CHARS:
        parts = name.split("/")
        if len(parts) <= MAX_NAME_PARTS and all(_PART_RE.fullmatch(p) and p not in (".", "..")
                                                 for p in parts):
            return name
    shown = repr(name)[:120] if isinstance(name, str) else type(name).__name__
    raise RefError(f"invalid file name {shown}: use a relative path of up to {MAX_NAME_PARTS} "
                   "parts of letters, digits, '.', '_', '+' or '-', not starting with '.'")


def is_weights_name(name: str) -> bool:
    """Whether ``name`` is a weights file or a shard index (stored through normalization)."""
    base = name.rsplit("/", 1)[-1]
    return base in INDEX_FILES or base.lower().endswith(WEIGHT_SUFFIXES)


@dataclass(frozen=True)
class VersionFile:
    """One blob of a version: its role, its name within the version, and its content address."""

    role: Role
    name: str
    digest: str
    size: int
    tensors: tuple[str, ...] = ()

    def to_row(self) -> dict[str, Any]:
        """The catalog / wire form (no tensor list: that lives in the manifest)."""
        return {"role": self.role, "name": self.name, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class StagedFile:
    """A file written by a push, ready to upload: where it is and what it will be.

    ``write`` is set when the push found these bytes stored already and did not write them
    (registry/caching/unchanged.py): :meth:`ensure` writes the file should it be needed after
    all."""

    path: Path
    file: VersionFile = field()
    write: Callable[[Path], tuple[str, int]] | None = None

    @property
    def digest(self) -> str:
        return self.file.digest

    @property
    def size(self) -> int:
        return self.file.size

    @property
    def available(self) -> bool:
        """Whether the file is here, or can be written again."""
        return self.write is not None or self.path.exists()

    def ensure(self) -> Path:
        """The staged file's path, written first if the push skipped it; its bytes must hash
        to the recorded digest, else :class:`DigestMismatchError` (nothing is uploaded)."""
        if self.write is not None and not self.path.exists():
            digest, size = self.write(self.path)
            if (digest, size) != (self.digest, self.size):
                self.path.unlink(missing_ok=True)
                raise DigestMismatchError(
                    f"{self.file.name} was matched to stored blob {self.digest} but now writes "
                    f"as {digest} ({size} bytes): were the weights changed during the push? "
                    "Push again")
        return self.path


def shard_name(index: int, count: int) -> str:
    """The name a weights shard has inside a version, as Hugging Face names shards."""
    if count == 1:
        return "model.safetensors"
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def weight_files(manifest: Mapping[str, Any]) -> list[VersionFile]:
    """The safetensors shards of a (validated) manifest, in order, each with its tensor keys."""
    entries = list(manifest["files"])
    out = []
    for i, entry in enumerate(entries):
        keys = entry.get("tensors")
        if keys is None:  # format 1: one file holding every tensor
            keys = sorted(manifest["tensors"])
        out.append(VersionFile("weights", shard_name(i, len(entries)), entry["digest"],
                               int(entry["size"]), tuple(keys)))
    return out


def attached_files(manifest: Mapping[str, Any]) -> list[VersionFile]:
    """The non-weight files of a manifest (``attachments``), in name order."""
    return [VersionFile("file", a["name"], a["digest"], int(a["size"]))
            for a in manifest.get("attachments", ())]


def version_files(manifest: Mapping[str, Any]) -> list[VersionFile]:
    """Every blob a manifest references: its shards, then its attached files."""
    return weight_files(manifest) + attached_files(manifest)


def weights_digest(files: Iterable[VersionFile]) -> str:
    """The digest that names a version's weights (:func:`registry.io.digests.version_digest`)."""
    return version_digest([f.digest for f in files if f.role == "weights"])


def total_size(files: Sequence[VersionFile]) -> int:
    return sum(f.size for f in files)


def check_push_files(files: Sequence[VersionFile]) -> list[VersionFile]:
    """``files`` if they can make a version: at least one weights file, no name twice; else
    :class:`ManifestError` (a push a server is asked to begin is checked before it reserves)."""
    if not any(f.role == "weights" for f in files):
        raise ManifestError("a push lists no weights file; a version holds at least one "
                            "safetensors shard (role 'weights')")
    seen: set[str] = set()
    for f in files:
        if f.name in seen:
            raise ManifestError(f"a push lists file {f.name!r} twice; list each file once")
        seen.add(f.name)
    return list(files)


def unique_by_digest(files: Iterable[VersionFile]) -> list[VersionFile]:
    """One entry per distinct blob (two identical shards are one upload, one download)."""
    seen: dict[str, VersionFile] = {}
    for f in files:
        seen.setdefault(f.digest, f)
    return list(seen.values())
