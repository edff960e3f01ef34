"""NormalizedWeights <-> safetensors files, and the sha256 digests that address them.

The registry writes safetensors files itself rather than through ``safetensors.save_file``,
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
- **One pass.** The bytes are hashed as they are written, so a push reads the weights once.

The files are ordinary safetensors: ``safe_open`` and ``load_file`` read them.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
from collections.abc import Mapping

import torch

from .digests import HashingWriter
from .errors import NormalizationError

ALIGNMENT = 64

# torch dtype -> safetensors dtype code, for every dtype both torch and safetensors know.
DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        DTYPE_CODES[getattr(torch, _name)] = _code


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def file_order(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Keys in file order: tensors whose size keeps the next offset aligned first, then the rest;
    each group sorted by name."""
    names = sorted(tensors)
    return ([k for k in names if nbytes(tensors[k]) % ALIGNMENT == 0]
            + [k for k in names if nbytes(tensors[k]) % ALIGNMENT != 0])


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike[str],
                      metadata: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Write ``tensors`` (CPU, contiguous, no shared storage) as one aligned safetensors file.

    Returns ``("sha256:<hex>", size)`` of the bytes written, hashed while they were written.
    """
    if sys.byteorder != "little":
        raise NormalizationError("safetensors files are little-endian; pushing from a "
                                 "big-endian machine is not supported")
    order = file_order(tensors)
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
    with open(path, "wb", buffering=0) as fh:
        out = HashingWriter(fh)
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for key in order:
            tensor = tensors[key]
            size = nbytes(tensor)
            if size:
                out.write(memoryview((ctypes.c_ubyte * size).from_address(tensor.data_ptr())))
    return out.digest(), out.written
