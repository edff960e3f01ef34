"""Reading a verified shard: one private map of the whole file, every tensor a view of it, the
header checked as safetensors checks it, anything else read through ``safe_open``."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from registry.errors import ManifestError
from registry.io.weights import (
    DTYPE_CODES,
    load_shard,
    safetensors_header,
    tensor_bytes,
    write_safetensors,
)


def _cpu(_key: str) -> torch.device:
    return torch.device("cpu")


def _stored(_key: str, stored: torch.dtype, _device: torch.device) -> torch.dtype:
    return stored


def _spec(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, object]]:
    return {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
            for k, t in tensors.items()}


def _load(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return load_shard(path, _spec(tensors), _cpu, _stored, origin="m:v1")


def _write(path: Path, header: object, data: bytes, *, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def _every_dtype() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for dtype in DTYPE_CODES:
        base = torch.randn(8, 8, generator=g) * 50
        name = str(dtype).removeprefix("torch.")
        out[name] = (torch.complex(base, -base) if dtype.is_complex else base).to(dtype)
    out["scalar"] = torch.tensor(3.5)
    out["empty"] = torch.empty(0, 4)
    out["odd"] = torch.arange(3, dtype=torch.int8)
    return out


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(tensor_bytes(t.contiguous()))


def test_every_dtype_reads_back_bit_exact(tmp_path: Path) -> None:
    tensors = _every_dtype()
    path = tmp_path / "all.safetensors"
    save_file(tensors, str(path))  # safetensors' own layout: no alignment
    loaded = _load(path, tensors)
    reference = load_file(str(path))
    assert set(loaded) == set(tensors)
    for key, tensor in tensors.items():
        assert loaded[key].dtype == tensor.dtype and loaded[key].shape == tensor.shape
        assert _bytes(loaded[key]) == _bytes(reference[key]) == _bytes(tensor), key


def test_an_aligned_shard_is_one_map_and_no_copy(tmp_path: Path) -> None:
    tensors = _every_dtype()
    path = tmp_path / "aligned.safetensors"
    write_safetensors(tensors, path)  # the registry's layout: aligned tensors first
    order, _ = safetensors_header(tensors)
    loaded = _load(path, tensors)
    for key, tensor in tensors.items():
        assert _bytes(loaded[key]) == _bytes(tensor), key
    header = json.loads(path.read_bytes()[8:8 + struct.unpack("<Q", path.read_bytes()[:8])[0]])
    aligned = [k for k in order if tensors[k].numel()
               and tensors[k].numel() * tensors[k].element_size() % 64 == 0]
    assert len(aligned) > 8
    first = aligned[0]
    for key in aligned:
        offset = header[key]["data_offsets"][0] - header[first]["data_offsets"][0]
        assert loaded[key].data_ptr() - loaded[first].data_ptr() == offset, \
            f"{key} is the file's bytes in place (one map), not a copy"
        nbytes = loaded[key].numel() * loaded[key].element_size()
        assert loaded[key].untyped_storage().nbytes() == nbytes, \
            f"{key} has a storage of its own bytes, so saving it saves it alone"


def test_a_tensor_saved_alone_saves_its_own_bytes(tmp_path: Path) -> None:
    tensors = {"big": torch.randn(256, 256), "small": torch.arange(16, dtype=torch.int64)}
    path = tmp_path / "w.safetensors"
    write_safetensors(tensors, path)
    loaded = _load(path, tensors)
    torch.save(loaded["small"], tmp_path / "small.pt")
    assert (tmp_path / "small.pt").stat().st_size < 4096
    assert torch.equal(torch.load(tmp_path / "small.pt", weights_only=True), tensors["small"])


def test_a_tensor_at_an_offset_no_multiple_of_its_size_is_read_into_aligned_memory(
        tmp_path: Path) -> None:
    odd = torch.tensor([1, 2, 3], dtype=torch.int8)
    wide = torch.arange(6, dtype=torch.float32) / 3
    header = {"odd": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]},
              "wide": {"dtype": "F32", "shape": [2, 3], "data_offsets": [3, 27]}}
    path = _write(tmp_path / "odd.safetensors", header,
                  odd.numpy().tobytes() + wide.numpy().tobytes())
    loaded = _load(path, {"odd": odd, "wide": wide.view(2, 3)})
    assert torch.equal(loaded["wide"], wide.view(2, 3))
    assert torch.equal(loaded["odd"], odd)
    assert loaded["wide"].data_ptr() % 64 == 0


def test_a_dtype_outside_the_table_is_read_through_safe_open(tmp_path: Path) -> None:
    if not hasattr(torch, "uint16"):
        pytest.skip("this torch has no uint16")
    tensors = {"u16": torch.arange(10, dtype=torch.int32).to(torch.uint16),
               "f": torch.ones(4)}
    path = tmp_path / "u16.safetensors"
    save_file(tensors, str(path))
    loaded = _load(path, tensors)
    assert loaded["u16"].dtype == torch.uint16
    assert torch.equal(loaded["u16"].to(torch.int32), torch.arange(10, dtype=torch.int32))
    assert torch.equal(loaded["f"], torch.ones(4))


F32x2 = {"dtype": "F32", "shape": [2]}


@pytest.mark.parametrize(("header", "data", "length", "says"), [
    ({"a": {**F32x2, "data_offsets": [0, 8]}, "b": {**F32x2, "data_offsets": [12, 20]}},
     bytes(20), None, "offset 12 where 8 was expected"),
    ({"a": {**F32x2, "data_offsets": [0, 8]}, "b": {**F32x2, "data_offsets": [4, 12]}},
     bytes(12), None, "offset 4 where 8 was expected"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
     bytes(8), None, "8 bytes for F32 [3]"),
    ({"a": {**F32x2, "data_offsets": [0, 8]}}, bytes(16), None, "ends at"),
    ({"a": {**F32x2, "data_offsets": [0, 8]}}, bytes(4), None, "ends at"),
    ({"a": {**F32x2, "data_offsets": [8, 0]}}, bytes(8), None, "malformed"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8), None,
     "malformed"),
    ({"a": {"shape": [2], "data_offsets": [0, 8]}}, bytes(8), None, "lacks dtype"),
    ({"a": [1, 2]}, bytes(8), None, "lacks dtype"),
    ([1, 2, 3], b"", None, "not a JSON object"),
    ({"a": {**F32x2, "data_offsets": [0, 8]}}, bytes(8), 10**9, "does not fit"),
])
def test_a_header_that_does_not_tile_the_file_is_refused(
        tmp_path: Path, header: object, data: bytes, length: int | None, says: str) -> None:
    path = _write(tmp_path / "bad.safetensors", header, data, length=length)
    with pytest.raises(ManifestError, match="not a valid safetensors file") as caught:
        load_shard(path, {"a": F32x2}, _cpu, _stored, origin="m:v1")
    assert says in str(caught.value)
    assert "m:v1" in str(caught.value) and "push the model again" in str(caught.value)


def test_a_header_that_is_not_json_or_a_file_too_short_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 4) + b"\xff{[}")
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    for path, says in ((garbage, "not JSON"), (short, "shorter than")):
        with pytest.raises(ManifestError, match=says):
            load_shard(path, {"a": F32x2}, _cpu, _stored, origin="m:v1")


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping holding ``address``, from /proc/self/smaps."""
    text = Path("/proc/self/smaps").read_text()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        low, high = (int(x, 16) for x in block.split(None, 1)[0].split("-"))
        if low <= address < high:
            return re.search(r"^VmFlags:(.*)$", block, re.M).group(1).split()  # type: ignore[union-attr]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux only: reads smaps")
def test_a_shard_of_2_mib_or_more_is_mapped_asking_for_huge_pages(tmp_path: Path) -> None:
    big = {"w": torch.randn(1024, 1024)}  # 4 MiB: the kernel may map it 2 MiB at a time
    small = {"w": torch.randn(64, 64)}
    write_safetensors(big, tmp_path / "big.safetensors")
    write_safetensors(small, tmp_path / "small.safetensors")
    loaded_big = _load(tmp_path / "big.safetensors", big)
    loaded_small = _load(tmp_path / "small.safetensors", small)
    assert "hg" in _vm_flags(loaded_big["w"].data_ptr()), "MADV_HUGEPAGE on a shard's map"
    assert "hg" not in _vm_flags(loaded_small["w"].data_ptr()), "no advice under 2 MiB"
    # Still a private map: a write copies its page and never reaches the shard.
    loaded_big["w"][0, 0] = 7.0
    assert torch.equal(load_file(str(tmp_path / "big.safetensors"))["w"], big["w"])
    assert _load(tmp_path / "big.safetensors", big)["w"][0, 0] != 7.0
