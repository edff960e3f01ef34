"""Tensors <-> safetensors shards: the split, the writer and the reader.

**The split** (:func:`plan_shards`) is pure and deterministic: shards are cut in state-dict key
order, only between module groups (a group is a key's path up to its first numeric component,
``layers.3``, else its top-level module, ``lm_head``), so an unchanged transformer block is an
unchanged blob. A model no larger than the target size is one shard. Above it, a shard is closed
before the next group when that group would overflow the target, or when both the shard and the
next group hold at least 1/16 of the target: blocks of a large model then become blobs of their
own, which is what lets a fine-tune that changed its last block re-upload that block alone. Only
a group larger than the target is split inside, at tensor boundaries.

**The writer** writes safetensors files itself rather than through ``safetensors.save_file``,
because it needs two things that writer does not offer:

- **Aligned tensors.** Every tensor whose byte size is a multiple of 64 starts at a 64-byte
  aligned file offset: the header is padded with spaces (as safetensors itself pads to 8), and
  those tensors come first; the few others (biases of odd widths, int64 counters) follow. Within
  each group tensors are sorted by name, so the same tensors make the same bytes (and the same
  digest) whatever order they arrived in: a state dict, a ``.pt`` and a ``.safetensors`` file of
  one model are one blob. A memory map is page aligned, so the tensors a pull maps are 64-byte
  aligned in memory too, and CPU kernels (oneDNN) take the same paths as for freshly allocated
  weights: a pulled module computes exactly what the pushed one did. safetensors forbids holes
  between tensors, so alignment comes from the order, not from padding.
- **One pass.** The bytes are hashed as they are written, so a push reads the weights once;
  shards are written and hashed in parallel threads (file writes and hashlib release the GIL).

The files are ordinary safetensors: ``safe_open`` and ``load_file`` read them.

**The reader** (:func:`load_shard`) maps a verified shard once, privately, and makes every
tensor a view of that map (it reads the header itself and checks it as safetensors does:
``safe_open``'s per-tensor storage slices cost ~65 us a tensor, most of a small model's load).
Each tensor then moves to its device and dtype in one ``Tensor.to``; a tensor already where it
belongs is used in place. Tensors bound for CUDA cross through pinned, double-buffered staging
instead (:mod:`registry.io.staging`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import mmap
import os
import struct
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import torch

from ..caching.unchanged import KnownShard, matching, may_match
from ..errors import ManifestError, NormalizationError
from ..files import StagedFile, VersionFile, shard_name
from ..model.devices import CODE_DTYPES, DTYPE_CODES
from .digests import HashingWriter
from .diskerrors import typed
from .fdreader import read_open_file
from .shardheader import parse_header
from .staging import Staging, Stagings

ALIGNMENT = 64


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def file_order(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Keys in file order: tensors whose size keeps the next offset aligned first, then the rest;
    each group sorted by name."""
    names = sorted(tensors)
    return ([k for k in names if nbytes(tensors[k]) % ALIGNMENT == 0]
            + [k for k in names if nbytes(tensors[k]) % ALIGNMENT != 0])


