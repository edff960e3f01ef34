"""The float format, and what every push ends with: anything trainable -> NormalizedWeights.

Push normalizes so that pull never has to guess: wrappers (DataParallel, DDP, torch.compile,
FSDP, activation checkpointing) are unwrapped, their key prefixes stripped, tensors detached and
moved to the CPU, tied tensors stored once with their aliases recorded, and anything that cannot
be stored faithfully is refused with the key that holds it. A module in a quantization format
is flattened first by that format (the table gives :func:`normalize` the formats). A float
version's pull steps leave what they are given as it is (:class:`~.common.Steps`).
"""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import NormalizationError
from ..io.checkpoints import read_checkpoint
from ..model.architectures import capture
from ..model.devices import device_sort_key, dtype_name
from ..model.statedict import ModuleMetadata, module_metadata_of
from .base import Flat, Format, NormalizedWeights

# Attributes through which wrappers hold the module they wrap, and how we name the wrapper.
_WRAPPER_ATTRS = (
    ("_orig_mod", "torch.compile"),
    ("_fsdp_wrapped_module", "FullyShardedDataParallel"),
    ("_checkpoint_wrapped_module", "CheckpointWrapper"),
)
# Prefixes that only wrappers produce, so they are stripped wherever they occur in a key.
_ANYWHERE_PREFIXES = {
    "_orig_mod": "torch.compile",
    "_fsdp_wrapped_module": "FullyShardedDataParallel",
    "_checkpoint_wrapped_module": "CheckpointWrapper",
}
_DATA_PARALLEL = "DataParallel/DistributedDataParallel"
# Names only wrappers give a key's parts; one left after normalization is refused, never stored
# (FSDP's flattened parameter holds many tensors in one and cannot be loaded as any of them).
_WRAPPER_PARTS = frozenset({*_ANYWHERE_PREFIXES, "_flat_param", "_fsdp_flat_param"})
_STATISTICS_SUFFIXES = (".running_mean", ".running_var")


def normalize(
    model: nn.Module | Mapping[str, Any] | str | os.PathLike[str],
    *,
    precision: str | None = None,
    keep_in_fp32: Iterable[str] = (),
    record_architecture: bool = True,
    formats: Sequence[Format] = (),
) -> NormalizedWeights:
    """Turn a module, a state dict or a checkpoint path into :class:`NormalizedWeights`.

    ``record_architecture``: record how to rebuild a transformers or timm module (off when the
    caller records a factory of its own). ``formats``: the quantization formats a module may be
    in, each asked once to flatten it (the table's)."""
    wrapping: list[str] = []
    source: dict[str, Any] = {}
    architecture: dict[str, Any] = {}
    declared_fp32 = list(keep_in_fp32)
    sections: dict[str, Any] = {}
    if isinstance(model, nn.Module):
        inner, wrapping = unwrap(model)
        raw, metadata = _module_state_dict(inner)
        # Quantized tensors and modules are stored as their plain components by their format.
        flat = flattened(inner, raw, formats)
        if flat is None:
            _refuse_quantized(inner.named_modules())
        else:
            raw, sections["quantization"] = flat.state, flat.record
        architecture["class"] = f"{type(inner).__module__}:{type(inner).__qualname__}"
        if record_architecture:
            architecture.update(capture(inner, flat.signature if flat else None))
        declared_fp32 += list(getattr(inner, "_keep_in_fp32_modules", None) or [])
        source["input"] = "module"
        params = sum(p.numel() for p in {id(p): p for p in inner.parameters()}.values())
        if flat is not None:
            params = flat.record["float_params"]
    elif isinstance(model, Mapping):
        raw = dict(model)
        _refuse_quantized((k, v) for k, v in raw.items() if "_packed_params" in str(k).split("."))
        metadata = module_metadata_of(model)
        source["input"] = "state_dict"
        params = None
    elif isinstance(model, (str, os.PathLike)):
        checkpoint = read_checkpoint(model)
        raw = checkpoint.state_dict
        metadata = checkpoint.module_metadata
        source["input"] = "checkpoint"
        source["checkpoint"] = {
            "file": os.path.basename(os.path.normpath(os.fspath(model))),
            "format": checkpoint.format,
            **({"shards": checkpoint.shards} if checkpoint.shards > 1 else {}),
            **({"key": checkpoint.nested_key} if checkpoint.nested_key else {}),
        }
        params = None
    else:
        raise NormalizationError(
            f"cannot push a {type(model).__name__}: pass an nn.Module, a dict of name -> tensor, "
            "or the path of a .safetensors/.pt/.pth/.bin/.ckpt file"
        )

    # A module's wrappers were peeled off as objects, so its keys are exact: a leading "module."
    # there is a submodule really called "module", not a DataParallel prefix to guess at.
    guess = not isinstance(model, nn.Module)
    renamed, prefix_wrapping = _strip_wrapper_keys(raw, guess_data_parallel=guess)
    metadata = _strip_metadata(metadata, _leading_module_parts(raw) if guess else 0)
    for name in prefix_wrapping:
        if name not in wrapping and not (name == _DATA_PARALLEL and _is_data_parallel(wrapping)):
            wrapping.append(name)

    tensors: dict[str, torch.Tensor] = {}
    extras: dict[str, Any] = {}
    devices: set[str] = set()
    for key, value in renamed.items():
        if isinstance(value, torch.Tensor):
            _check_storable(key, value)
            devices.add(str(value.device))
            tensors[key] = value
        else:
            extras[key] = _json_value(key, value)
    if source["input"] == "checkpoint":
        # The tensors are on the CPU now; the file says where they were written. A safetensors
        # file does not record devices at all.
        devices = set(checkpoint.devices)

    kept, tied = _dedupe_shared(tensors)
    if params is None:
        params = _guess_params(kept)
    specs: dict[str, dict[str, Any]] = {
        k: {"dtype": dtype_name(t.dtype), "shape": list(t.shape)} for k, t in kept.items()}
    dtypes = Counter(spec["dtype"] for spec in specs.values())
    source.update(
        devices=sorted(devices, key=device_sort_key),
        dtypes=dict(sorted(dtypes.items())),
        wrapping=wrapping,
        precision=precision if precision is not None else _infer_precision(kept, specs),
        keep_in_fp32=sorted(set(declared_fp32)),
        tied=tied,
        params=params,
        size_bytes=sum(t.numel() * t.element_size() for t in kept.values()),
        torch_version=torch.__version__,
        python_version=platform.python_version(),
    )
    return NormalizedWeights(kept, tied, extras, source, architecture, metadata, list(renamed),
                             sections, specs)


