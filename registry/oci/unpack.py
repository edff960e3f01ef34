"""Another producer's layers laid out as files of a checkout directory, each read from the
verified open layer file (never reopened by its cache path):

- a raw layer (``*.v1.raw``) becomes the file its ``org.cncf.model.filepath`` names: a hard
  link to the very inode that was hashed (through ``/proc/self/fd``), else a copy read from it;
- a tar layer (``*.v1.tar``, ``*.v1.tar+gzip``) is unpacked: regular files and folders only (a
  link, device, FIFO or sparse member refuses the artifact), each name a checked relative file
  name (no ``..``, no absolute path, no hidden part), never two files at one name, the member
  count and the bytes written bounded.

The directory is new and private to the call, and every name is checked before it becomes a
path, so nothing is written outside it.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import OciArtifactError, RefError, quoted
from ..files import check_file_name

MAX_MEMBERS = 100_000
COPY_BYTES = 1 << 20
# A layer smaller than this may still expand to ratio x this (a small config tar of text).
EXPANSION_FLOOR = 1 << 20


@dataclass(frozen=True)
class Expansion:
    """How much a tar layer may expand to: ``ratio`` times its own size (at least
    :data:`EXPANSION_FLOOR`), and never more than ``most`` bytes (REGISTRY_OCI_MAX_EXPANSION,
    REGISTRY_OCI_MAX_UNPACKED)."""

    ratio: int
    most: int

    def allowed(self, layer_size: int) -> int:
        return min(self.most, self.ratio * max(layer_size, EXPANSION_FLOOR))


def claim(name: str, claimed: set[str], what: str) -> None:
    """Add file ``name`` to ``claimed`` (the files written so far, and each of their folders
    with a trailing ``/``); a name written twice, or both a file and a folder (``x`` and
    ``x/y``), is refused."""
    if name in claimed:
        raise OciArtifactError(f"{what}: two members or layers write {name!r}; the artifact "
                               "was not used")
    if name + "/" in claimed:
        raise OciArtifactError(f"{what}: {name!r} is both a file and a folder of other files; "
                               "the artifact was not used")
    parts = name.split("/")
    folders = ["/".join(parts[:i]) for i in range(1, len(parts))]
    for folder in folders:
        if folder in claimed:
            raise OciArtifactError(f"{what}: {folder!r} is both a file and the folder of "
                                   f"{name!r}; the artifact was not used")
    claimed.update(f"{folder}/" for folder in folders)
    claimed.add(name)


class Budget:
    """The bytes a checkout may still write (the free space of the cache, less its reserve)."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def take(self, size: int, what: str) -> None:
        if size > self.left:
            raise OciArtifactError(f"{what} would write {size} bytes, more than the {self.left} "
                                   "left free in the cache; it was not unpacked (free space or "
                                   "set REGISTRY_CACHE_DIR elsewhere)")
        self.left -= size


def place(fh: BinaryIO, dest: Path) -> None:
    """The verified open file ``fh`` at ``dest`` (a new name): the same inode where the file
    system allows it, else a copy of its bytes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(f"/proc/self/fd/{fh.fileno()}", dest, follow_symlinks=True)
        if os.stat(dest, follow_symlinks=False).st_ino == os.fstat(fh.fileno()).st_ino:
            return
        dest.unlink()
    except OSError:
        pass  # no /proc, another file system: copy the bytes of the open file
    fh.seek(0)
    with open(dest, "xb") as out:
        shutil.copyfileobj(fh, out, COPY_BYTES)


def unpack(fh: BinaryIO, media_type: str, target: Path, *, what: str, claimed: set[str],
           budget: Budget, limit: int) -> list[str]:
    """Unpack the tar layer open as ``fh`` under ``target``; the file names it wrote. A name in
    ``claimed`` (written by another layer) is refused, and the new names are added to it.
    ``limit``: the bytes the layer may expand to (:class:`Expansion`), checked against each
    member's declared size before it is written and against the bytes as they are written."""
    written: list[str] = []
    expanded = 0
    try:
        with (tarfile.open(fileobj=fh, mode="r|gz") if media_type.endswith("+gzip")
              else tarfile.open(fileobj=fh, mode="r|")) as tar:  # a stream: read once, in order
            for count, member in enumerate(tar):
                if count >= MAX_MEMBERS:
                    raise OciArtifactError(f"{what} holds more than {MAX_MEMBERS} members; it "
                                           "was not unpacked")
                raw = member.name.removeprefix("./").rstrip("/")
                if member.isdir() and raw in ("", "."):
                    continue
                name = _member_name(raw, what)
                if member.isdir():
                    continue  # folders are made for the files in them
                if not member.isreg() or member.issparse():
                    raise OciArtifactError(
                        f"{what} holds {name!r}, a {_kind(member)}; only regular files and "
                        "folders are unpacked, the artifact was not used")
                claim(name, claimed, what)
                if expanded + member.size > limit:
                    raise _too_big(what, limit)
                budget.take(member.size, f"{what} member {name!r}")
                source = tar.extractfile(member)
                if source is None:  # pragma: no cover - isreg() members always have a body
                    raise OciArtifactError(f"{what}: member {name!r} has no body")
                dest = target / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                with source, open(dest, "xb") as out:
                    while piece := source.read(COPY_BYTES):  # counted as it is written
                        expanded += len(piece)
                        if expanded > limit:
                            raise _too_big(what, limit)
                        out.write(piece)
                written.append(name)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise OciArtifactError(f"{what} is not a readable tar archive ({exc}); the artifact was "
                               "not used") from None
    except OSError as exc:
        raise OciArtifactError(f"{what} could not be unpacked ({exc.strerror or exc}): a file "
                               "and a folder share a name, or the disk is full") from None
    return written


def _too_big(what: str, limit: int) -> OciArtifactError:
    return OciArtifactError(f"{what} expands to more than {limit} bytes (REGISTRY_OCI_MAX_EXPANSION"
                            " times its size, at most REGISTRY_OCI_MAX_UNPACKED); it was not "
                            "unpacked")


def _member_name(raw: str, what: str) -> str:
    try:
        return check_file_name(raw)
    except RefError as exc:
        raise OciArtifactError(f"{what} holds member {quoted(raw, 120)}: {exc}; nothing of the "
                               "artifact was used") from None


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym() or member.islnk():
        return f"link to {quoted(member.linkname, 80)}"
    if member.issparse():
        return "sparse file"
    return "device, FIFO or other special file"
