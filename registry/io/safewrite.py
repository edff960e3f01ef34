"""Writing files into a folder the user chose, where anyone else may also write.

Every file the registry writes outside its own home (``save_pretrained`` shards, ``pull_files``,
``registry export -o``, ``registry pull -o``) goes through this module:

- the bytes go to a new file made with ``mkstemp`` (``O_CREAT|O_EXCL``, a random name, mode 0600)
  in the destination folder, written through the descriptor ``mkstemp`` returned, then renamed
  over the target: a link planted at the target or at a temporary name is replaced, never
  followed, and a reader never sees half a file;
- sub-folders below the chosen folder are made one level at a time, each level checked with
  ``lstat`` before anything below it is made: a link that leads outside the chosen folder, or a
  file where a folder must be, is a :class:`NormalizationError` naming it, and nothing is created
  first.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import NormalizationError
from .diskerrors import error_for

TEMP_PREFIX = ".registry-"
FILE_MODE = 0o644


def _refuse(path: Path, why: str) -> NormalizationError:
    return NormalizationError(f"cannot write {str(path)!r}: {why}")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def folder(root: Path, relative: str = "") -> Path:
    """``root / relative`` as a folder, made one level at a time below ``root``.

    ``root`` itself is the caller's choice and is made with its parents when missing. Each level
    below it must be a folder, or a link that resolves to a folder inside ``root``; anything else
    is refused before any level below it is made.
    """
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise _refuse(root, "it exists and is not a folder; pass a folder") from None
    except OSError as exc:
        raise _refuse(root, exc.strerror or type(exc).__name__) from None
    if not root.is_dir():
        raise _refuse(root, "it exists and is not a folder; pass a folder")
    base = root.resolve()
    here = root
    for part in [p for p in relative.split("/") if p]:
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            try:
                os.mkdir(here)  # never follows: an entry appearing meanwhile fails EEXIST
            except OSError as exc:
                raise _refuse(here, exc.strerror or type(exc).__name__) from None
            continue
        if stat.S_ISLNK(st.st_mode):
            target = here.resolve()
            if not (_inside(target, base) and target.is_dir()):
                raise _refuse(here, f"it is a link to {str(target)!r}, outside {str(root)!r}; "
                                    "remove the link or choose an empty folder")
        elif not stat.S_ISDIR(st.st_mode):
            raise _refuse(here, "a file is there where a folder is needed; remove it or "
                                "choose an empty folder")
    return here


@contextlib.contextmanager
def replacing(target: Path) -> Iterator[BinaryIO]:
    """A new file, opened for writing, that replaces ``target`` when the block ends without an
    error (and is removed when it raises). ``target``'s folder must exist."""
    target = Path(target)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(target).st_mode):
            raise _refuse(target, "a folder is there; remove it or choose another name")
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=TEMP_PREFIX)
    except OSError as exc:
        raise _refuse(target, exc.strerror or type(exc).__name__) from None
    try:
        with os.fdopen(fd, "wb", buffering=0) as fh:
            yield fh
            os.fchmod(fh.fileno(), FILE_MODE)
        os.replace(tmp, target)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # typed: the path, the space free there
            raise error_for(exc, target, None, f"writing {target.name}") from None
        raise _refuse(target, exc.strerror or type(exc).__name__) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_bytes(target: Path, data: bytes) -> Path:
    """Replace ``target`` with ``data`` (see :func:`replacing`)."""
    with replacing(target) as fh:
        _write_all(fh.fileno(), memoryview(data))
    return target


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


def copy_file(target: Path, source: Path) -> Path:
    """Replace ``target`` with a copy of ``source`` (see :func:`replacing`)."""
    with open(source, "rb", buffering=0) as src:
        return copy_open(target, src)


def copy_open(target: Path, src: BinaryIO) -> Path:
    """Replace ``target`` with a copy of the open file ``src``, from its first byte: the very
    file that was verified (``Backend.open_blob``), never its path opened again."""
    fd, done = src.fileno(), 0
    with replacing(target) as fh:
        with contextlib.suppress(AttributeError, OSError):  # in-kernel copy where there is one
            while copied := os.copy_file_range(fd, fh.fileno(), 1 << 30, offset_src=done):
                done += copied
        # The target's offset advanced by what was copied: the rest (all of it without
        # copy_file_range) continues from there.
        while chunk := os.pread(fd, 1 << 20, done):
            _write_all(fh.fileno(), memoryview(chunk))
            done += len(chunk)
    return target


def open_emptied(path: Path) -> BinaryIO:
    """``path`` open for reading and writing (unbuffered) and empty, created if absent: a
    download's temporary file, written from its start. It is not opened with ``O_TRUNC``: on
    ext4 truncating a file, even the empty one ``mkstemp`` made, marks it to be flushed when it
    is closed (``auto_da_alloc``), which started the writeback of every downloaded blob at once
    on the cores the download needs. Only a file that holds bytes (a try started again) is cut,
    with ``ftruncate``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        if os.fstat(fd).st_size:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, "r+b", buffering=0)
    except BaseException:
        os.close(fd)
        raise