def flattened(inner: nn.Module, raw: Mapping[str, Any], formats: Sequence[Format]) -> Flat | None:
    """The one format ``inner`` is in, flattened (None: plain floats); a module that mixes
    formats is refused."""
    found: list[Flat] = []
    for fmt in formats:
        flat = fmt.flatten(inner, raw)
        if flat is not None:
            found.append(flat)
    if len(found) > 1:
        raise NormalizationError(
            f"the module mixes {' and '.join(f.record['library'] for f in found)} quantization; "
            "push one scheme per version")
    return found[0] if found else None


def stored_tensors(module: nn.Module, state: Mapping[str, Any], *,
                   formats: Sequence[Format]) -> dict[str, torch.Tensor]:
    """The tensors a push of ``module`` (its state dict ``state``) stores: flattened by its
    format, normalized (an adapter's base matched by digest)."""
    flat = flattened(module, state, formats)
    return normalize(flat.state if flat is not None else dict(state)).tensors


def unwrap(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """Peel wrappers off ``model``; return the inner module and the wrappers, outermost first."""
    wrapping: list[str] = []
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            wrapping.append(type(model).__name__)
            model = model.module
            continue
        for attr, label in _WRAPPER_ATTRS:
            inner = model._modules.get(attr) if attr != "_orig_mod" else getattr(model, attr, None)
            if isinstance(inner, nn.Module):
                wrapping.append(label)
                model = inner
                break
        else:
            return model, wrapping


def _is_data_parallel(wrapping: list[str]) -> bool:
    return any(w in ("DataParallel", "DistributedDataParallel") for w in wrapping)


def _module_state_dict(module: nn.Module) -> tuple[dict[str, Any], ModuleMetadata]:
    state = module.state_dict()
    metadata = module_metadata_of(state)
    # DataParallel/DDP nested inside the model add a "module." component at their own path.
    for path, sub in module.named_modules():
        if path and isinstance(sub, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            inner_prefix, outer_prefix = f"{path}.module.", f"{path}."
            state = {
                (outer_prefix + k[len(inner_prefix):] if k.startswith(inner_prefix) else k): v
                for k, v in state.items()
            }
            metadata = rename_prefixes(metadata, _nested_rename(inner_prefix, outer_prefix))
    return dict(state), metadata


def _nested_rename(inner: str, outer: str) -> Callable[[str], str]:
    def rename(prefix: str) -> str:
        if (prefix + ".").startswith(inner):
            return (outer + prefix[len(inner):]).rstrip(".")
        return prefix

    return rename


def rename_prefixes(metadata: Mapping[str, dict[str, int]],
                    rename: Callable[[str], str | None]) -> ModuleMetadata:
    """``metadata`` with each prefix renamed (``None`` drops it). Entries come parents first,
    so when a wrapper's own entry and its inner module's become one prefix, the inner one,
    which comes later, is kept: it describes the module the weights load into."""
    out: ModuleMetadata = {}
    for prefix, entry in metadata.items():
        new = rename(prefix)
        if new is not None:
            out[new] = dict(entry)
    return out


def _leading_module_parts(raw: Mapping[str, Any]) -> int:
    """How many leading ``module.`` components every tensor key of a bare state dict has once
    the other wrappers' parts are dropped (DataParallel/DDP prefixes, possibly repeated, in any
    order with ``_orig_mod.`` and the rest: ``_orig_mod.module.conv1.weight`` has one)."""
    tensor_keys = [_without_anywhere_parts(k) for k, v in raw.items()
                   if isinstance(k, str) and isinstance(v, torch.Tensor)]
    leading = 0
    while tensor_keys and all(
        k.split(".")[leading] == "module" and k.count(".") > leading for k in tensor_keys
    ):
        leading += 1
    return leading


def _without_anywhere_parts(key: str) -> str:
    parts = key.split(".")
    return ".".join([p for p in parts[:-1] if p not in _ANYWHERE_PREFIXES] + parts[-1:])


def _strip_metadata(metadata: ModuleMetadata, leading: int) -> ModuleMetadata:
    """Module prefixes renamed as their keys are: wrapper components and then ``leading``
    DataParallel components stripped. A wrapper's own entry gives way to its inner module's."""

    def rename(prefix: str) -> str | None:
        parts = [p for p in (prefix.split(".") if prefix else []) if p not in _ANYWHERE_PREFIXES]
        if len(parts) < leading:
            return None  # the DataParallel wrapper itself
        return ".".join(parts[leading:])

    return rename_prefixes(metadata, rename)


def _strip_wrapper_keys(
    raw: Mapping[str, Any], *, guess_data_parallel: bool,
) -> tuple[dict[str, Any], list[str]]:
    """Strip wrapper prefixes from every key; refuse two keys that become one."""
    for key in raw:
        if not isinstance(key, str):
            raise NormalizationError(f"state dict key {key!r} is not a string")
    leading = _leading_module_parts(raw) if guess_data_parallel else 0
    seen_order: list[str] = []
    renamed: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in raw.items():
        parts = key.split(".")
        labels = []  # the wrappers, outermost first, as their parts come in the key
        kept_parts = []
        dropped_modules = leading if isinstance(value, torch.Tensor) else 0
        for part in parts[:-1]:
            if part in _ANYWHERE_PREFIXES:
                labels.append(_ANYWHERE_PREFIXES[part])
            elif dropped_modules:
                dropped_modules -= 1
                labels.append(_DATA_PARALLEL)
            else:
                kept_parts.append(part)
        new_key = ".".join(kept_parts + parts[-1:])
        _refuse_wrapper_parts(key, new_key)
        if new_key in renamed:
            raise NormalizationError(
                f"keys {origin[new_key]!r} and {key!r} both become {new_key!r} once wrapper "
                "prefixes are stripped; remove one of them before pushing"
            )
        renamed[new_key] = value
        origin[new_key] = key
        for label in labels:
            if label not in seen_order:
                seen_order.append(label)
    return renamed, seen_order


def _refuse_wrapper_parts(key: str, new_key: str) -> None:
    """A key that still names a wrapper once prefixes are stripped is refused, never stored:
    pull could not load it into the unwrapped model."""
    left = [p for p in new_key.split(".") if p in _WRAPPER_PARTS]
    if left:
        raise NormalizationError(
            f"key {key!r} still carries the wrapper part {left[0]!r} once wrapper prefixes are "
            "stripped (as " + repr(new_key) + "), so it cannot be loaded into the unwrapped "
            "model; save the full state dict of the unwrapped model (for FSDP: "
            "torch.distributed.checkpoint.state_dict.get_model_state_dict, or "
            "StateDictType.FULL_STATE_DICT) and push that")


def _refuse_quantized(parts: Iterable[tuple[str, object]]) -> None:
    """Refuse a quantized module (``quantize_dynamic``, ``convert``) or its state dict before its
    first packed entry is refused as an odd value."""
    for path, part in parts:
        where = type(part).__module__
        if isinstance(part, nn.Module) and ".quantized" in where and where.startswith("torch."):
            what = f"module {path or '(the model)'!r} is a quantized {type(part).__name__}"
        elif "_packed_params" in path:
            what = f"entry {path!r} holds packed quantized parameters"
        else:
            continue
        raise NormalizationError(
            f"{what}: quantized modules are not stored yet. Push the float model (the one "
            "before torch.ao.quantization.quantize_dynamic), and quantize after pulling: "
            "quantize_dynamic(registry.pull(ref), {nn.Linear}, dtype=torch.qint8)")


def _check_storable(key: str, tensor: torch.Tensor) -> None:
    if tensor.is_sparse or tensor.layout != torch.strided:
        raise NormalizationError(
            f"tensor {key!r} is sparse ({tensor.layout}); call .to_dense() on it before pushing"
        )
    if tensor.is_quantized:
        raise NormalizationError(
            f"tensor {key!r} is quantized ({tensor.dtype}); push the float model and quantize "
            "after pulling"
        )
    if type(tensor).__module__.startswith("torchao."):
        raise NormalizationError(
            f"tensor {key!r} is a torchao {type(tensor).__name__} in a bare state dict; push "
            "the quantized module itself, whose scheme is then recorded "
            "(registry/formats/torchao.py)")
    if tensor.is_meta:
        raise NormalizationError(
            f"tensor {key!r} is on the meta device and has no data; load real weights before "
            "pushing"
        )
    if getattr(tensor, "is_nested", False):
        raise NormalizationError(f"tensor {key!r} is a nested tensor, which cannot be stored")


def _json_value(key: str, value: Any) -> Any:
    if isinstance(value, (nn.Module, torch.Tensor)) or _contains_tensor(value):
        raise NormalizationError(
            f"entry {key!r} holds tensors inside a {type(value).__name__}; a state dict must map "
            "names to tensors (flatten it, or push the weights dict on its own)"
        )
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise NormalizationError(
            f"entry {key!r} is a {type(value).__name__}, which is neither a tensor nor JSON "
            f"({exc}); remove it or convert it to numbers/strings/lists/dicts"
        ) from None
    return json.loads(text)


def _contains_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_contains_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains_tensor(v) for v in value)
    return False


def _dedupe_shared(
    tensors: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store each distinct tensor once; identical views become aliases, overlaps become copies."""
    by_view: dict[tuple[Any, ...], str] = {}
    storages: dict[tuple[str, int], int] = {}
    for t in tensors.values():
        if t.numel():
            sk = (str(t.device), t.untyped_storage().data_ptr())
            storages[sk] = storages.get(sk, 0) + 1
    kept: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    for key, t in tensors.items():
        if t.numel():
            view = (str(t.device), t.untyped_storage().data_ptr(), t.storage_offset(),
                    tuple(t.shape), t.stride(), t.dtype)
            if view in by_view:
                tied[key] = by_view[view]
                storages[(view[0], view[1])] -= 1
                continue
            by_view[view] = key
        kept[key] = t
    out: dict[str, torch.Tensor] = {}
    for key, t in kept.items():
        t = t.detach()
        shared = t.numel() and storages[(str(t.device), t.untyped_storage().data_ptr())] > 1
        if t.device.type != "cpu":
            t = t.to("cpu")
        elif shared:
            # Another stored tensor overlaps this storage: give this one bytes of its own.
            t = t.clone()
        out[key] = t.contiguous()
    return out, tied


def _guess_params(tensors: Mapping[str, torch.Tensor]) -> int:
    """Parameter count of a bare state dict: floating tensors minus BatchNorm statistics, which
    are the buffers that commonly sit beside parameters (a module input counts exactly)."""
    return sum(
        t.numel() for key, t in tensors.items()
        if t.is_floating_point() and not key.endswith(_STATISTICS_SUFFIXES)
    )


def _infer_precision(tensors: Mapping[str, torch.Tensor],
                     specs: Mapping[str, dict[str, Any]]) -> str:
    floats = {specs[k]["dtype"] for k, t in tensors.items() if t.is_floating_point()}
    if not floats:
        return "float32"
    if len(floats) == 1:
        return floats.pop()
    return "mixed"
