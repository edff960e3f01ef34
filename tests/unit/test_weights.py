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
from registry.io.weights import (
    ALIGNMENT,
    DTYPE_CODES,
    file_order,
    group_of,
    plan_shards,
    write_safetensors,
    write_shards,
)
from registry.manifest import STORED_DTYPES


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


def test_a_shard_of_thousands_of_small_tensors_is_written_and_hashed(tmp_path: Path) -> None:
    # Each tensor (and its alignment padding) is a piece of the file's first 8 MiB block: more
    # pieces than one writev takes (IOV_MAX, 1024 on Linux).
    tensors = {f"layer{i}.scale": torch.full((3,), float(i)) for i in range(3000)}
    path = tmp_path / "many.safetensors"
    digest, size = write_safetensors(tensors, path)
    assert digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert size == path.stat().st_size
    back = load_file(path)
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


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


# -- the split --------------------------------------------------------------------------------

def _layers(n: int, size: int) -> list[tuple[str, int]]:
    sizes = [("embed.weight", size)]
    for i in range(n):
        sizes += [(f"layers.{i}.attn.weight", size // 2), (f"layers.{i}.mlp.weight", size // 2),
                  (f"layers.{i}.norm.weight", 8)]
    return sizes + [("norm.weight", 8), ("lm_head.weight", size)]


def test_group_is_the_path_up_to_the_first_index_else_the_top_module() -> None:
    assert group_of("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert group_of("layer1.0.conv1.weight") == "layer1.0"
    assert group_of("lm_head.weight") == "lm_head"
    assert group_of("transformer.wte.weight") == "transformer"
    assert group_of("scale") == "scale"


def test_a_model_under_the_target_is_one_shard_in_state_dict_order() -> None:
    sizes = _layers(2, 100)
    assert plan_shards(sizes, target=10_000) == [[k for k, _ in sizes]]


def test_shards_cut_only_between_groups_and_blocks_get_their_own() -> None:
    sizes = _layers(4, 1000)  # each block ~1008 bytes, target 2500: floor 156
    shards = plan_shards(sizes, target=2500)
    # Every key exactly once, in order.
    assert [k for shard in shards for k in shard] == [k for k, _ in sizes]
    for shard in shards:
        assert sum(dict(sizes)[k] for k in shard) <= 2500
    # No block straddles two shards.
    for i in range(4):
        homes = {n for n, shard in enumerate(shards) for k in shard
                 if k.startswith(f"layers.{i}.")}
        assert len(homes) == 1, (i, shards)
    # A block big enough to matter is a shard of its own: changing it changes one blob.
    assert ["layers.2.attn.weight", "layers.2.mlp.weight", "layers.2.norm.weight"] in shards


def test_small_groups_are_packed_together() -> None:
    sizes = [(f"blocks.{i}.weight", 10) for i in range(100)]  # 1000 bytes, target 300
    shards = plan_shards(sizes, target=300)
    assert [len(s) for s in shards] == [30, 30, 30, 10]


def test_a_single_oversized_group_is_cut_at_tensor_boundaries() -> None:
    sizes = [("embed.weight", 50), ("huge.a", 400), ("huge.b", 400), ("huge.c", 400),
             ("head.weight", 50)]
    shards = plan_shards(sizes, target=900)
    assert shards == [["embed.weight"], ["huge.a", "huge.b"], ["huge.c"], ["head.weight"]]
    # A tensor larger than the target is a shard by itself.
    assert plan_shards([("a.x", 5), ("b.big", 50), ("c.y", 5)], target=20) == [
        ["a.x"], ["b.big"], ["c.y"]]


def test_the_split_depends_only_on_keys_and_sizes() -> None:
    sizes = _layers(6, 4096)
    assert plan_shards(sizes, target=10_000) == plan_shards(list(sizes), target=10_000)


def test_shards_are_written_in_parallel_and_each_holds_its_keys(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tensors = {f"layers.{i}.weight": torch.randn(32, 32) for i in range(6)}
    staged = write_shards(tensors, 8192, tmp_path)
    assert len(staged) == 6
    assert [s.file.name for s in staged][0] == "model-00001-of-00006.safetensors"
    for s in staged:
        assert s.file.digest == "sha256:" + hashlib.sha256(s.path.read_bytes()).hexdigest()
        assert set(load_file(s.path)) == set(s.file.tensors)
    again = write_shards(dict(reversed(tensors.items())), 8192, tmp_path)
    assert sorted(s.digest for s in again) == sorted(s.digest for s in staged)


def test_a_failed_shard_write_leaves_no_file(tmp_path: Path) -> None:
    tensors = {"a.weight": torch.ones(64, 64), "b.weight": torch.zeros(2, dtype=torch.complex128)}
    with pytest.raises(NormalizationError):
        write_shards(tensors, 1024, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_manifest_validation_knows_exactly_the_dtypes_the_writer_stores() -> None:
    # manifest.py spells the names out so that validating a manifest imports no torch.
    assert {str(d).removeprefix("torch.") for d in DTYPE_CODES} == STORED_DTYPES
