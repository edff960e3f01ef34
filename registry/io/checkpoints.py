"""Reading checkpoint files safely: safetensors, or torch pickles loaded with weights_only.

A torch pickle remembers the device each storage lived on (``cuda:3``). We load it with a
``map_location`` callable that writes down that location and keeps the storage on the CPU, so a
checkpoint from a GPU box is read, and its devices recorded, on a machine with no GPU.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, UnsafeCheckpointError
from ..files import INDEX_FILES, PICKLE_SUFFIXES, SAFETENSORS_SUFFIX
from ..model.devices import device_sort_key
from ..model.statedict import ModuleMetadata, clean_module_metadata, module_metadata_of
from ..trust import boundedjson

# Where training loops put the weights inside a dict checkpoint, in the order we look.
NESTED_WEIGHT_KEYS = ("state_dict", "model_state_dict", "model", "module")


@dataclass
class Checkpoint:
    """What a checkpoint file holds: a state dict and facts about how it was written."""

    state_dict: dict[str, Any]
    format: str  # "safetensors" | "torch-pickle"
    devices: list[str] = field(default_factory=list)
    nested_key: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    shards: int = 1  # weights files read (a sharded checkpoint directory has several)
    # The ``_metadata`` versions torch.save kept on the state dict (prefix -> {"version": N}).
    module_metadata: ModuleMetadata = field(default_factory=dict)


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Load the weights in ``path`` onto the CPU without executing anything from the file.

    ``path`` may be a directory: a Hugging Face style sharded checkpoint (shards plus
    ``model.safetensors.index.json`` or ``pytorch_model.bin.index.json``), or a directory that
    holds exactly one weights file.
    """
    path = Path(path)
    if path.is_dir():
        return read_checkpoint_dir(path)
    if not path.is_file():  # follows a symlink: a link to a regular file reads that file
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    try:
        if path.stat().st_size == 0:
            raise CheckpointError(f"checkpoint {str(path)!r} is empty (0 bytes): it was not "
                                  "written completely; save it again")
        kind = _kind(path)
        if kind == "safetensors":
            return _read_safetensors(path)
        return _read_pickle(path)
    except OSError as exc:  # unreadable (permissions), or gone while being read
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: "
                              f"{exc.strerror or type(exc).__name__}") from None


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == SAFETENSORS_SUFFIX:
        return "safetensors"
    if suffix in PICKLE_SUFFIXES:
        return "torch-pickle"
    with path.open("rb") as fh:
        head = fh.read(9)
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return "torch-pickle"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    raise CheckpointError(
        f"cannot tell what {str(path)!r} is: name it *.safetensors or one of "
        f"{', '.join('*' + s for s in PICKLE_SUFFIXES)} (a torch.save file)"
    )


def _read_safetensors(path: Path) -> Checkpoint:
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            metadata = dict(fh.metadata() or {})
            order = registry_key_order(metadata, fh.keys())
            tensors = {key: fh.get_tensor(key) for key in order}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {exc}") from None
    return Checkpoint(tensors, "safetensors", metadata=metadata,
                      module_metadata=registry_module_metadata(metadata))


# A file written by ``registry pull -o`` records the pushed key order and module versions in
# its ``__metadata__`` (whose values must be strings), so pushing it again loses neither.
KEY_ORDER_FIELD = "registry.key_order"
MODULE_METADATA_FIELD = "registry.module_metadata"


def registry_key_order(metadata: Mapping[str, str], keys: list[str]) -> list[str]:
    """``keys`` in the order a registry-written file records, else as the file lists them."""
    try:
        order = boundedjson.loads(metadata.get(KEY_ORDER_FIELD, "null"))
    except ValueError:
        order = None
    if isinstance(order, list) and len(order) == len(keys) and set(order) == set(keys):
        return order
    return list(keys)


def registry_module_metadata(metadata: Mapping[str, str]) -> ModuleMetadata:
    try:
        recorded = boundedjson.loads(metadata.get(MODULE_METADATA_FIELD, "null"))
    except ValueError:
        return {}
    return clean_module_metadata(recorded)


def _read_pickle(path: Path) -> Checkpoint:
    locations: set[str] = set()

    def keep_on_cpu(storage: Any, location: str) -> Any:
        locations.add(str(location))
        return storage

    try:
        obj = torch.load(path, map_location=keep_on_cpu, weights_only=True, mmap=_can_mmap(path))
    except pickle.UnpicklingError as exc:
        globals_ = re.findall(r"GLOBAL ([\w.]+)", str(exc))
        if not globals_:
            raise CheckpointError(
                f"{str(path)!r} is not a readable torch checkpoint (the pickle stream is invalid "
                "or truncated)"
            ) from None
        raise UnsafeCheckpointError(
            f"refused {str(path)!r}: it pickles Python objects "
            f"({', '.join(sorted(set(globals_)))}), not just tensors, so loading it would run "
            "code from the file; it was not executed. "
            "Save model.state_dict() with torch.save, or push the module itself"
        ) from None
    except Exception as exc:  # noqa: BLE001
        # weights_only unpickling runs no code from the file, so whatever it raises on a
        # truncated or garbage file (EOFError, IndexError, KeyError, struct.error...) means the
        # same thing: these bytes are not a checkpoint.
        lines = str(exc).strip().splitlines()
        raise CheckpointError(
            f"{str(path)!r} is not a readable torch checkpoint (truncated or not written by "
            f"torch.save): {lines[0][:200] if lines else type(exc).__name__}"
        ) from None
    state_dict, nested_key = _find_state_dict(obj, path)
    found = obj[nested_key] if nested_key else obj
    return Checkpoint(
        state_dict, "torch-pickle", devices=sorted(locations, key=device_sort_key),
        nested_key=nested_key, module_metadata=module_metadata_of(found),
    )


