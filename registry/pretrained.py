"""A ``from_pretrained`` directory from a stored version.

:func:`write_pretrained` writes what ``transformers`` loads: ``config.json`` from the config the
version recorded (its ``dtype`` set to what the weights are written in), ``model.safetensors`` or,
when the version has several shards, the same shards under Hugging Face's names plus
``model.safetensors.index.json``, and every attached file (the tokenizer, the model card). The
recorded config wins over an attached ``config.json``, and the recorded generation config over an
attached ``generation_config.json``.

Tied weights are written once, under the name the version stored (the first in state-dict order,
which is the name transformers keeps: ``transformer.wte.weight``, not ``lm_head.weight``); the
aliases are left out as transformers' own ``save_pretrained`` leaves them out, and re-tied by the
model's config on load. With ``dtype="auto"`` each shard is the verified stored blob copied byte
for byte; another dtype casts floating tensors (keep-in-fp32 prefixes stay float32). Writing
into a folder that already holds ``model*.safetensors`` files replaces them, so an old
``model.safetensors`` is never loaded instead of new shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from . import adapters, attachments, quantized, safewrite
from . import devices as dev
from .errors import ArchitectureUnknownError, QuantizationError
from .files import VersionFile, attached_files, weight_files
from .schemes import COMPRESSED_TENSORS, TORCHAO, Checked
from .signing.oms import IGNORED_PATHS
from .weights import load_shard, write_safetensors

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
# safetensors weights a previous write may have left: transformers loads a ``model.safetensors``
# before an index, so one left beside new shards would be loaded instead of them. Other files
# (a ``pytorch_model.bin``, which transformers reads only without safetensors) are left alone.
_STALE = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json")


def transformers_config(manifest: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """The transformers config a version recorded; ArchitectureUnknownError when it has none."""
    arch = manifest.get("architecture") or {}
    config = arch.get("config") if arch.get("kind") == "transformers" else None
    if not isinstance(config, dict):
        what = arch.get("factory") or arch.get("class")
        pushed = f" (it was pushed from {what})" if what else ""
        raise ArchitectureUnknownError(
            f"{origin} records no transformers config{pushed}, so it cannot be written as a "
            "from_pretrained directory: push a transformers model or a save_pretrained "
            "directory for that, or use pull_state_dict() / `registry pull REF -o "
            "FILE.safetensors` for the weights alone")
    return dict(config)


def write_pretrained(manifest: Mapping[str, Any], open_blob: Callable[[str, int], BinaryIO],
                     dest_dir: str | os.PathLike[str], dtype: dev.DtypeRequest,
                     origin: str, *, weights: Mapping[str, torch.Tensor] | None = None) -> Path:
    """Write the from_pretrained directory of a (checked) manifest into ``dest_dir``. Each
    shard is copied or cast from the very file ``open_blob`` verified (``Backend.open_blob``),
    never from its path opened again. ``weights``: tensors to write instead of the stored ones,
    by stored key, in the same shards and dtypes (an adapter merged into this base)."""
    if "adapter" in manifest:  # a PEFT adapter directory (adapters.py)
        return adapters.write_pretrained(manifest, open_blob, dest_dir, dtype, origin)
    config = transformers_config(manifest, origin)
    requested = dev.parse_dtype(dtype)
    # A quantized version: its quantization_config, and the components with torchao's metadata.
    quant_config, file_metadata = _quantized_parts(manifest, requested, origin)
    arch = manifest["architecture"]
    shards = weight_files(manifest)
    names = [f.name for f in shards]
    ours = {CONFIG_NAME, INDEX_NAME, *names}
    generation = arch.get("generation_config")
    if isinstance(generation, dict):
        ours.add(GENERATION_CONFIG_NAME)

    root = attachments.pull_files(manifest, open_blob, dest_dir,
                                  skip=lambda n: n in ours or attachments.is_weights_name(n))
    for stale in root.iterdir():
        if _STALE.fullmatch(stale.name) and stale.name not in names and stale.is_file():
            stale.unlink()

    specs = manifest["tensors"]
    keep = [f".{p}." for p in manifest["source"].get("keep_in_fp32", [])]

    def dtype_of(key: str, stored: torch.dtype) -> torch.dtype:
        if requested is None or not stored.is_floating_point:
            return stored
        return torch.float32 if any(p in f".{key}" for p in keep) else requested

    for shard in shards:
        if weights is None:
            _write_shard(root / shard.name, shard, open_blob, specs, dtype_of, requested, origin,
                         file_metadata)
            continue
        with safewrite.replacing(root / shard.name) as fh:
            write_safetensors({k: weights[k].detach().to(
                "cpu", dtype_of(k, getattr(torch, specs[k]["dtype"]))).contiguous()
                for k in shard.tensors}, fh, file_metadata)
    if quant_config is not None:
        config["quantization_config"] = quant_config
    for name, data in _generated(manifest, config, dtype_of).items():
        attachments.write_bytes(root / name, data)
    return root


def _generated(manifest: Mapping[str, Any], config: dict[str, Any],
               dtype_of: Callable[[str, torch.dtype], torch.dtype]) -> dict[str, bytes]:
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
    written = {k: dtype_of(k, getattr(torch, s["dtype"])) for k, s in specs.items()}
    floating = Counter(str(d).removeprefix("torch.") for d in written.values()
                       if d.is_floating_point)
    if floating:
        label = floating.most_common(1)[0][0]
        config["dtype"] = label
        if "torch_dtype" in config:
            config["torch_dtype"] = label
    if len(shards) > 1:
        total = sum(_numel(specs[k]["shape"]) * written[k].itemsize for k in specs)
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: s.name for s in shards for k in sorted(s.tensors)}}
        out[INDEX_NAME] = _json(index)
    out[CONFIG_NAME] = _json(config)
    generation = arch.get("generation_config")
    if isinstance(generation, dict):
        out[GENERATION_CONFIG_NAME] = _json(generation)
    return out


def planned_files(manifest: Mapping[str, Any]) -> dict[str, str] | None:
    """name -> sha256 hex of every file :func:`write_pretrained` writes with ``dtype="auto"``
    (stored shards, generated configs, attached files), computed from the manifest alone; None
    for a version that records no transformers config. A signature over these is the
    ``model.sig`` of that directory."""
    arch = manifest.get("architecture") or {}
    if arch.get("kind") != "transformers" or not isinstance(arch.get("config"), dict):
        return None
    if "quantization" in manifest or "adapter" in manifest:
        return None  # their directories are rewritten (torchao metadata) or PEFT's own layout
    shards = weight_files(manifest)
    out = {f.name: f.digest[7:] for f in shards}
    generated = _generated(manifest, dict(arch["config"]), lambda _k, stored: stored)
    out.update({name: hashlib.sha256(data).hexdigest() for name, data in generated.items()})
    for f in attached_files(manifest):
        if f.name not in out and not attachments.is_weights_name(f.name) \
                and f.name not in IGNORED_PATHS:
            out[f.name] = f.digest[7:]
    return out


def _quantized_parts(manifest: Mapping[str, Any], requested: torch.dtype | None,
                     origin: str) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
    """The ``quantization_config`` and safetensors metadata a ``from_pretrained`` directory of
    a quantized version needs ((None, None) for a float version): transformers' torchao loader
    rebuilds the tensors from the metadata torchao's flatten wrote; compressed-tensors' packed
    components are the checkpoint's own tensors, written as stored."""
    scheme = quantized.scheme_of(manifest, origin)
    if not isinstance(scheme, Checked):
        return None, None
    record = scheme.record
    hf = record.get("hf_quantization_config")
    if record["library"] == COMPRESSED_TENSORS:  # its components are the checkpoint's own
        hf = record["config"]
    elif record["library"] != TORCHAO or hf is None:
        raise QuantizationError(
            f"{origin} is quantized with {scheme.name} without a transformers "
            "quantization_config, so transformers could not load it quantized; pull it with "
            "registry.pull(), or push a model loaded with quantization_config=TorchAoConfig(...)")
    if requested is not None:
        raise QuantizationError(f"{origin} is quantized: a from_pretrained directory keeps its "
                                "stored components; pass dtype='auto'")
    if record["library"] == COMPRESSED_TENSORS:
        return dict(hf), None
    names = record["tensor_names"]
    metadata = {"tensor_names": json.dumps(names),
                **{n: json.dumps(record["config"].get(n, {"_type": "Tensor"})) for n in names}}
    return dict(hf), metadata


def _write_shard(target: Path, shard: VersionFile, open_blob: Callable[[str, int], BinaryIO],
                 specs: Mapping[str, Any], dtype_of: Callable[[str, torch.dtype], torch.dtype],
                 requested: torch.dtype | None, origin: str,
                 metadata: Mapping[str, str] | None = None) -> None:
    with open_blob(shard.digest, shard.size) as source:
        if requested is None and metadata is None:  # the stored shard is what transformers reads
            safewrite.copy_open(target, source)
            return
        tensors = load_shard(source, {k: specs[k] for k in shard.tensors},
                             lambda _k: torch.device("cpu"),
                             lambda k, stored, _d: dtype_of(k, stored), origin=origin)
    with safewrite.replacing(target) as fh:
        write_safetensors({k: t.contiguous() for k, t in tensors.items()}, fh, metadata)


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _json(data: object) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
