"""Mapping the pages behind a pull's memory-mapped tensors on a second thread.

A pull to the CPU hands back tensors that are views of the shard files' memory maps: nothing is
read until the module is used, and then every 64 KiB the first touch takes a page fault (with
the page cache warm, the faults of a 200 MB model cost about as much as reading its bytes). As
soon as a shard is loaded, worker threads (``REGISTRY_PREFAULT_THREADS``, default 2) ask the
kernel to map all of it (``madvise(MADV_POPULATE_READ)``, Linux 5.14+) in 32 MiB chunks taken
in file order, while the pull finishes and the caller starts using the module: the kernel works
on another core, and the first touch finds the pages mapped. With a cold page cache one worker
reads ahead of the touch (see ``SAMPLE``: two at different offsets broke up the kernel's
readahead on one machine and helped on another; one helped on both).

No byte is copied: the pages are the page cache's, the ones the touch maps anyway, so peak RSS
is unchanged. It is an optimisation and nothing more: where the call is missing (another
kernel or OS) or fails, nothing happens (logged at debug level), and a pull never waits for it.
A job holds the tensors until it is done, so the map cannot go away under it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import queue
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)

MADV_POPULATE_READ = 22  # linux/mman.h
PAGE = 4096


def runs(spans: Iterable[tuple[int, int]], page: int = PAGE) -> list[tuple[int, int]]:
    """``(start, length)`` of page-aligned address ranges covering ``spans`` (``(start, end)``
    byte ranges), merging spans less than a page apart: every page in a run holds bytes of some
    span, so no memory outside the tensors is ever touched."""
    merged: list[list[int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start - merged[-1][1] < page:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start - start % page, end - (start - start % page)) for start, end in merged]


@functools.cache
def _libc(name: str, last_arg: Any) -> Any:
    """libc's ``name(void *addr, size_t length, last_arg)``, returning an int and errno."""
    import ctypes

    fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, last_arg]
    fn.restype = ctypes.c_int
    return fn


# How many workers map a shard depends on its page cache. Warm, each maps pages on its own
# core, and two beat one (row 1 of the benchmarks: 0.98x the floor against 1.06x). Cold, one
# worker reading the file front to back leaves the kernel's readahead one stream; two at
# different offsets broke it up (row 15, 806 MB: 0.79x and 0.88x torch.load(mmap) with one,
# 1.08x and 1.09x with two). Warm means every page of a sample is in memory: 512 KiB ending
# 2 MiB into the first chunk, past what reading the header brings in (10 us).
SAMPLE = 512 * 2**10
SAMPLE_END = 2 * 2**20
_LOW_BIT = bytes(i & 1 for i in range(256))  # mincore defines only bit 0 of each byte


def _warm(start: int, length: int) -> bool:
    end = min(length, SAMPLE_END)
    begin = max(0, end - SAMPLE) // PAGE * PAGE
    return _resident(start + begin, end - begin)


