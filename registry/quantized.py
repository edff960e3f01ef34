"""Quantized weights as plain tensors plus the record that rebuilds them, and where they run.

Two families are stored, each through what its library provides:

- **torchao** tensor subclasses (``quantize_(m, Int8WeightOnlyConfig())``, float8, int4, and
  intx: int1..int8 weights unpacked one per int8, torchao's int4 for the CPU):
  torchao's own ``flatten_tensor_state_dict`` splits each into plain component tensors
  (``0._weight_qdata``, ``0._weight_scale``...) and a JSON description, and
  ``unflatten_tensor_state_dict`` puts them back. A manifest's description is untrusted: every
  ``_type`` in it must be on torchao's own allow list, and every ``torch.dtype`` a dtype, before
  torchao sees it.
- **torch.ao** ``quantize_dynamic`` Linear modules (qint8): each packed weight is stored as its
  int8 values, scales and zero points; pull swaps the same dynamic modules into the float model
  and packs them again.

A version's ``quantization`` record names the library and its version, the method, the config
of each quantized tensor, the group sizes, the float parameter count, the stored bytes and the
devices the method runs on. Which devices run a method is :mod:`registry.schemes`' table, never
the manifest's claim: the device check and ``device_map`` planning here consume it beside
:mod:`registry.devices`' facts about the machine.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import ctensors
from .errors import NormalizationError, QuantizationError, quoted
from .schemes import (
    COMPRESSED_TENSORS,
    DYNAMIC_QINT8,
    METHODS,
    PACK_QUANTIZED,
    TORCH_AO,
    TORCHAO,
    TORCHAO_METHODS,
    Checked,
    Plain,
    activations_quantized,
    check,
)

log = logging.getLogger(__name__)


# -- push: a quantized module -> plain tensors + record ------------------------------------------

@dataclass
class Flattened:
    """What push stores for a quantized module: plain tensors (and non-tensor entries) under
    their stored keys, and the manifest's ``quantization`` record."""

    state: dict[str, Any]
    record: dict[str, Any]
    # The float model's keys and shapes, where they are not the quantized module's own.
    signature: dict[str, tuple[int, ...]] | None = None


def flatten(module: nn.Module, state: Mapping[str, Any]) -> Flattened | None:
    """The stored form of ``module`` (whose state dict is ``state``) when it is quantized, else
    None. A quantized kind we cannot store faithfully is refused."""
    dynamic = [(p, m) for p, m in module.named_modules() if _is_dynamic_linear(m)]
    subclasses = {k: v for k, v in state.items()
                  if isinstance(v, torch.Tensor) and type(v) is not torch.Tensor
                  and type(v).__module__.startswith("torchao.")}
    packed = ctensors.packed_modules(module)
    if sum(map(bool, (dynamic, subclasses, packed))) > 1:
        raise NormalizationError("the module mixes torchao, torch.ao or compressed-tensors "
                                 "quantization; push one scheme per version")
    if packed:
        out, fields = ctensors.flatten(module, state, packed)
        plain = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        record = _record(COMPRESSED_TENSORS, "", PACK_QUANTIZED, module, plain, ())
        return Flattened(out, {**record, **fields}, ctensors.signature(out, fields["modules"]))
    if subclasses:
        return _flatten_torchao(module, state, subclasses)
    if dynamic:
        return _flatten_dynamic(module, state, dynamic)
    return None


def _float_params(module: nn.Module) -> int:
    total = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
    for _, sub in module.named_modules():
        if _is_dynamic_linear(sub):
            weight, bias = sub._packed_params._weight_bias()
            total += weight.numel() + (bias.numel() if bias is not None else 0)
    return total