def _can_mmap(path: Path) -> bool:
    # mmap only works for the zip format (torch >= 1.6); legacy files are read whole.
    with path.open("rb") as fh:
        return fh.read(4) == b"PK\x03\x04"


def _find_state_dict(obj: Any, path: Path) -> tuple[dict[str, Any], str | None]:
    if isinstance(obj, torch.Tensor):
        raise CheckpointError(
            f"{str(path)!r} holds a single tensor, not a state dict; save a dict of name -> tensor"
        )
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"{str(path)!r} holds a {type(obj).__name__}, not a state dict; save "
            "model.state_dict() instead"
        )
    if _has_tensors(obj):
        return dict(obj), None
    for key in NESTED_WEIGHT_KEYS:
        inner = obj.get(key)
        if isinstance(inner, Mapping) and _has_tensors(inner):
            return dict(inner), key
    keys = ", ".join(repr(k) for k in list(obj)[:8])
    raise CheckpointError(
        f"found no weights in {str(path)!r}: its top-level keys are {keys}; expected tensors, or a "
        f"dict under one of {', '.join(NESTED_WEIGHT_KEYS)}"
    )


def _has_tensors(mapping: Mapping[Any, Any]) -> bool:
    return any(isinstance(value, torch.Tensor) for value in mapping.values())


# -- directories ------------------------------------------------------------------------------

MAX_INDEX_BYTES = 64 * 2**20


def weight_files_in(directory: Path) -> list[Path]:
    """The weights files a checkpoint directory holds (shards named by its index, else the one
    weights file); other files (config, tokenizer) are not weights."""
    for index_name in INDEX_FILES:
        index = directory / index_name
        if index.is_file():
            return [directory / name for name in _index_shards(index)]
    found = sorted(p for p in directory.iterdir() if p.is_file() and (
        p.suffix.lower() == SAFETENSORS_SUFFIX or p.suffix.lower() in PICKLE_SUFFIXES))
    safetensors = [p for p in found if p.suffix.lower() == SAFETENSORS_SUFFIX]
    if len(safetensors) == 1:
        return safetensors  # a safetensors file beside a .bin copy of it: take the safe one
    if len(found) == 1:
        return found
    if not found:
        raise CheckpointError(
            f"directory {str(directory)!r} holds no weights file (*.safetensors, "
            f"{', '.join('*' + s for s in PICKLE_SUFFIXES)}) and no shard index "
            f"({' or '.join(INDEX_FILES)}); push the weights file itself")
    names = ", ".join(p.name for p in found[:6])
    raise CheckpointError(
        f"directory {str(directory)!r} holds several weights files ({names}) and no shard index "
        f"({' or '.join(INDEX_FILES)}) saying how they fit together; push one of them")


def read_checkpoint_dir(directory: Path) -> Checkpoint:
    """The state dict of a checkpoint directory, every shard read as its file type says."""
    shards = weight_files_in(directory)
    state: dict[str, Any] = {}
    devices: set[str] = set()
    formats: set[str] = set()
    metadata: ModuleMetadata = {}
    for shard in shards:
        if not shard.is_file():
            raise CheckpointError(f"shard {shard.name!r} listed in the index of "
                                  f"{str(directory)!r} is missing")
        part = read_checkpoint(shard)
        overlap = state.keys() & part.state_dict.keys()
        if overlap:
            raise CheckpointError(f"tensor {sorted(overlap)[0]!r} is in two shards of "
                                  f"{str(directory)!r}; the checkpoint is inconsistent")
        state.update(part.state_dict)
        devices.update(part.devices)
        formats.add(part.format)
        metadata.update(part.module_metadata)
    return Checkpoint(state, "+".join(sorted(formats)),
                      devices=sorted(devices, key=device_sort_key), shards=len(shards),
                      module_metadata=metadata)


def _index_shards(index: Path) -> list[str]:
    """Shard file names from an index's ``weight_map``, in first-use order, checked to be plain
    names inside the directory (an index is as untrusted as any other input)."""
    if index.stat().st_size > MAX_INDEX_BYTES:
        raise CheckpointError(f"shard index {str(index)!r} is larger than {MAX_INDEX_BYTES} bytes")
    try:
        data = boundedjson.loads(index.read_text())
        weight_map = data["weight_map"]
        names = list(dict.fromkeys(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"shard index {str(index)!r} is not a JSON object with a "
                              "'weight_map' of tensor -> shard file") from None
    for name in names:
        if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
            raise CheckpointError(f"shard index {str(index)!r} names {str(name)[:80]!r}, which is "
                                  "not a file name in its directory")
    if not names:
        raise CheckpointError(f"shard index {str(index)!r} lists no shards")
    return names
