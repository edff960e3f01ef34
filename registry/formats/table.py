"""The formats table: which module stores and rebuilds each recorded format. The only module
that imports a format module (``tests/unit/test_structure.py`` holds it to that).

Push hands a model to :func:`flatten` once: it is unwrapped and flattened by the one format it
is in (``floats.py`` for plain floating weights; a PEFT model's adapter by ``lora.py``, over its
base version) into plain tensors plus the manifest's record. Pull hands a version to
:func:`pull` once: the manifest's ``quantization`` record, checked, goes to its format, which
decides the version's :class:`~registry.formats.base.Steps`, has the pipeline read by them and
rebuilds what was read, in one visit; an adapter version goes to :func:`pull_adapter`. A new
quantization format is one module beside these (its ``LIBRARY``, ``METHODS``, ``flatten``,
``check``, ``steps``, ``pull``: :class:`~.base.Format`) and one line in :data:`FORMATS`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import QuantizationError, quoted
from ..refs import Ref
from . import ctensors, dynamic, floats, lora, torchao
from .base import Bases, Format, NormalizedWeights, Read, ReadBy, Runs, Steps
from .common import check_counts

# A recorded ``quantization["library"]`` -> the module that stores and rebuilds it.
FORMATS: dict[str, Format] = {
    torchao.LIBRARY: torchao,
    dynamic.LIBRARY: dynamic,
    ctensors.LIBRARY: ctensors,
}

# (library, method) -> where it runs, for every method of every format.
METHODS: dict[tuple[str, str], Runs] = {
    (library, method): runs for library, fmt in FORMATS.items()
    for method, runs in fmt.METHODS.items()}

def flatten(model: nn.Module | Mapping[str, Any] | str | os.PathLike[str], *,
            precision: str | None = None, keep_in_fp32: Iterable[str] = (),
            record_architecture: bool = True, bases: Bases | None = None) -> NormalizedWeights:
    """Push's one call into the formats: ``model`` (a module, a state dict or a checkpoint
    path) unwrapped, flattened by the format it is in and normalized, with the manifest's
    section of its format (``sections``). A PEFT model stores its adapter alone, over the base
    version ``bases`` finds (``name``: its default name, the base's with ``-lora``)."""
    quantized = tuple(FORMATS.values())
    adapter = lora.flatten(model, bases or Bases(), functools.partial(floats.stored_tensors,
                                                           formats=quantized))
    weights = floats.normalize(model if adapter is None else adapter.tensors,
                               precision=precision, keep_in_fp32=keep_in_fp32,
                               record_architecture=record_architecture, formats=quantized)
    if adapter is not None:
        weights.sections["adapter"] = adapter.record
        weights.name = f"{adapter.base_name}-lora"
    return weights


def check(record: object) -> str | None:
    """Why a manifest's ``quantization`` record is malformed or unknown, or None."""
    if not isinstance(record, dict):
        return f"is {quoted(record)}, not an object"
    key = (record.get("library"), record.get("method"))
    if key not in METHODS:
        known = ", ".join(f"{lib} {m}" for lib, m in METHODS)
        return (f"names {quoted(key[0], 60)} {quoted(key[1], 60)}, which is not a scheme this "
                f"registry loads ({known})")
    return check_counts(record) or FORMATS[record["library"]].check(record)


def pull(manifest: Mapping[str, Any], origin: str, dequantize: torch.dtype | None,
         read: ReadBy) -> Read:
    """Pull's one call into the formats: the version's format decides its steps, ``read`` (the
    pipeline's build, placement and read) runs by them, and the format rebuilds what was read
    (dequantized to ``dequantize`` where it names a dtype). A float version's steps are the
    empty ones and what was read is its state. Raises as :func:`lookup` does, before ``read``."""
    record = manifest.get("quantization")
    if record is None:
        return read(Steps(origin))
    return _checked(record, origin).pull(record, manifest, origin, dequantize, read)


def lookup(manifest: Mapping[str, Any], origin: str) -> Steps:
    """The steps of the version's format (a float version's are empty), where nothing is read
    through them (``save_pretrained``'s ``quantization_config``). QuantizationError for a
    library or method this registry does not know, and for a record that disagrees with its
    stored tensors or names anything outside its library's allow list (nothing is imported for
    it)."""
    record = manifest.get("quantization")
    if record is None:
        return Steps(origin)
    return _checked(record, origin).steps(record, manifest, origin)


def _checked(record: Any, origin: str) -> Format:
    """The format of a ``quantization`` record, once :func:`check` passed it."""
    if problem := check(record):
        raise QuantizationError(f"{origin}: its quantization record {problem}; it was not used")
    return FORMATS[record["library"]]


def pull_adapter(manifest: Mapping[str, Any], origin: str, resolve: Callable[[Ref], Any],
                 pull_base: Callable[[Any], nn.Module],
                 read: Callable[[torch.device], dict[str, torch.Tensor]], *, merge: bool,
                 floats: bool = False, pulled_as: Hashable | None = None) -> nn.Module:
    """Pull's one call into the adapter format: the version checked (as :func:`adapter`), its
    base pulled by ``pull_base``, its tensors read by ``read`` and attached (``lora.py``)."""
    return lora.pull(manifest, origin, resolve, pull_base, read, merge=merge, floats=floats,
                     pulled_as=pulled_as)


def adapter(manifest: Mapping[str, Any], origin: str) -> lora.Adapter:
    """Pull's look-up of an adapter version: its ``adapter`` record checked against its stored
    tensors (AdapterError for one this registry does not load), its base, and how it attaches."""
    return lora.checked(manifest, origin)

