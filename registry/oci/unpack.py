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
from pathlib import Path
from typing import BinaryIO

from ..errors import OciArtifactError, RefError, quoted
from ..files import check_file_name

MAX_MEMBERS = 100_000
COPY_BYTES = 1 << 20


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
           budget: Budget) -> list[str]:
    """Unpack the tar layer open as ``fh`` under ``target``; the file names it wrote. A name in
    ``claimed`` (written by another layer) is refused, and the new names are added to it."""
    written: list[str] = []
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
                if name in claimed:
                    raise OciArtifactError(f"{what}: two members or layers write {name!r}; the "
                                           "artifact was not used")
                budget.take(member.size, f"{what} member {name!r}")
                source = tar.extractfile(member)
                if source is None:  # pragma: no cover - isreg() members always have a body
                    raise OciArtifactError(f"{what}: member {name!r} has no body")
                dest = target / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                with source, open(dest, "xb") as out:
                    shutil.copyfileobj(source, out, COPY_BYTES)
                claimed.add(name)
                written.append(name)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise OciArtifactError(f"{what} is not a readable tar archive ({exc}); the artifact was "
                               "not used") from None
    except OSError as exc:
        raise OciArtifactError(f"{what} could not be unpacked ({exc.strerror or exc}): a file "
                               "and a folder share a name, or the disk is full") from None
    return written


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
