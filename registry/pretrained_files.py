"""The files of a version's ``from_pretrained`` directory, listed from its manifest alone.

:func:`listing` is the one list of what :func:`registry.pretrained.write_pretrained` writes
(``save_pretrained``, ``registry pull --format hf``), what a signature over that directory
covers (:func:`planned_files`) and what the Hub door serves (:mod:`registry.doors.hf`):

- ``blob`` files are a stored blob as it is: the safetensors shards under Hugging Face's names
  (``model.safetensors``, or ``model-0000K-of-0000N.safetensors``) and the attached files;
- ``data`` files are written from what the version recorded: ``config.json`` (its ``dtype`` set
  to the dtype the weights are written in), ``model.safetensors.index.json`` when there are
  several shards, ``generation_config.json``;
- ``README.md``: the version's model card (:mod:`registry.provenance.card`), unless it
  attached its own;
- with a ``dtype``, shards are ``cast``: their floating tensors are written in that dtype (keep
  in fp32 prefixes stay float32), so their bytes are known only once written.

No torch here: the server lists and serves a version without loading it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .files import VersionFile, attached_files, is_weights_name, weight_files
from .provenance import card
from .signing.oms import IGNORED_PATHS

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
# Bytes per element of each dtype a version may store, and which of them are floating (what
# torch's ``is_floating_point`` says: complex is not).
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
            "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "float8_e4m3fn": 1,
            "float8_e5m2": 1}
FLOATING = frozenset({"float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
                      "float8_e5m2"})


@dataclass(frozen=True)
class PretrainedFile:
    """One file of a ``from_pretrained`` directory: a stored ``blob`` (``cast`` when its floats
    are written in another dtype), or ``data`` written from the manifest. ``sha256`` (hex) and
    ``size`` are None only for a cast shard."""

    name: str
    blob: VersionFile | None = None
    data: bytes | None = None
    cast: bool = False

    @property
    def sha256(self) -> str | None:
        if self.data is not None:
            return hashlib.sha256(self.data).hexdigest()
        assert self.blob is not None
        return None if self.cast else self.blob.digest[7:]

    @property
    def size(self) -> int | None:
        if self.data is not None:
            return len(self.data)
        assert self.blob is not None
        return None if self.cast else self.blob.size


def is_transformers(manifest: Mapping[str, Any]) -> bool:
    """Whether the version recorded a transformers config (what ``from_pretrained`` needs)."""
    arch = manifest.get("architecture") or {}
    return arch.get("kind") == "transformers" and isinstance(arch.get("config"), dict)


def written_dtype(manifest: Mapping[str, Any], key: str, dtype: str | None) -> str:
    """The dtype tensor ``key`` is written in: as stored without ``dtype`` or when it is not
    floating, float32 under a keep-in-fp32 prefix, else ``dtype``."""
    stored = str(manifest["tensors"][key]["dtype"])
    if dtype is None or stored not in FLOATING:
        return stored
    keep = [f".{p}." for p in manifest["source"].get("keep_in_fp32", [])]
    return "float32" if any(p in f".{key}" for p in keep) else dtype


def listing(manifest: Mapping[str, Any], *, dtype: str | None = None,
            config: Mapping[str, Any] | None = None) -> list[PretrainedFile]:
    """Every file of the version's ``from_pretrained`` directory, in name order: its shards,
    the files generated from ``config`` (default: the recorded transformers config; none for
    a version without one, which lists its shards and attached files) and its attached files
    (an attached file of a generated name, or a weights file, is left out). ``dtype`` (a
    floating dtype name) lists the shards cast."""
    arch = manifest.get("architecture") or {}
    if config is None and is_transformers(manifest):
        config = arch["config"]
    shards = weight_files(manifest)
    out = {s.name: PretrainedFile(s.name, blob=s, cast=dtype is not None) for s in shards}
    if config is not None:
        for name, data in _generated(manifest, dict(config), dtype).items():
            out[name] = PretrainedFile(name, data=data)
    for f in attached_files(manifest):
        if f.name not in out and not is_weights_name(f.name):
            out[f.name] = PretrainedFile(f.name, blob=f)
    # The model card, unless the version attached its own. Only for versions that record
    # their lineage (every push since cards exist): a signature made before them covers a
    # directory without README.md, and must keep verifying.
    if card.README_NAME not in out and "lineage" in (manifest.get("source") or {}):
        out[card.README_NAME] = PretrainedFile(card.README_NAME,
                                               data=card.render(manifest).encode())
    return [out[name] for name in sorted(out)]


def planned_files(manifest: Mapping[str, Any]) -> dict[str, str] | None:
    """name -> sha256 hex of every file ``write_pretrained`` writes with ``dtype="auto"``,
    computed from the manifest alone; None for a version that records no transformers config,
    or whose directory is rewritten (quantized with torchao's metadata, a PEFT adapter). A
    signature over these is the ``model.sig`` of that directory."""
    if not is_transformers(manifest) or "quantization" in manifest or "adapter" in manifest:
        return None
    return {f.name: str(f.sha256) for f in listing(manifest) if f.name not in IGNORED_PATHS}


def _generated(manifest: Mapping[str, Any], config: dict[str, Any],
               dtype: str | None) -> dict[str, bytes]:
    """The files written from what the version recorded: its config, the shard index, its
    generation config."""
    arch = manifest["architecture"]
    specs = manifest["tensors"]
    shards = weight_files(manifest)
    out: dict[str, bytes] = {}
    recorded_class = str(arch.get("class", ""))
    if not config.get("architectures") and recorded_class.startswith("transformers:"):
        # As transformers' save_pretrained does for a model built from a bare config.
        config["architectures"] = [recorded_class.removeprefix("transformers:")]
    written = {k: written_dtype(manifest, k, dtype) for k in specs}
    floating = Counter(d for d in written.values() if d in FLOATING)
    if floating:
        label = floating.most_common(1)[0][0]
        config["dtype"] = label
        if "torch_dtype" in config:
            config["torch_dtype"] = label
    if len(shards) > 1:
        total = sum(_numel(specs[k]["shape"]) * ITEMSIZE[written[k]] for k in specs)
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: s.name for s in shards for k in sorted(s.tensors)}}
        out[INDEX_NAME] = _json(index)
    out[CONFIG_NAME] = _json(config)
    generation = arch.get("generation_config")
    if isinstance(generation, dict):
        out[GENERATION_CONFIG_NAME] = _json(generation)
    return out


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _json(data: object) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
