"""Shards a push need not write: bytes identical to a verified local copy of a stored blob.

A push names each shard by the sha256 of its bytes, so it used to write and hash every shard
before it could ask the store which ones it holds; a fine-tune that changed one block paid for
the whole model. But the previous version's shards are usually on this machine already (the
file store's blobs, or the verified cache in front of a remote store), and a shard whose key
list and header are the same as a stored one's holds the same bytes exactly when its tensor
data compares equal to that file's data. Comparing runs at memory speed; hashing does not.

The digest recorded for a matched shard is the stored blob's name, so a match counts only when
that copy is known to hash to it: its verification memo
(:class:`registry.caching.cache.VerifiedFiles`:
size, mtime, ctime, inode) must hold for the open file both before and after the comparison,
so the bytes compared are the bytes that were hashed. A copy with no memo, a changed or corrupt
copy, a different header or any differing byte is no match, and the shard is written and hashed
as before. Nothing is ever downloaded to compare.

A matched shard is staged without a file; should the store lose the blob before the push
commits (a gc, a corrupt copy found by ``_holds``), :meth:`registry.files.StagedFile.ensure`
writes it then, and refuses it if it no longer hashes to the digest recorded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import manifest as mf
from ..errors import RegistryError
from ..files import VersionFile, weight_files
from ..refs import Ref
from .cache import VerifiedFiles

if TYPE_CHECKING:
    # Annotations only: the backends import this module, and `registry ls` imports no torch.
    import torch

    from ..catalog.records import VersionRecord

_CHUNK = 16 * 2**20


@dataclass(frozen=True)
class KnownShard:
    """A stored shard with a local copy: its manifest entry, where it is, and its memo."""

    file: VersionFile
    path: Path
    memo: VerifiedFiles

    def intact(self, fd: int | None = None) -> bool:
        """Whether the local copy (or the file open as ``fd``) is still the one that hashed to
        ``file.digest``."""
        return self.memo.is_verified(self.path, self.file.digest, fd=fd)


def latest_shards(resolve: Callable[[Ref], VersionRecord], name: str) -> list[VersionFile]:
    """The shards of ``name``'s latest version, listed by a manifest that passes its schema;
    none when the name has no version yet or its manifest does not pass (then the push writes
    every shard, as a first push does: a broken older version never stops a new one)."""
    try:
        record = resolve(Ref(name))
        manifest = mf.validate(record.manifest, origin=f"{record.name}:v{record.version}")
    except RegistryError:
        return []
    return weight_files(manifest)


def known_shards(resolve: Callable[[Ref], VersionRecord], name: str, memo: VerifiedFiles,
                 *places: Callable[[str], Path | None]) -> list[KnownShard]:
    """The shards of ``name``'s latest version whose copy in one of ``places`` (digest ->
    path) has a verification memo that holds now. None of them is hashed: a copy without a
    memo costs as much to check as the shard costs to write anew."""
    out = []
    for f in latest_shards(resolve, name):
        for place in places:
            path = place(f.digest)
            if path is not None and path.exists() and memo.is_verified(path, f.digest):
                out.append(KnownShard(f, path, memo))
                break
    return out


def matching(keys: Sequence[str], head: bytes, size: int, tensors: Mapping[str, torch.Tensor],
             order: Sequence[str], known: Mapping[tuple[str, ...], Sequence[KnownShard]]
             ) -> KnownShard | None:
    """A known shard holding exactly the bytes of the safetensors file that ``head`` (its
    header bytes) followed by ``tensors`` in ``order`` would be, else None."""
    for candidate in known.get(tuple(sorted(keys)), ()):
        if candidate.file.size == size and _same_bytes(candidate, head, size, tensors, order):
            return candidate
    return None


# Bytes of each tensor a first look compares (see may_match).
_LOOK = 4096


def may_match(keys: Sequence[str], head: bytes, size: int, tensors: Mapping[str, torch.Tensor],
              order: Sequence[str], known: Mapping[tuple[str, ...], Sequence[KnownShard]]
              ) -> bool:
    """Whether a known shard may hold these bytes, from the header and the first 4 KiB of each
    tensor: False is certain (the shard will be written), True is only a maybe that
    :func:`matching` settles. A push starts the shards that will be written first: writing and
    hashing are its long jobs, and one left for last runs alone on one core (a fine-tune's
    changed head is the last shard of its model)."""
    for candidate in known.get(tuple(sorted(keys)), ()):
        if candidate.file.size == size \
                and _same_bytes(candidate, head, size, tensors, order, look=_LOOK):
            return True
    return False


def _same_bytes(candidate: KnownShard, head: bytes, size: int,
                tensors: Mapping[str, torch.Tensor], order: Sequence[str], *,
                look: int | None = None) -> bool:
    """Whether the open copy holds these bytes, and is the verified file before and after it
    was read (any write to it changes its mtime and ctime; a file swapped in has another
    inode), so the bytes compared are the bytes that hashed to its digest. With ``look``, only
    the header and the first ``look`` bytes of each tensor are compared."""
    try:
        with open(candidate.path, "rb", buffering=0) as fh:
            if os.fstat(fh.fileno()).st_size != size or not candidate.intact(fh.fileno()):
                return False
            chunk = _CHUNK if look is None else min(_CHUNK, look)
            buf = bytearray(max(chunk, len(head)))
            view = memoryview(buf)
            address = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
            if not _read_exactly(fh, view[:len(head)]) or view[:len(head)] != head:
                return False
            for key in order:
                tensor = tensors[key]
                total = tensor.numel() * tensor.element_size()
                compared = total if look is None else min(look, total)
                done = 0
                while done < compared:
                    n = min(chunk, compared - done)
                    if not _read_exactly(fh, view[:n]) \
                            or _memcmp(address, tensor.data_ptr() + done, n) != 0:
                        return False
                    done += n
                if compared < total:
                    fh.seek(total - compared, os.SEEK_CUR)
            return candidate.intact(fh.fileno())
    except OSError:
        return False  # gone or unreadable: no match, the shard is written instead


def _read_exactly(fh: Any, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            return False
        got += n
    return True


def _memcmp(a: int, b: int, n: int) -> int:
    """libc ``memcmp`` of ``n`` bytes at addresses ``a`` and ``b`` (ctypes releases the GIL,
    so shards are compared side by side)."""
    return int(_libc_memcmp()(a, b, n))


@functools.cache
def _libc_memcmp() -> Any:
    libc = ctypes.cdll.msvcrt if os.name == "nt" else ctypes.CDLL(ctypes.util.find_library("c"))
    fn = libc.memcmp
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn
