"""NormalizedWeights <-> safetensors files, and the sha256 digests that address them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

_CHUNK = 8 * 1024 * 1024


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike[str]) -> None:
    """Write ``tensors`` (CPU, contiguous, no shared storage) as one safetensors file."""
    from safetensors.torch import save_file

    save_file(tensors, os.fspath(path), metadata={"format": "pt"})


def sha256_file(path: str | os.PathLike[str]) -> str:
    """``"sha256:<hex>"`` of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return f"sha256:{digest.hexdigest()}"


def file_size(path: str | os.PathLike[str]) -> int:
    return Path(path).stat().st_size