def _flatten_torchao(module: nn.Module, state: Mapping[str, Any],
                     subclasses: Mapping[str, torch.Tensor]) -> Flattened:
    import torchao
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

    methods: set[str] = set()
    group_sizes: set[int] = set()
    widths: set[str] = set()
    for key, t in subclasses.items():
        kind = type(t).__name__
        method = TORCHAO_METHODS.get((kind, activations_quantized(t)))
        if method is None:
            raise QuantizationError(
                f"tensor {key!r} is a torchao {kind}, which this registry does not store yet; "
                f"supported: {', '.join(sorted({m for (_k, _a), m in TORCHAO_METHODS.items()}))}")
        methods.add(method)
        block = getattr(t, "block_size", None)
        if block:
            group_sizes.add(int(list(block)[-1]))
        width = getattr(t, "target_dtype", None)
        if isinstance(width, torch.dtype):  # intx: int1..int8
            widths.add(dev_name(width))
    if len(methods) > 1:
        raise QuantizationError(f"the module mixes torchao methods {sorted(methods)}; push one "
                                "method per version")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    try:
        flat, metadata = flatten_tensor_state_dict(tensors)
    except ValueError as exc:
        raise QuantizationError(f"torchao could not flatten the module: {exc}") from None
    method = methods.pop()
    names = json.loads(metadata["tensor_names"])
    configs = {name: json.loads(metadata[name]) for name in names
               if json.loads(metadata[name]).get("_type") != "Tensor"}
    out = {**flat, **{k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}}
    record = _record(TORCHAO, torchao.__version__, method, module, flat, group_sizes)
    record.update(tensor_names=names, config=configs,
                  shapes={k: list(subclasses[k].shape) for k in configs})
    if widths:
        record["weight_dtypes"] = sorted(widths)
    hf = getattr(getattr(module, "config", None), "quantization_config", None)
    if hf is not None and hasattr(hf, "to_dict"):
        # transformers' TorchAoConfig: written back by save_pretrained, never used by pull.
        record["hf_quantization_config"] = json.loads(json.dumps(hf.to_dict(), default=str))
    return Flattened(out, record)


def _flatten_dynamic(module: nn.Module, state: Mapping[str, Any],
                     dynamic: list[tuple[str, Any]]) -> Flattened:
    prefixes = tuple(f"{p}." for p, _ in dynamic)
    out: dict[str, Any] = {k: v for k, v in state.items() if not k.startswith(prefixes)}
    modules: list[dict[str, Any]] = []
    stored: dict[str, torch.Tensor] = {}
    for path, sub in dynamic:
        weight, bias = sub._packed_params._weight_bias()
        if weight.dtype != torch.qint8:
            raise QuantizationError(
                f"module {path!r} is a dynamic Linear of {weight.dtype}; only qint8 is stored "
                "(quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8))")
        scheme = weight.qscheme()
        entry: dict[str, Any] = {"path": path, "in_features": int(sub.in_features),
                                 "out_features": int(sub.out_features),
                                 "bias": bias is not None}
        parts = {"weight_qdata": weight.int_repr()}
        if scheme == torch.per_tensor_affine:
            entry["qscheme"] = "per_tensor_affine"
            parts["weight_scale"] = torch.tensor(weight.q_scale(), dtype=torch.float64)
            parts["weight_zero_point"] = torch.tensor(weight.q_zero_point(), dtype=torch.int64)
        elif scheme == torch.per_channel_affine:
            entry["qscheme"] = "per_channel_affine"
            entry["axis"] = int(weight.q_per_channel_axis())
            parts["weight_scale"] = weight.q_per_channel_scales().to(torch.float64)
            parts["weight_zero_point"] = weight.q_per_channel_zero_points().to(torch.int64)
        else:
            raise QuantizationError(f"module {path!r} uses {scheme}, which is not stored; use "
                                    "per-tensor or per-channel affine qint8")
        if bias is not None:
            parts["bias"] = bias.detach()
        for part, t in parts.items():
            stored[f"{path}.{part}"] = t.contiguous()
        modules.append(entry)
    out.update(stored)
    plain = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
    record = _record(TORCH_AO, torch.__version__, DYNAMIC_QINT8, module, plain, set())
    record.update(modules=modules)
    return Flattened(out, record)


def _record(library: str, version: str, method: str, module: nn.Module,
            flat: Mapping[str, torch.Tensor], group_sizes: Iterable[int]) -> dict[str, Any]:
    return {
        "library": library,
        "library_version": version,
        "method": method,
        "group_sizes": sorted(group_sizes),
        "float_params": _float_params(module),
        "stored_bytes": sum(t.numel() * t.element_size() for t in flat.values()),
        "devices": METHODS[(library, method)].labels(),
    }


