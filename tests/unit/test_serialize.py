"""The safetensors writer: aligned offsets, a digest of exactly the bytes written, real files."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, safe_open

from registry.errors import NormalizationError
from registry.serialize import ALIGNMENT, file_order, write_safetensors


def _layout(path: Path) -> tuple[int, dict[str, dict]]:
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    header.pop("__metadata__")
    return 8 + length, header


def test_tensors_start_at_aligned_offsets_and_read_back_exactly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tensors = {
        "odd.bias": torch.randn(10),  # 40 bytes: cannot keep the next offset aligned
        "conv.weight": torch.randn(64, 3, 7, 7),
        "steps": torch.tensor(7),  # an 8-byte int64 counter
        "half.weight": torch.randn(32, 16).half(),
        "empty": torch.empty(0),
        "flags": torch.tensor([True, False, True]),
    }
    path = tmp_path / "w.safetensors"
    digest, size = write_safetensors(tensors, path)

    data_start, header = _layout(path)
    assert data_start % ALIGNMENT == 0
    for key, tensor in tensors.items():
        if tensor.numel() * tensor.element_size() % ALIGNMENT == 0:
            assert (data_start + header[key]["data_offsets"][0]) % ALIGNMENT == 0, key
    assert file_order(tensors) == ["conv.weight", "empty", "half.weight",
                                   "flags", "odd.bias", "steps"]

    assert size == path.stat().st_size
    assert digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    loaded = load_file(path)
    assert loaded.keys() == tensors.keys()
    for key, tensor in tensors.items():
        assert loaded[key].dtype == tensor.dtype and torch.equal(loaded[key], tensor), key
    with safe_open(str(path), framework="pt") as fh:
        assert fh.metadata() == {"format": "pt"}
        mapped = fh.get_tensor("conv.weight")
    assert mapped.data_ptr() % ALIGNMENT == 0  # a page-aligned map keeps file alignment


def test_same_tensors_give_byte_identical_files_in_any_order(tmp_path: Path) -> None:
    tensors = {"a": torch.arange(12.0), "b": torch.ones(3, dtype=torch.int64)}
    first = write_safetensors(tensors, tmp_path / "1.safetensors")
    second = write_safetensors(dict(reversed(tensors.items())), tmp_path / "2.safetensors")
    assert first == second
    assert (tmp_path / "1.safetensors").read_bytes() == (tmp_path / "2.safetensors").read_bytes()


def test_a_dtype_safetensors_cannot_hold_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(NormalizationError, match=r"'z' has dtype torch.complex128.*cast it"):
        write_safetensors({"z": torch.zeros(2, dtype=torch.complex128)},
                          tmp_path / "z.safetensors")