def safetensors_header(tensors: Mapping[str, torch.Tensor],
                       metadata: Mapping[str, str] | None = None,
                       order: Sequence[str] | None = None) -> tuple[list[str], bytes]:
    """The file order of ``tensors`` (aligned unless ``order`` is given) and the bytes that
    precede their data in a safetensors file: the header's length, then the padded header."""
    if sys.byteorder != "little":
        raise NormalizationError("safetensors files are little-endian; pushing from a "
                                 "big-endian machine is not supported")
    order = file_order(tensors) if order is None else list(order)
    header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for key in order:
        tensor = tensors[key]
        code = DTYPE_CODES.get(tensor.dtype)
        if code is None:
            raise NormalizationError(
                f"tensor {key!r} has dtype {tensor.dtype}, which safetensors cannot store; "
                "cast it (e.g. .float()) before pushing"
            )
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"tensor {key!r} must be a contiguous CPU tensor to be written")
        size = nbytes(tensor)
        header[key] = {"dtype": code, "shape": list(tensor.shape),
                       "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % ALIGNMENT)
    return order, struct.pack("<Q", len(raw)) + raw


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, in place (no copy)."""
    size = nbytes(tensor)
    if not size:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * size).from_address(tensor.data_ptr())).cast("B")


def write_safetensors(tensors: Mapping[str, torch.Tensor],
                      path: str | os.PathLike[str] | BinaryIO,
                      metadata: Mapping[str, str] | None = None,
                      order: Sequence[str] | None = None) -> tuple[str, int]:
    """Write ``tensors`` (CPU, contiguous) as one safetensors file, aligned unless ``order``
    (the keys in the order their bytes follow each other) is given.

    Returns ``("sha256:<hex>", size)`` of the bytes written, hashed while they were written.
    ``path`` may be an unbuffered file open for writing (one :mod:`registry.io.safewrite` made).
    """
    order, head = safetensors_header(tensors, metadata, order)
    opened = (contextlib.nullcontext(path) if hasattr(path, "fileno")
              else open(path, "wb", buffering=0))  # noqa: SIM115
    with opened as fh, HashingWriter(fh) as out:
        out.write(head)
        for key in order:
            if nbytes(tensors[key]):
                out.write(tensor_bytes(tensors[key]))
    return out.digest(), out.written


# -- the split --------------------------------------------------------------------------------

# A group at least this fraction of the target starts a shard of its own (see the module doc).
OWN_SHARD_FRACTION = 16


def group_of(key: str) -> str:
    """The module group a key belongs to: up to its first numeric component, else its
    top-level module (``model.layers.3.mlp.weight`` -> ``model.layers.3``; ``lm_head.weight``
    -> ``lm_head``)."""
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0] if len(parts) > 1 else key


def plan_shards(sizes: Sequence[tuple[str, int]], target: int) -> list[list[str]]:
    """Cut ``(key, nbytes)`` pairs, in state-dict order, into shards of keys (module doc)."""
    if target < 1:
        raise ValueError(f"shard target must be positive, got {target}")
    if sum(size for _, size in sizes) <= target:
        return [[key for key, _ in sizes]] if sizes else []
    groups: list[tuple[list[str], int]] = []
    last = None
    for key, size in sizes:
        group = group_of(key)
        if group != last or not groups:
            groups.append(([], 0))
            last = group
        keys, total = groups[-1]
        keys.append(key)
        groups[-1] = (keys, total + size)
    by_key = dict(sizes)
    floor = max(1, target // OWN_SHARD_FRACTION)
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    for keys, size in groups:
        if size > target:  # only an oversized group is cut inside, at tensor boundaries
            if current:
                shards.append(current)
            current, current_size = [], 0
            for key in keys:
                if current and current_size + by_key[key] > target:
                    shards.append(current)
                    current, current_size = [], 0
                current.append(key)
                current_size += by_key[key]
            shards.append(current)
            current, current_size = [], 0
            continue
        if current and (current_size + size > target
                        or (current_size >= floor and size >= floor)):
            shards.append(current)
            current, current_size = [], 0
        current.extend(keys)
        current_size += size
    if current:
        shards.append(current)
    return shards


def write_shards(tensors: Mapping[str, torch.Tensor], target: int, staging: Path, *,
                 known: Sequence[KnownShard] = ()) -> list[StagedFile]:
    """Split ``tensors`` (in state-dict order) and write each shard into ``staging``, hashing as
    it writes; several shards are written at once. On failure nothing is left behind.

    A shard whose bytes equal one of ``known`` (verified local copies of stored shards) is not
    written: it takes that shard's digest and is written only if the push turns out to need
    the file after all (:mod:`registry.caching.unchanged`)."""
    plan = plan_shards([(k, nbytes(t)) for k, t in tensors.items()], target)
    if not plan:
        plan = [[]]  # a model with no tensors still has one (empty) weights file
    stem = f"push-{uuid.uuid4().hex}"
    paths = [staging / f"{stem}-{i:05d}.safetensors" for i in range(len(plan))]
    by_keys: dict[tuple[str, ...], list[KnownShard]] = {}
    for shard in known:
        by_keys.setdefault(tuple(sorted(shard.file.tensors)), []).append(shard)
    parts = [{k: tensors[k] for k in keys} for keys in plan]
    # Where a stored shard may hold a part's bytes: its key order, header and size, to compare.
    layouts = [_layout(part) for part in parts] if by_keys else []

    def might_match(i: int) -> bool:
        order, head, size = layouts[i]
        return may_match(plan[i], head, size, parts[i], order, by_keys)

    def write(i: int) -> StagedFile:
        part = parts[i]
        name = shard_name(i, len(plan))
        if by_keys:
            order, head, size = layouts[i]
            same = matching(plan[i], head, size, part, order, by_keys)
            if same is not None:
                return StagedFile(paths[i], VersionFile("weights", name, same.file.digest, size,
                                                        tuple(sorted(plan[i]))),
                                  write=functools.partial(write_safetensors, part))
        with typed(paths[i], sum(nbytes(t) for t in part.values()), f"push: staging {name}"):
            digest, size = write_safetensors(part, paths[i])
        return StagedFile(paths[i], VersionFile("weights", name, digest, size,
                                                tuple(sorted(plan[i]))))

    try:
        if len(plan) == 1:
            return [write(0)]
        # Shards that will certainly be written go first (unchanged.may_match).
        first = sorted(range(len(plan)), key=lambda i: bool(by_keys) and might_match(i))
        with ThreadPoolExecutor(max_workers=min(len(plan), os.cpu_count() or 1, 8),
                                thread_name_prefix="registry-write") as pool:
            done = dict(zip(first, pool.map(write, first), strict=True))
        return [done[i] for i in range(len(plan))]
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise


def _layout(part: Mapping[str, torch.Tensor]) -> tuple[list[str], bytes, int]:
    order, head = safetensors_header(part)
    return order, head, len(head) + sum(nbytes(t) for t in part.values())


# -- the reader -------------------------------------------------------------------------------

DtypeFor = Callable[[str, torch.dtype, torch.device], torch.dtype]


def load_shard(
    path: Path | BinaryIO,
    expected: Mapping[str, Mapping[str, object]],
    placement: Callable[[str], torch.device],
    dtype_for: DtypeFor,
    *,
    origin: str,
    stagings: Stagings | None = None,
) -> dict[str, torch.Tensor]:
    """Every tensor of a verified shard on its device and dtype.

    ``expected`` is the manifest's ``{key: {"dtype", "shape"}}`` for this shard: a file whose
    tensors differ from what the manifest lists is refused, so a manifest can never make a pull
    hand back tensors it does not describe. Tensors bound for a device that ``stagings`` stages
    for (CUDA) cross through its pinned buffers (:mod:`registry.io.staging`), in file order.
    ``path`` may be the verified open file (``Backend.open_blob``): that very file is mapped.
    """
    out: dict[str, torch.Tensor] = {}
    staged: dict[Staging, list[tuple[str, torch.Tensor, torch.dtype]]] = {}
    with _mapped(path, origin) as tensors:
        keys = list(tensors)
        if set(keys) != set(expected):
            extra = sorted(set(keys) - set(expected))[:3]
            missing = sorted(set(expected) - set(keys))[:3]
            raise ManifestError(
                f"{origin}: shard {_label(path)} holds other tensors than its manifest lists "
                f"(unlisted {extra}, absent {missing}); the manifest or the store was tampered "
                "with: push the model again"
            )
        for key in keys:
            tensor = tensors[key]()
            spec = expected[key]
            if str(tensor.dtype).removeprefix("torch.") != spec["dtype"] \
                    or list(tensor.shape) != list(spec["shape"]):  # type: ignore[call-overload]
                raise ManifestError(
                    f"{origin}: tensor {key!r} is stored as {tensor.dtype} {list(tensor.shape)} "
                    f"but its manifest says {spec['dtype']} {spec['shape']}; push the model again"
                )
            device = placement(key)
            dtype = dtype_for(key, tensor.dtype, device)
            staging = stagings.get(device) if stagings is not None else None
            if staging is not None:
                staged.setdefault(staging, []).append((key, tensor, dtype))
                continue
            moved = tensor.to(device=device, dtype=dtype)
            if moved is tensor and tensor.data_ptr() % ALIGNMENT:
                # Still in the file's map at an unaligned address (an odd-sized tensor stored
                # after the aligned ones, or a file written by another tool): copy it into
                # fresh memory, which is aligned, so kernels behave as on the pushed module.
                moved = tensor.clone()
            out[key] = moved
    for staging, items in staged.items():
        # File order: the host copies walk the map front to back, as the prefault reads it.
        items.sort(key=lambda item: item[1].data_ptr())
        moved_all = staging.move((t, dtype) for _, t, dtype in items)
        out.update((key, moved) for (key, _, _), moved in zip(items, moved_all, strict=True))
    return out


# -- mapping a shard --------------------------------------------------------------------------

@contextlib.contextmanager
def _mapped(path: Path | BinaryIO, origin: str
            ) -> Iterator[Mapping[str, Callable[[], torch.Tensor]]]:
    """``{key: make tensor}`` for every tensor of the safetensors file at ``path`` (or open as
    ``path``, then read from offset 0 and left open), each on
    its own bytes of one private memory map of the whole file.

    safetensors' ``get_tensor`` costs ~65 us a tensor here (a Python storage slice and a view
    each); this reads the header once and makes each tensor with one ``torch.frombuffer`` on
    the map (~7 us). The header is checked as safetensors checks it (known dtypes, sizes that
    match shapes, offsets that tile the data with no hole or overlap), so a crafted file can
    neither point outside the map nor alias another tensor. A file with a dtype this table
    lacks is read through ``safe_open``, of the same open file."""
    with (open(path, "rb") if isinstance(path, str | os.PathLike)
          else contextlib.nullcontext(path)) as fh:
        fh.seek(0)
        try:
            parsed = parse_header(fh, CODE_DTYPES)
        except (ValueError, OSError) as exc:
            raise ManifestError(
                f"{origin}: shard {_label(path)} is not a valid safetensors file ({exc}); the "
                "store was tampered with: push the model again") from None
        if parsed is None:
            with read_open_file(fh, _label(path), origin) as st:
                yield st
            return
        # Private and writable, as torch maps a file: a tensor written in place copies its
        # pages and never changes the shard.
        mapped = mmap.mmap(fh.fileno(), parsed[2], flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    _ask_for_huge_pages(mapped)
    entries, start, _ = parsed

    def make(dtype: torch.dtype, shape: list[int], begin: int, end: int) -> torch.Tensor:
        if begin == end:
            return torch.empty(shape, dtype=dtype)
        # A storage of its own bytes (as safetensors gives), so saving one tensor saves it
        # alone; the map lives as long as any tensor made from it.
        return torch.frombuffer(mapped, dtype=dtype, count=(end - begin) // dtype.itemsize,
                                offset=start + begin).view(shape)

    yield {key: functools.partial(make, dtype, shape, begin, end)
           for key, (dtype, shape, begin, end) in entries.items()}


def _label(path: Path | BinaryIO) -> str:
    return Path(str(getattr(path, "name", path))).name[:16]


HUGE_PAGE = 2 * 2**20  # a PMD on x86-64 and 4 KiB-page arm64: smaller maps get no advice


def _ask_for_huge_pages(mapped: mmap.mmap) -> None:
    """Ask the kernel to read the shard into 2 MiB folios and map them whole (``MADV_HUGEPAGE``).

    A mapped tensor costs a page fault for each folio of the page cache it spans. Where the
    kernel keeps a file in PMD-sized folios (large folios on ext4 since Linux 6.16, XFS, tmpfs),
    one fault maps 2 MiB; otherwise fault-around maps 64 KiB. Without the advice, a cold read
    through the map ramps up from small folios (68% of an 806 MB shard ended up in 2 MiB ones
    here); with it, the kernel reads 2 MiB folios from the first fault, the cold read is faster,
    and every later pull of the file maps it 2 MiB at a time. A write to a tensor still copies
    only its 4 KiB page. The advice is a hint: a kernel without it changes nothing."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None and len(mapped) >= HUGE_PAGE:
        with contextlib.suppress(OSError):
            mapped.madvise(advice)