def _is_dynamic_linear(module: nn.Module | None) -> bool:
    try:
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    except ImportError:  # pragma: no cover - torch without torch.ao
        return False
    return isinstance(module, DynamicLinear)


# -- pull: the record, checked, and the module rebuilt -------------------------------------------

class Scheme(Checked):
    """A torchao or torch.ao version's checked quantization record (:class:`Checked`): how its
    stored components fill the module's keys and how they are rebuilt."""

    def module_keys(self, stored: Iterable[str]) -> set[str]:
        """The module's state-dict keys the stored (flattened) keys fill."""
        keys = set(stored)
        if self.record["library"] == TORCHAO:
            return set(self.record["tensor_names"])
        for m in self.record["modules"]:
            p = m["path"]
            keys -= {f"{p}.{c}" for c in ("weight_qdata", "weight_scale", "weight_zero_point",
                                           "bias")}
            keys |= {f"{p}.weight", *([f"{p}.bias"] if m["bias"] else [])}
        return keys

    def skeleton(self, module: nn.Module) -> nn.Module:
        """``module`` as the pull fills it: a ``quantize_dynamic`` model given as ``model=`` (the
        quantized skeleton a user holds) gets float ``nn.Linear`` shells of the recorded shapes
        where its dynamic Linears are, as the float builder would have given them."""
        if self.record["library"] == TORCHAO:
            return module
        for m in self.record["modules"]:
            parent_path, _, attr = m["path"].rpartition(".")
            try:
                parent = module.get_submodule(parent_path)
            except AttributeError:
                continue  # check_fits names what the model lacks
            if _is_dynamic_linear(parent._modules.get(attr)):
                parent._modules[attr] = nn.Linear(m["in_features"], m["out_features"],
                                                  bias=m["bias"], device="meta")
        return module

    def shapes(self, specs: dict[str, Any]) -> dict[str, Any]:
        """The module keys' shapes: a quantized weight's is its logical (float) shape."""
        out = {k: v for k, v in specs.items() if k in self.module_keys(specs)}
        if self.record["library"] == TORCHAO:
            out.update({k: {"shape": v} for k, v in self.record["shapes"].items()})
            return out
        for m in self.record["modules"]:
            out[f"{m['path']}.weight"] = {"shape": [m["out_features"], m["in_features"]]}
            if m["bias"]:
                out[f"{m['path']}.bias"] = {"shape": [m["out_features"]]}
        return out

    def owners(self) -> dict[str, str]:
        owners: dict[str, str] = {}
        if self.record["library"] == TORCHAO:
            for name, config in self.record["config"].items():
                module, _, attr = name.rpartition(".")
                for part in config.get("_tensor_data_names", []):
                    owners[f"{module}._{attr}_{part}"] = name
        else:
            for m in self.record["modules"]:
                p = m["path"]
                for c in ("weight_qdata", "weight_scale", "weight_zero_point"):
                    owners[f"{p}.{c}"] = f"{p}.weight"
        return owners

    def state_dict(self, state: dict[str, Any], dequantize: torch.dtype | None) -> dict[str, Any]:
        """torchao: its tensor subclasses under the module's keys, as ``quantize_``'s model's
        ``state_dict()`` holds them. torch.ao's packed params live only in their modules, so
        their stored components come back as floats when asked, else are refused."""
        if self.record["library"] == TORCHAO or dequantize is not None:
            return self.rebuild(nn.Module(), state, dequantize)
        raise QuantizationError(
            f"{self.origin} is quantized with {self.name}, whose weights exist only inside its "
            "dynamic Linear modules: pull the module with registry.pull(ref, model=...), or "
            "pass dtype='float32' to pull_state_dict for dequantized weights")

    def rebuild(self, module: nn.Module, state: dict[str, Any],
                dequantize: torch.dtype | None) -> dict[str, Any]:
        """The module-keyed state from the stored components: quantized tensors rebuilt (the
        dynamic Linear modules swapped into ``module``), or floats when ``dequantize``."""
        if dequantize is not None:
            log.info("%s: dequantizing %s to %s on load, as dtype=%s asked", self.origin,
                     self.name, dev_name(dequantize), repr(dev_name(dequantize)))
        if self.record["library"] == TORCHAO:
            return self._torchao(state, dequantize)
        return self._dynamic(module, state, dequantize)

    def _torchao(self, state: dict[str, Any], dequantize: torch.dtype | None) -> dict[str, Any]:
        from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

        names = self.record["tensor_names"]
        configs = self.record["config"]
        metadata = {"tensor_names": json.dumps(names),
                    **{n: json.dumps(configs.get(n, {"_type": "Tensor"})) for n in names}}
        tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
        try:
            rebuilt, leftover = unflatten_tensor_state_dict(tensors, metadata)
        except Exception as exc:  # noqa: BLE001 - a recorded config is untrusted input
            raise QuantizationError(
                f"{self.origin}: its torchao tensors could not be rebuilt from their recorded "
                f"config ({type(exc).__name__}: {quoted(str(exc))}); push the model again"
            ) from None
        missing = [n for n in names if n not in rebuilt]
        if leftover or missing:
            raise QuantizationError(
                f"{self.origin}: its stored tensors disagree with its quantization config "
                f"(unused {sorted(leftover)[:3]}, unbuilt {missing[:3]}); push the model again")
        for name in configs:
            _check_components(self.origin, name, rebuilt[name], self.record["shapes"][name])
        out = {**rebuilt, **{k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}}
        if dequantize is not None:
            out = {k: (v.dequantize().to(dequantize) if k in configs
                       else v.to(dequantize) if isinstance(v, torch.Tensor)
                       and v.is_floating_point() else v) for k, v in out.items()}
        return out

    def _dynamic(self, module: nn.Module, state: dict[str, Any],
                 dequantize: torch.dtype | None) -> dict[str, Any]:
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

        out = dict(state)
        for m in self.record["modules"]:
            p = m["path"]
            qdata = out.pop(f"{p}.weight_qdata")
            scale = out.pop(f"{p}.weight_scale")
            zero = out.pop(f"{p}.weight_zero_point")
            bias = out.pop(f"{p}.bias", None)
            shape = [m["out_features"], m["in_features"]]
            per_channel = m["qscheme"] == "per_channel_affine"
            want_scale = [shape[m.get("axis", 0)]] if per_channel else []
            if list(qdata.shape) != shape or list(scale.shape) != want_scale \
                    or list(zero.shape) != want_scale or qdata.dtype != torch.int8 \
                    or (bias is not None) != m["bias"] \
                    or (bias is not None and list(bias.shape) != [shape[0]]):
                raise QuantizationError(
                    f"{self.origin}: the packed tensors of {p!r} ({list(qdata.shape)}, scale "
                    f"{list(scale.shape)}) disagree with its config ({m['qscheme']}, "
                    f"{shape[1]} -> {shape[0]}); push the model again")
            if per_channel:
                weight = torch._make_per_channel_quantized_tensor(
                    qdata, scale, zero, m.get("axis", 0))
            else:
                weight = torch._make_per_tensor_quantized_tensor(
                    qdata, float(scale), int(zero))
            if dequantize is not None:
                out[f"{p}.weight"] = weight.dequantize().to(dequantize)
                if bias is not None:
                    out[f"{p}.bias"] = bias.to(dequantize)
                continue
            parent_path, _, attr = p.rpartition(".")
            parent = module.get_submodule(parent_path)
            if not isinstance(parent._modules.get(attr), nn.Linear):
                raise QuantizationError(
                    f"{self.origin}: module {p!r} of the model is a "
                    f"{type(parent._modules.get(attr)).__name__}, not the nn.Linear that was "
                    "quantized; pull with the float model it was quantized from")
            swapped = DynamicLinear(m["in_features"], m["out_features"], bias_=m["bias"],
                                    dtype=torch.qint8)
            parent._modules[attr] = swapped
            out[f"{p}.scale"] = torch.tensor(1.0)
            out[f"{p}.zero_point"] = torch.tensor(0, dtype=torch.long)
            out[f"{p}._packed_params.dtype"] = torch.qint8
            out[f"{p}._packed_params._packed_params"] = (weight, bias)
        if dequantize is not None:
            out = {k: (v.to(dequantize) if isinstance(v, torch.Tensor) and v.is_floating_point()
                       else v) for k, v in out.items()}
        return out


