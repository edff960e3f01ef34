"""Warming the page cache for a pull's shard files on a few threads, while the module is built.

A pull maps its shard files and the first touch of each page faults it in: one thread walking the
file, helped only by the kernel's own readahead. Where the disk answers several requests at once
faster than one sequential stream (NVMe, network file systems), asking for the ranges of the
files from several threads, as soon as the manifest is known, lets the first touch find the
pages resident. Each thread calls ``posix_fadvise(POSIX_FADV_WILLNEED)`` on its ranges: the
kernel reads them into the page cache; no byte is copied into this process, so a pull keeps one
copy of the weights (the mapping) and its peak RSS.

It is an optimisation and nothing more: a file that is missing, unreadable or on a file system
without ``posix_fadvise`` is skipped (logged at debug level), and a pull never waits for it to
succeed. Off by default (``REGISTRY_READAHEAD_THREADS=0``): on the machine it was measured on
(a virtio disk whose own readahead window is 8 MiB, two busy cores), the kernel's sequential
readahead of the mapping was as fast or faster; see the README's performance section.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK = 8 * 2**20  # bytes per request: the size runai-model-streamer and the kernel window use


def plan(files: Iterable[tuple[Path, int]], chunk: int = CHUNK) -> list[tuple[Path, int, int]]:
    """``(path, offset, length)`` ranges of at most ``chunk`` bytes covering every file, files in
    order and each file from its start."""
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    return [(path, offset, min(chunk, size - offset))
            for path, size in files for offset in range(0, size, chunk)]


class Readahead:
    """Threads asking the kernel for the ranges of ``files``; :meth:`wait` joins them.

    Thread ``k`` of ``n`` takes ranges ``k, k + n, ...``, so the threads move through the files
    side by side from their starts, ahead of the pages the pull touches first.
    """

    def __init__(self, files: Sequence[tuple[Path, int]], threads: int,
                 chunk: int = CHUNK) -> None:
        self.ranges = plan(files, chunk)
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._work, args=(k, threads), daemon=True,
                                          name=f"registry-readahead-{k}")
                         for k in range(min(threads, len(self.ranges)))]

    def start(self) -> Readahead:
        for thread in self._threads:
            thread.start()
        return self

    def wait(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def _work(self, k: int, n: int) -> None:
        fds: dict[Path, int] = {}
        try:
            for path, offset, length in self.ranges[k::n]:
                try:
                    fd = fds.get(path)
                    if fd is None:
                        fd = fds[path] = os.open(path, os.O_RDONLY)
                    advise(fd, offset, length)
                except OSError as exc:
                    self.errors.append(f"{path}: {exc}")
                    log.debug("readahead of %s skipped: %s", path, exc)
        finally:
            for fd in fds.values():
                os.close(fd)


def advise(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to read ``length`` bytes at ``offset`` of ``fd`` into the page cache."""
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)


def start(backend: object, files: Iterable[tuple[str, int]], threads: int) -> Readahead | None:
    """Start reading ahead the shards ``(digest, size)`` already on this machine (in a local
    store, or in the verified cache), or return None when there is nothing to do.

    The paths are found without verifying the files: reading ahead never hands a byte to the
    pull, which still loads each shard only through ``blob_path`` (verified)."""
    if threads <= 0 or not hasattr(os, "posix_fadvise"):
        return None
    found = [(path, size) for digest, size in files
             if (path := _local_path(backend, digest)) is not None]
    if not found:
        return None
    return Readahead(found, threads).start()


def _local_path(backend: object, digest: str) -> Path | None:
    from . import manifest as mf

    try:
        store = getattr(backend, "store", None)
        local = store.open_local(mf.blob_key(digest)) if store is not None else None
        if local is not None:
            return Path(local)
        cache = getattr(backend, "cache", None)
        cached = cache.path(digest) if cache is not None else None
        return cached if cached is not None and cached.is_file() else None
    except Exception as exc:  # noqa: BLE001 - an optimisation never breaks a pull
        log.debug("readahead: no local path for %s: %s", digest, exc)
        return None