def _resident(start: int, length: int) -> bool:
    """Whether every page of ``[start, start + length)`` (``start`` page-aligned) is in
    memory, by ``mincore``; False where that cannot be told (then one worker reads)."""
    import ctypes

    try:
        vec = (ctypes.c_ubyte * ((length + PAGE - 1) // PAGE))()
        if _libc("mincore", ctypes.c_void_p)(start, length, vec) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return bytes(vec).translate(_LOW_BIT).count(0) == 0


def chunks(spans: Iterable[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """``spans`` cut into ranges of at most ``size`` bytes (a multiple of the page), in order."""
    return [(start + off, min(size, length - off))
            for start, length in spans for off in range(0, length, size)]


class Job:
    """One worker's share of a prefault: its chunks, and the tensors that keep them mapped."""

    def __init__(self, spans: list[tuple[int, int]], held: list[torch.Tensor]) -> None:
        self.spans = spans
        self.held = held
        self._done = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the job is over (done, skipped or failed)."""
        return self._done.wait(timeout)

    def run(self) -> None:
        try:
            _populate(self.spans)
        finally:
            self.held.clear()  # the map may go away now
            self._done.set()


# Worker threads live for the process: starting a thread costs ~0.4 ms here (the caller waits
# for it to run), more than the rest of a small model's pull. Each takes jobs from its own
# queue. At exit they stop after their current chunk and are joined: a daemon thread frozen
# while it holds tensors aborts the interpreter as torch shuts down.
_workers: list[tuple[threading.Thread, queue.SimpleQueue[Job | None]]] = []
_stopping = threading.Event()
_lock = threading.Lock()
_registered = False


def _work(jobs: queue.SimpleQueue[Job | None]) -> None:
    while (job := jobs.get()) is not None:
        job.run()


def _queues(count: int) -> list[queue.SimpleQueue[Job | None]]:
    global _registered
    with _lock:
        if not _registered:
            atexit.register(_stop_all)
            os.register_at_fork(after_in_child=_forget_workers)
            _registered = True
        while len(_workers) < count:
            jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
            thread = threading.Thread(target=_work, args=(jobs,), daemon=True,
                                      name=f"registry-prefault-{len(_workers)}")
            thread.start()
            _workers.append((thread, jobs))
        return [jobs for _, jobs in _workers[:count]]


_held = threading.local()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold what :func:`start_after` is given in this thread until the block ends well, then
    start it. The block's own Python (attaching an adapter to a base just pulled: PEFT's
    injection of its layers) then has the cores to itself: on a small machine the workers took
    one from it (~3 ms of a 12-layer adapter's pull on 2 cores), while the pages are first
    touched only after the pull returns. A failed block starts nothing."""
    if getattr(_held, "jobs", None) is not None:  # nested: the outermost block starts them
        yield
        return
    _held.jobs = []
    try:
        yield
        jobs = _held.jobs
    finally:
        _held.jobs = None
    for tensors, threads in jobs:
        start(tensors, threads)


def start_after(tensors: Iterable[torch.Tensor], threads: int = 1) -> None:
    """:func:`start`, or, inside a :func:`held` block of this thread, at its end."""
    jobs = getattr(_held, "jobs", None)
    if jobs is None:
        start(tensors, threads)
    else:
        jobs.append((list(tensors), threads))


def start(tensors: Iterable[torch.Tensor], threads: int = 1,
          chunk: int = 32 * 2**20) -> list[Job]:
    """Start mapping the pages of the CPU ``tensors`` in file order on ``threads`` workers
    (worker ``k`` takes chunks ``k, k + threads, ...``); no job where unsupported."""
    if not sys.platform.startswith("linux") or threads < 1 or _stopping.is_set():
        return []
    held = [t for t in tensors if t.device.type == "cpu" and t.numel()]
    pieces = chunks(runs((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                         for t in held), chunk)
    if threads > 1 and pieces and not _warm(*pieces[0]):
        threads = 1
    count = min(threads, len(pieces))
    if not count:
        return []
    out = [Job(pieces[k::threads], list(held)) for k in range(count)]
    for jobs, job in zip(_queues(count), out, strict=True):
        jobs.put(job)
    return out


def _stop_all() -> None:
    _stopping.set()
    with _lock:
        workers = list(_workers)
    for _, jobs in workers:
        jobs.put(None)
    for thread, _ in workers:
        thread.join()


def _forget_workers() -> None:
    # A forked child has none of its parent's threads: it starts its own when it needs them.
    global _lock
    _lock = threading.Lock()
    _workers.clear()


def _populate(spans: list[tuple[int, int]]) -> None:
    try:
        import ctypes

        madvise = _libc("madvise", ctypes.c_int)
        for start, length in spans:
            if _stopping.is_set():
                return
            if madvise(start, length, MADV_POPULATE_READ) != 0:
                log.debug("prefault skipped: madvise failed with errno %d", ctypes.get_errno())
                return
    except Exception as exc:  # noqa: BLE001 - an optimisation never breaks a pull
        log.debug("prefault skipped: %s", exc)