def dev_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_components(origin: str, name: str, tensor: torch.Tensor, shape: list[int]) -> None:
    """A rebuilt tensor's logical shape is the recorded one, and its scale has one entry per
    block of its quantized data."""
    qdata = getattr(tensor, "qdata", None)
    scale = getattr(tensor, "scale", None)
    block = getattr(tensor, "block_size", None)
    problem = None
    if list(tensor.shape) != list(shape):
        problem = f"shape {list(tensor.shape)} vs recorded {shape}"
    elif isinstance(qdata, torch.Tensor) and isinstance(scale, torch.Tensor) and block \
            and type(tensor).__name__ in ("Int8Tensor", "Float8Tensor") \
            and qdata.dim() == len(block) == scale.dim():
        want = [n // b if b else n for n, b in zip(qdata.shape, block, strict=True)]
        if any(n % b for n, b in zip(qdata.shape, block, strict=True) if b) \
                or list(scale.shape) != want:
            problem = (f"data {list(qdata.shape)} in blocks {list(block)} needs scale {want}, "
                       f"stored {list(scale.shape)}")
    if problem:
        raise QuantizationError(f"{origin}: the packed tensors of {name!r} disagree with its "
                                f"quantization config ({problem}); push the model again")


# -- the record, untrusted ----------------------------------------------------------------------

def scheme_of(manifest: Mapping[str, Any], origin: str) -> Plain:
    """The checked scheme of a version, :class:`Plain` for a float one. QuantizationError for a
    library or method this registry does not know, and for a config that names anything
    outside torchao's own allow list (nothing is imported for it)."""
    record = manifest.get("quantization")
    if record is None:
        return Plain()
    if problem := check(record):
        raise QuantizationError(f"{origin}: its quantization record {problem}; it was not used")
    if record["library"] == TORCH_AO:
        _check_dynamic_tensors(record["modules"], manifest.get("tensors", {}), origin)
    kind = ctensors.Packed if record["library"] == COMPRESSED_TENSORS else Scheme
    return kind(record, METHODS[(record["library"], record["method"])], origin)


def _check_dynamic_tensors(modules: list[dict[str, Any]], tensors: Mapping[str, Any],
                           origin: str) -> None:
    """Each torch.ao module a record lists against the stored tensors (their manifest specs),
    before a module is built: its components stored, of the shapes and dtype its entry gives,
    each module listed once."""
    seen: set[str] = set()
    for m in modules:
        p = m["path"]
        shape = [m["out_features"], m["in_features"]]
        scale = [shape[m.get("axis", 0)]] if m["qscheme"] == "per_channel_affine" else []
        want = {f"{p}.weight_qdata": (shape, "int8"), f"{p}.weight_scale": (scale, None),
                f"{p}.weight_zero_point": (scale, None)}
        if m["bias"]:
            want[f"{p}.bias"] = ([shape[0]], None)
        problems = [f"{k} is not stored" if k not in tensors else
                    f"{k} is {tensors[k]['dtype']} {tensors[k]['shape']}"
                    for k, (dims, dtype) in want.items()
                    if k not in tensors or list(tensors[k]["shape"]) != dims
                    or (dtype is not None and tensors[k]["dtype"] != dtype)]
        if not m["bias"] and f"{p}.bias" in tensors:
            problems.append(f"{p}.bias is stored but its entry says no bias")
        if p in seen:
            problems.append(f"{p!r} is listed twice")
        seen.add(p)
        if problems:
            raise QuantizationError(
                f"{origin}: its torch.ao record lists module {quoted(p, 120)} "
                f"({m['qscheme']}, {shape[1]} -> {shape[0]}), which its stored tensors "
                f"do not hold ({'; '.join(problems[:3])}); push the model again")
