"""Copies of mapped weights to a CUDA device through two pinned buffers (issues 10 and 15).

A pull maps each verified shard; a tensor bound for CUDA must then cross from those pages to the
device. ``Tensor.to("cuda")`` from a memory map copies from pageable memory: the driver stages
the bytes through its own small pinned buffer, one synchronous copy at a time, and the host sits
idle while the DMA runs. Here the bytes go through two pinned buffers of ``chunk`` bytes
(default 32 MiB) that take turns: while the device reads one buffer (an asynchronous copy on
the current stream), the host fills the other from the map, page faults and all. Host memory
used is the two buffers whatever the model's size; there is never a whole-model host copy.

Small tensors share a buffer fill (one event per fill, one DMA per tensor slice); a tensor
larger than a buffer crosses in several. A tensor is copied in its stored dtype and cast on the
device, so a float16 checkpoint pulled as float32 moves half the bytes over the bus.

Ordering: copies and casts are queued on the device's current stream, so work the caller queues
after the pull sees the weights; :meth:`Staging.finish` waits for the queue before the pull
returns, so an error surfaces in the pull and the maps can be closed. A buffer is refilled only
after the event recorded behind its last copies has completed.

Without CUDA the same code runs with ordinary buffers and synchronous copies (``pinned=False``),
which is how the tests check the bytes on machines with no GPU; the ``gpu`` tests run the real
path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import prefault

# On an H100 host (row 18) the pull is bound by the host filling the buffers, never by the
# device: waits on a buffer's copies took 0.2 ms of a 28 ms pull. 32 MiB buffers filled faster
# than 64 MiB (25.5 against 28.6 ms; 16 MiB 26.9, 128 MiB 33.5), and three or four buffers were
# slower than two (31.8, 31.5 ms).
DEFAULT_CHUNK = 32 * 2**20
BUFFERS = 2  # taking turns: the host fills one while the device reads the other


def uses_staging(device: torch.device) -> bool:
    """Whether tensors bound for ``device`` cross through :class:`Staging`."""
    return device.type == "cuda"


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor's bytes (no copy)."""
    flat = tensor.reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


@dataclass
class _Buffer:
    data: torch.Tensor
    used: int = 0
    # Queued copies out of this buffer: (destination bytes, offset in the buffer).
    pending: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    done: Any = None  # the event behind the last copies out of it (CUDA)


class Staging:
    """Moves contiguous CPU tensors to ``device`` through two reusable buffers of ``chunk``
    bytes (pinned where the device is CUDA)."""

    def __init__(self, device: torch.device | str, chunk: int = DEFAULT_CHUNK, *,
                 pinned: bool | None = None, prefault_threads: int = 0) -> None:
        if chunk < 1:
            raise ValueError(f"staging chunk must be at least 1 byte, not {chunk}")
        self.device = torch.device(device)
        self.chunk = chunk
        self.cuda = self.device.type == "cuda"
        self.pinned = self.cuda if pinned is None else pinned
        self.prefault_threads = prefault_threads
        self.count = BUFFERS
        self.buffers: list[_Buffer] = []  # allocated on first use, ``count`` at most
        self._at = 0
        self.bytes_copied = 0

    # -- the public steps ---------------------------------------------------------------------

    def move(self, items: Iterable[tuple[torch.Tensor, torch.dtype]]) -> list[torch.Tensor]:
        """Each ``(cpu_tensor, dtype)`` as a tensor on the device in ``dtype``, in order.

        The sources' pages are mapped ahead on ``prefault_threads`` threads while the host
        copies, so a cold shard is read from disk in parallel with the copies."""
        work = list(items)
        prefault.start((t for t, _ in work), self.prefault_threads)
        out = [self._copy(tensor) for tensor, _ in work]
        self._flush()
        for i, (tensor, dtype) in enumerate(work):
            if dtype != tensor.dtype:
                # The stored-dtype copy goes as soon as its cast is queued: the device holds
                # one tensor in both dtypes at a time, not the whole shard.
                out[i] = out[i].to(dtype)
        return out

    def finish(self) -> None:
        """Wait until every queued copy and cast is done (the buffers are then free)."""
        self._flush()
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
        for buf in self.buffers:
            buf.done = None

    # -- the machinery --------------------------------------------------------------------

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """Queue the bytes of ``tensor`` into a new device tensor of its dtype."""
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            tensor = tensor.cpu().contiguous()
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
        src, dst = _bytes_of(tensor), _bytes_of(out)
        total, off = src.numel(), 0
        while off < total:
            buf = self._current()
            n = min(self.chunk - buf.used, total - off)
            buf.data[buf.used:buf.used + n].copy_(src[off:off + n])
            buf.pending.append((dst[off:off + n], buf.used))
            buf.used += n
            off += n
            if buf.used == self.chunk:
                self._flush()
        self.bytes_copied += total
        return out

    def _current(self) -> _Buffer:
        """The buffer being filled, waiting first for its last copies to finish."""
        if len(self.buffers) <= self._at:
            self.buffers.append(_Buffer(torch.empty(self.chunk, dtype=torch.uint8,
                                                    pin_memory=self.pinned)))
        buf = self.buffers[self._at]
        if buf.done is not None:
            buf.done.synchronize()
            buf.done = None
        return buf

    def _flush(self) -> None:
        """Queue the copies out of the buffer being filled and switch to the other one."""
        if not self.buffers or self._at >= len(self.buffers):
            return
        buf = self.buffers[self._at]
        if not buf.pending:
            return
        for dst, at in buf.pending:
            dst.copy_(buf.data[at:at + dst.numel()], non_blocking=self.pinned)
        if self.cuda:
            buf.done = torch.cuda.Event()
            buf.done.record(torch.cuda.current_stream(self.device))
        buf.pending.clear()
        buf.used = 0
        self._at = (self._at + 1) % self.count


class Stagings:
    """One :class:`Staging` per CUDA device a pull places tensors on, made when first needed."""

    def __init__(self, chunk: int | None = None, *, prefault_threads: int = 0) -> None:
        self.chunk = DEFAULT_CHUNK if chunk is None else chunk
        self.prefault_threads = prefault_threads
        self.by_device: dict[torch.device, Staging] = {}

    def get(self, device: torch.device) -> Staging | None:
        if not uses_staging(device):
            return None
        if device not in self.by_device:
            self.by_device[device] = Staging(device, self.chunk,
                                             prefault_threads=self.prefault_threads)
        return self.by_device[device]

    def finish(self) -> None:
        for staging in self.by_device.values():
            staging.finish()
