"""The sums of a tensor's change ``b - a``: its 2-norm, the norm of ``a``, the largest absolute
difference and the count of elements that changed, read at close to memory speed.

A tensor whose bytes are equal in both versions is unchanged after one ``memcmp`` and no float
math, as a shard with the same digest is unchanged unread. Any other tensor is cut into pieces
that worker threads take (numpy releases the GIL in each pass, so two cores both compare), and
each piece into chunks of 128 Ki elements: the first passes over a chunk (``a . a``, then a
``memcmp`` that stops at the first byte that differs) read it from memory, the ones after it
(``b - a``, its absolute value, dot product, max and count) from the CPU's cache. A chunk whose
bytes are equal costs the ``memcmp`` and ``a . a`` alone. Each chunk is compared
in float32 (a bfloat16 or float16 one is widened into a buffer first) and its sums are added up
in float64.

An element counts as changed when ``b - a`` is not zero, except that one whose bits are equal in
both is unchanged even when it is NaN or infinite (NaN - NaN is NaN): the same rule as a shard's
digest, at an element's size. So +0.0 against -0.0 is unchanged, and a NaN that appears, goes or
changes its bits is a change whose norms are NaN (``null`` in JSON).

A process whose diffs have compared ``KERNEL_FROM`` elements, or that starts a diff that
large, does each piece in one pass instead (registry/provenance/kernel.py, compiled by numba):
the sums at the speed the bytes are read, where the numpy passes cost about twice that. A
piece the kernel finds a NaN or infinity in is done again by the numpy passes, which hold the
rule above.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

# Elements compared at once: 128 Ki float32 (512 KiB) per side and the difference beside them
# stay in the CPU's cache (L2, and L3 for the rest), so the passes over a chunk after the first
# read it from there. On the 806 MB row, CPU time per diff under load: 32 Ki 2.05x the floor's,
# 64 Ki 1.90x, 128 Ki 1.73x, 256 Ki 1.72x, 1 Mi 1.79x (fewer calls against a chunk that no
# longer fits).
CHUNK = 1 << 17
# Elements one worker takes at a time (4 MB of float32, ~1 ms of work): small enough that the
# workers finish together, large enough that handing them out costs nothing next to the passes.
PIECE = 1 << 20
# Threads comparing pieces. More cores read memory faster, up to the memory's bandwidth.
WORKERS = max(1, min(4, os.cpu_count() or 1))
# Elements (of one side) at which a process loads the one-pass kernel: for a diff that large,
# or once its diffs have compared that many by numpy passes. Loading costs a new process
# 0.5-0.8 s (numba's import and its cache read; the first time on a machine ~1 s more, its
# compile), what the kernel saves over ~3 Gi elements (0.48 against 0.27 ns an element here):
# a diff of one 806 MB model from the CLI stays 0.7 s faster without it, and a process that
# keeps diffing (a server, a notebook) pays it once, when it has lost as much without it.
KERNEL_FROM = 1 << 31
# Elements the kernel keeps their difference of between its two loops (4 KiB: in L1).
BLOCK = 1024
_ABS = np.int32(0x7FFFFFFF)  # a float32's bits without its sign: |x|, ordered as integers
_INF = 0x7F800000  # |x| bits at or above this: inf or NaN


@dataclass
class Sums:
    """Running sums of one comparison (a tensor, or a module's tensors)."""

    delta2: float = 0.0
    base2: float = 0.0
    max_abs: float = 0.0
    differ: int = 0
    numel: int = 0

    def add(self, other: Sums) -> None:
        self.delta2 += other.delta2
        self.base2 += other.base2
        self.max_abs = larger(self.max_abs, other.max_abs)
        self.differ += other.differ
        self.numel += other.numel

    @property
    def relative(self) -> float:
        delta = math.sqrt(self.delta2)
        if self.base2 == 0.0:
            return 0.0 if delta == 0.0 else math.inf
        return delta / math.sqrt(self.base2)


def larger(x: float, y: float) -> float:
    """The larger of two maxima, NaN if either is (``max`` keeps whichever comes first)."""
    return x if math.isnan(x) or x >= y else y


def _libc_memcmp() -> Callable[[int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None).memcmp  # glibc, musl, macOS; ctypes lets go of the GIL
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_MEMCMP = _libc_memcmp()
_log = logging.getLogger(__name__)

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[float, float, int, int]]


class _Loaded:
    """The kernel once loaded (None where it could not be), under a lock: threads wait for one
    compile rather than each starting its own."""

    lock = threading.Lock()
    tried = False
    kernel: Kernel | None = None
    compared = 0  # elements the numpy passes were handed in this process


def fused(elements: int) -> Kernel | None:
    """The one-pass kernel for a diff of ``elements``, loaded (compiled the first time) when
    they, or with them the elements this process's numpy passes compared before, reach
    ``KERNEL_FROM``; None before that (the numpy passes compute the same sums), or where numba
    cannot load it."""
    with _Loaded.lock:
        if not _Loaded.tried:
            if _Loaded.compared + elements < KERNEL_FROM:
                _Loaded.compared += elements
                return None
            _Loaded.kernel = _load()
            _Loaded.tried = True
    return _Loaded.kernel


def _load() -> Kernel | None:
    try:
        from . import kernel

        probe = np.ones(2, dtype=np.float32)  # compiled (or read from disk) here, once
        kernel.sums(probe, probe, np.empty(BLOCK, dtype=np.float32))
        return kernel.sums
    except Exception as exc:  # noqa: BLE001 - any failure: the numpy passes instead
        _log.warning("the diff's compiled kernel did not load (%s: %s); comparing with numpy "
                     "passes, about half the speed", type(exc).__name__, exc)
        return None


def same_bytes(a: torch.Tensor, b: torch.Tensor, start: int = 0, stop: int | None = None) -> bool:
    """Whether elements ``start:stop`` of the flat, contiguous CPU tensors ``a`` and ``b`` (one
    dtype) hold the same bytes."""
    size = a.element_size()
    stop = a.numel() if stop is None else stop
    if stop <= start:
        return True
    if _MEMCMP is not None:
        return _MEMCMP(a.data_ptr() + start * size, b.data_ptr() + start * size,
                       (stop - start) * size) == 0
    raw_a, raw_b = (t[start:stop].view(torch.uint8).numpy() for t in (a, b))
    return bool(np.array_equal(raw_a, raw_b))


class Scratch:
    """One worker's buffers, made once per diff and used for every piece it takes. With glibc's
    mmap threshold where a new process has it (128 KiB) each 512 KiB buffer is a fresh mapping
    whose pages fault in as it is first written: made for each piece, they cost an 806 MB diff
    ~13 ms of CPU, more than reading one of its shards."""

    def __init__(self, kernel: Kernel | None = None) -> None:
        self.kernel = kernel
        self.block = np.empty(BLOCK, dtype=np.float32)
        self.delta = np.empty(CHUNK, dtype=np.float32)
        self.zeros = np.zeros(0, dtype=np.float32)
        self.wide: list[torch.Tensor] = []

    def widening(self, side: int) -> torch.Tensor:
        """A float32 buffer of ``CHUNK`` for side 0 or 1, made when a chunk first needs one."""
        while len(self.wide) <= side:
            self.wide.append(torch.empty(CHUNK, dtype=torch.float32))
        return self.wide[side]

    def zeros_of(self, n: int) -> np.ndarray:
        if self.zeros.size < n:
            self.zeros = np.zeros(CHUNK, dtype=np.float32)
        return self.zeros[:n]


class _Float32:
    """Chunks of one flat tensor as float32 numpy arrays: views of it when it is float32,
    else widened into a buffer of the worker's."""

    def __init__(self, flat: torch.Tensor, scratch: Scratch, side: int) -> None:
        self.flat = flat
        self.view = flat.numpy() if flat.dtype == torch.float32 else None
        self.buffer = scratch.widening(side) if self.view is None else None

    def chunk(self, start: int, stop: int) -> np.ndarray:
        if self.buffer is None:
            return self.view[start:stop]  # type: ignore[index]
        out = self.buffer[:stop - start]
        out.copy_(self.flat[start:stop])
        return out.numpy()


def piece_sums(a: torch.Tensor | None, b: torch.Tensor, start: int, stop: int,
               scratch: Scratch | None = None) -> Sums:
    """Sums of ``b - a`` over elements ``start:stop`` of the flat CPU tensors (``a`` None: from
    zero, and no norm of ``a``), in ``scratch``'s buffers (new ones if None)."""
    scratch = scratch if scratch is not None else Scratch()
    if a is not None and scratch.kernel is not None:
        found = _fused_sums(scratch.kernel, a, b, start, stop, scratch)
        if found is not None:
            return found
    sums = Sums(numel=stop - start)
    left = _Float32(a, scratch, 0) if a is not None else None
    right = _Float32(b, scratch, 1)
    # Bound once: each chunk costs some 20 us of passes, and each call here ~0.1-1 us.
    memcmp = _MEMCMP if a is not None and a.dtype == b.dtype else None
    size = b.element_size()
    at_a, at_b = (a.data_ptr() if a is not None else 0), b.data_ptr()
    delta = scratch.delta
    dot, subtract, bitwise_and, count = np.dot, np.subtract, np.bitwise_and, np.count_nonzero
    base2 = delta2 = 0.0
    top = differ = 0
    for begin in range(start, stop, CHUNK):
        end = min(begin + CHUNK, stop)
        if left is None:
            xa = scratch.zeros_of(end - begin)
        else:
            xa = left.chunk(begin, end)
            base2 += float(dot(xa, xa))
            if memcmp is not None:
                if memcmp(at_a + begin * size, at_b + begin * size, (end - begin) * size) == 0:
                    continue
            elif a is not None and a.dtype == b.dtype and same_bytes(a, b, begin, end):
                continue
        xb = right.chunk(begin, end)
        d = delta[:end - begin]
        bits = d.view(np.int32)
        subtract(xb, xa, out=d)
        bitwise_and(bits, _ABS, out=bits)
        high = int(bits.max())
        if high >= _INF:  # equal bits are unchanged, NaN and infinities too
            np.copyto(d, 0.0, where=xa.view(np.int32) == xb.view(np.int32))
            high = int(bits.max())
        top = max(top, high)
        delta2 += float(dot(d, d))
        differ += int(count(bits))
    sums.base2, sums.delta2, sums.differ = base2, delta2, differ
    sums.max_abs = float(np.int32(top).view(np.float32))
    return sums


def _fused_sums(kernel: Kernel, a: torch.Tensor, b: torch.Tensor, start: int, stop: int,
                scratch: Scratch) -> Sums | None:
    """``piece_sums`` by the one-pass kernel: the piece at once where both sides are float32,
    else chunk by chunk as they are widened; None if it holds a NaN or an infinity."""
    left, right = _Float32(a, scratch, 0), _Float32(b, scratch, 1)
    step = stop - start if left.view is not None and right.view is not None else CHUNK
    sums = Sums(numel=stop - start)
    top = 0
    for begin in range(start, stop, step):
        end = min(begin + step, stop)
        base2, delta2, differ, high = kernel(left.chunk(begin, end), right.chunk(begin, end),
                                             scratch.block)
        if high >= _INF:
            return None
        sums.base2 += base2
        sums.delta2 += delta2
        sums.differ += differ
        top = max(top, int(high))
    sums.max_abs = float(np.int32(top).view(np.float32))
    return sums


Pair = tuple[torch.Tensor | None, torch.Tensor]
Job = tuple[int, int, int]  # pair, first element, end


def compare(pairs: Sequence[Pair], *, workers: int = WORKERS) -> list[Sums | None]:
    """The sums of ``b - a`` for each pair (same number of elements; ``a`` None: from zero),
    None for a pair whose bytes are equal. Pieces of all pairs go to ``workers`` threads."""
    flat = [(None if a is None else _flat(a), _flat(b)) for a, b in pairs]
    jobs = [(i, begin, min(begin + PIECE, b.numel()))
            for i, (_, b) in enumerate(flat) for begin in range(0, max(b.numel(), 1), PIECE)]

    def run(job: Job, scratch: Scratch) -> Sums | None:
        i, begin, end = job
        a, b = flat[i]
        if a is not None and a.dtype == b.dtype and same_bytes(a, b, begin, end):
            return None
        return piece_sums(a, b, begin, end, scratch)

    elements = sum(b.numel() for a, b in flat if a is not None)
    done = _shared_out(run, jobs, workers, fused(elements))
    out: list[Sums | None] = [None] * len(flat)
    parts: dict[int, list[tuple[int, int, Sums | None]]] = {}
    for (i, begin, end), sums in zip(jobs, done, strict=True):
        parts.setdefault(i, []).append((begin, end, sums))
    for i, pieces in parts.items():
        if all(s is None for _, _, s in pieces):
            continue  # every byte equal
        a, _ = flat[i]
        total = Sums()
        for begin, end, s in pieces:
            if s is None:  # an equal piece of a changed tensor: its norm, no difference
                s = Sums(numel=end - begin)
                if a is not None:
                    s.base2 = norm2(a, begin, end)
            total.add(s)
        out[i] = total
    return out


def _shared_out(run: Callable[[Job, Scratch], Sums | None], jobs: list[Job],
                workers: int, kernel: Kernel | None = None) -> list[Sums | None]:
    """``run`` of every job, the largest first, by this thread and ``workers - 1`` others.

    The caller works too, and no pool outlives the call: starting a thread costs ~0.1 ms on a
    quiet machine (several on a loaded one, where ``Thread.start`` waits to be scheduled), and
    a pool kept between calls would not survive a fork."""
    done: list[Sums | None] = [None] * len(jobs)
    order = iter(sorted(range(len(jobs)), key=lambda j: jobs[j][1] - jobs[j][2]))
    failed: list[BaseException] = []

    def work() -> None:
        try:
            scratch = Scratch(kernel)
            for j in order:  # next() on a shared iterator is atomic under the GIL
                done[j] = run(jobs[j], scratch)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failed.append(exc)

    threads = [threading.Thread(target=work, name="registry-diff", daemon=True)
               for _ in range(min(workers, len(jobs)) - 1)]
    for thread in threads:
        thread.start()
    work()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return done


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous()


def norm2(t: torch.Tensor, start: int = 0, stop: int | None = None) -> float:
    """The squared 2-norm of elements ``start:stop`` of ``t`` (flattened), in float32 chunks."""
    t = _flat(t)
    stop = t.numel() if stop is None else stop
    chunks = _Float32(t, Scratch(), 0)
    total = 0.0
    for begin in range(start, stop, CHUNK):
        x = chunks.chunk(begin, min(begin + CHUNK, stop))
        total += float(np.dot(x, x))
    return total
