"""The header of a safetensors shard, read and checked as safetensors checks it.

Checked: an 8-byte length within :data:`MAX_HEADER` and the file, a JSON object, each tensor's
dtype, shape and offsets, sizes that match shapes, and offsets that tile the data with no hole
or overlap, so a crafted file can neither point outside the file nor alias another tensor.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import BinaryIO

import torch

from ..trust import boundedjson

MAX_HEADER = 100_000_000  # safetensors' own limit on the header's length
MAX_DIMS = 64  # torch's own limit on a tensor's dimensions
MAX_ELEMENTS = 2**63 // 16 - 1  # strides and byte sizes in int64 for any itemsize up to 16

# ({key: (dtype, shape, begin, end)}, data start, file size)
Parsed = tuple[dict[str, tuple[torch.dtype, list[int], int, int]], int, int]


def parse_header(fh: BinaryIO, dtypes: Mapping[str, torch.dtype]) -> Parsed | None:
    """``({key: (dtype, shape, begin, end)}, data start, file size)`` of the safetensors file
    open as ``fh``, refused (``ValueError``) unless its offsets tile the data exactly; None
    where a dtype is outside ``dtypes`` (safetensors' code -> torch dtype)."""
    size = os.fstat(fh.fileno()).st_size
    head = fh.read(8)
    if len(head) < 8:
        raise ValueError("shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER or 8 + length > size:
        raise ValueError(f"header length {length} does not fit a {size}-byte file")
    raw = fh.read(length)
    try:
        # As safetensors reads it: strict UTF-8 (no BOM, no UTF-16, no encoded surrogates).
        header = boundedjson.loads(raw, max_depth=None)
    except ValueError as exc:
        raise ValueError(f"header is not JSON (strict UTF-8): {str(exc)[:160]}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    _strict_strings(header)
    entries: dict[str, tuple[torch.dtype, list[int], int, int]] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"tensor {key!r} lacks dtype, shape or data_offsets") from None
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
                and all(type(d) is int and d >= 0 for d in shape)
                and type(begin) is int and type(end) is int and 0 <= begin <= end):
            raise ValueError(f"tensor {key!r} has a malformed shape or offsets")
        numel = span = 1
        for d in shape:
            numel *= d
            span *= max(d, 1)  # what strides multiply: a zero dimension does not bound them
        if span > MAX_ELEMENTS:  # torch would raise "Stride calculation overflowed"
            raise ValueError(f"tensor {key!r} has shape {str(shape)[:120]}, whose dimensions "
                             "multiply past 2**63 (a zero dimension included)")
        dtype = dtypes.get(code) if isinstance(code, str) else None
        if dtype is None:
            return None
        if numel * dtype.itemsize != end - begin:
            raise ValueError(f"tensor {key!r}: {end - begin} bytes for {code} {shape}")
        entries[key] = (dtype, shape, begin, end)
    at = 0
    for begin, end in sorted((e[2], e[3]) for e in entries.values()):
        if begin != at:
            raise ValueError(f"tensor data at offset {begin} where {at} was expected")
        at = end
    if 8 + length + at != size:
        raise ValueError(f"tensor data ends at {8 + length + at} in a {size}-byte file")
    return entries, 8 + length, size


def _strict_strings(header: dict[str, object]) -> None:
    """Refuse what safetensors refuses besides the bytes: a lone surrogate (``"\\ud800"``) in a
    key or a dtype, and ``__metadata__`` that is not an object of strings."""
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("__metadata__ is not an object of strings")
    texts = [*header, *metadata, *metadata.values()]
    texts += [i["dtype"] for i in header.values() if isinstance(i, dict)
              and isinstance(i.get("dtype"), str)]
    try:
        "".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("header holds a lone surrogate (\\ud800-\\udfff)") from None
