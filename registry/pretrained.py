"""A ``from_pretrained`` directory from a stored version.

:func:`write_pretrained` writes what ``transformers`` loads, the files
:func:`registry.pretrained_files.listing` lists (the one list the signature and the Hub door
use too): ``config.json`` from the config the
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

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from . import attachments
from .errors import ArchitectureUnknownError
from .files import VersionFile
from .formats import table as formats
from .io import safewrite
from .io.weights import load_shard, write_safetensors
from .model import devices as dev
from .model.devices import dtype_name
from .pretrained_files import listing, written_dtype

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
    """Write the from_pretrained directory of a (checked) manifest into ``dest_dir``: the
    files :func:`registry.pretrained_files.listing` lists. Each shard is copied or cast from
    the very file ``open_blob`` verified (``Backend.open_blob``), never from its path opened
    again. ``weights``: tensors to write instead of the stored ones, by stored key, in the same
    shards and dtypes (an adapter merged into this base)."""
    if "adapter" in manifest:  # a PEFT adapter directory (formats/lora.py)
        return formats.adapter(manifest, origin).write_pretrained(manifest, open_blob, dest_dir,
                                                                  dtype)
    config = transformers_config(manifest, origin)
    requested = dev.parse_dtype(dtype)
    # A quantized version: its quantization_config, and the components with torchao's metadata.
    quant_config, file_metadata = formats.lookup(manifest, origin).pretrained(requested)
    if quant_config is not None:
        config["quantization_config"] = quant_config
    files = listing(manifest, dtype=None if requested is None else dtype_name(requested),
                    config=config)
    attached = {f.name for f in files if f.blob is not None and f.blob.role == "file"}
    names = {f.name for f in files if f.blob is not None and f.blob.role == "weights"}

    root = attachments.pull_files(manifest, open_blob, dest_dir,
                                  skip=lambda n: n not in attached)
    for stale in root.iterdir():
        if _STALE.fullmatch(stale.name) and stale.name not in names and stale.is_file():
            stale.unlink()

    specs = manifest["tensors"]

    def dtype_of(key: str, stored: torch.dtype) -> torch.dtype:
        name = written_dtype(manifest, key, None if requested is None else dtype_name(requested))
        return stored if name == dtype_name(stored) else getattr(torch, name)

    for shard in (f.blob for f in files if f.blob is not None and f.blob.role == "weights"):
        if weights is None:
            _write_shard(root / shard.name, shard, open_blob, specs, dtype_of, requested, origin,
                         file_metadata)
            continue
        with safewrite.replacing(root / shard.name) as fh:
            write_safetensors({k: weights[k].detach().to(
                "cpu", dtype_of(k, getattr(torch, specs[k]["dtype"]))).contiguous()
                for k in shard.tensors}, fh, file_metadata)
    for f in files:  # the configs last, as transformers' save_pretrained
        if f.data is not None:
            attachments.write_bytes(root / f.name, f.data)
    return root


def write_shards(manifest: Mapping[str, Any], open_blob: Callable[[str, int], BinaryIO],
                 dest_dir: str | os.PathLike[str], dtype: dev.DtypeRequest, origin: str) -> Path:
    """Write only the shards of a float version, under their Hugging Face names, their floats
    cast to ``dtype``: the weights of a version that records no transformers config."""
    requested = dev.parse_dtype(dtype)
    named = None if requested is None else dtype_name(requested)
    root = safewrite.folder(Path(dest_dir))

    def dtype_of(key: str, stored: torch.dtype) -> torch.dtype:
        name = written_dtype(manifest, key, named)
        return stored if name == dtype_name(stored) else getattr(torch, name)

    for f in listing(manifest, dtype=named):
        if f.blob is not None and f.blob.role == "weights":
            _write_shard(root / f.name, f.blob, open_blob, manifest["tensors"], dtype_of,
                         requested, origin)
    return root


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
