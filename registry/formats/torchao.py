"""torchao tensor subclasses (``quantize_(m, Int8WeightOnlyConfig())``, float8, int4, and intx:
int1..int8 weights unpacked one per int8, torchao's int4 for the CPU), stored through what
torchao provides.

Push: torchao's own ``flatten_tensor_state_dict`` splits each subclass into plain component
tensors (``0._weight_qdata``, ``0._weight_scale``...) and a JSON description, recorded with the
method, its group sizes and, for a transformers model, its ``TorchAoConfig``. Pull:
``unflatten_tensor_state_dict`` puts them back. A manifest's description is untrusted: every
``_type`` in it must be on torchao's own allow list, and every ``torch.dtype`` a dtype, before
torchao sees it (torchao would otherwise ``getattr(torch, name)`` any name).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..errors import QuantizationError, quoted
from ..model.devices import dtype_name
from .base import Flat, Read, ReadBy, Runs, Steps
from .common import (
    MAX_CONFIG_CHARS,
    MAX_NESTING,
    Checked,
    keep_stored,
    param_count,
    quantization_record,
)

log = logging.getLogger(__name__)

LIBRARY = "torchao"
# Method -> where it runs. torchao's int4 layouts need CUDA kernels (mslk/fbgemm); float8
# weight-only has a CPU path in torch 2.x and CUDA kernels from Ada (8.9) on.
METHODS: dict[str, Runs] = {
    "int8_weight_only": Runs(cpu=True, cuda=(0, 0)),
    "int8_dynamic_activation_int8_weight": Runs(cpu=True, cuda=(0, 0)),
    "float8_weight_only": Runs(cpu=True, cuda=(8, 9)),
    "float8_dynamic_activation_float8_weight": Runs(cpu=False, cuda=(8, 9)),
    "int4_weight_only": Runs(cpu=False, cuda=(8, 0)),
    # IntxUnpackedToInt8Tensor (int1..int8 weights, one int8 each, by group) dequantizes with
    # plain torch ops wherever torch runs: torchao's int4 weight-only for the CPU.
    "intx_weight_only": Runs(cpu=True, cuda=(0, 0)),
    "int8_dynamic_activation_intx_weight": Runs(cpu=True, cuda=(0, 0)),
}

# torchao subclass -> method, by whether activations are quantized too.
SUBCLASS_METHODS = {
    ("Int8Tensor", False): "int8_weight_only",
    ("Int8Tensor", True): "int8_dynamic_activation_int8_weight",
    ("Float8Tensor", False): "float8_weight_only",
    ("Float8Tensor", True): "float8_dynamic_activation_float8_weight",
    ("Int4Tensor", False): "int4_weight_only",
    ("Int4TilePackedTo4dTensor", False): "int4_weight_only",
    ("IntxUnpackedToInt8Tensor", False): "intx_weight_only",
    ("IntxUnpackedToInt8Tensor", True): "int8_dynamic_activation_intx_weight",
}

# The integer widths an intx method stores its weights in (``weight_dtypes`` of its record).
INTX_DTYPES = frozenset({*(f"int{n}" for n in range(1, 9)), *(f"uint{n}" for n in range(1, 9))})


def activations_quantized(tensor: object) -> bool:
    """Whether a torchao weight also quantizes the activations it multiplies: Int8Tensor and
    Float8Tensor carry ``act_quant_kwargs``, IntxUnpackedToInt8Tensor
    ``activation_quantization``."""
    return getattr(tensor, "act_quant_kwargs", None) is not None \
        or getattr(tensor, "activation_quantization", None) is not None


# -- push: a module holding torchao tensors -> plain tensors + record ----------------------------

def flatten(module: nn.Module, state: Mapping[str, Any]) -> Flat | None:
    """The stored form of ``module`` when its state holds torchao tensors, else None."""
    subclasses = {k: v for k, v in state.items()
                  if isinstance(v, torch.Tensor) and type(v) is not torch.Tensor
                  and type(v).__module__.startswith("torchao.")}
    if not subclasses:
        return None
    import torchao
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

    methods: set[str] = set()
    group_sizes: set[int] = set()
    widths: set[str] = set()
    for key, t in subclasses.items():
        kind = type(t).__name__
        method = SUBCLASS_METHODS.get((kind, activations_quantized(t)))
        if method is None:
            raise QuantizationError(
                f"tensor {key!r} is a torchao {kind}, which this registry does not store yet; "
                f"supported: {', '.join(sorted({m for (_k, _a), m in SUBCLASS_METHODS.items()}))}")
        methods.add(method)
        block = getattr(t, "block_size", None)
        if block:
            group_sizes.add(int(list(block)[-1]))
        width = getattr(t, "target_dtype", None)
        if isinstance(width, torch.dtype):  # intx: int1..int8
            widths.add(dtype_name(width))
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
    record = quantization_record(LIBRARY, torchao.__version__, method, METHODS[method], flat,
                                 group_sizes, param_count(module))
    record.update(tensor_names=names, config=configs,
                  shapes={k: list(subclasses[k].shape) for k in configs})
    if widths:
        record["weight_dtypes"] = sorted(widths)
    hf = getattr(getattr(module, "config", None), "quantization_config", None)
    if hf is not None and hasattr(hf, "to_dict"):
        # transformers' TorchAoConfig: written back by save_pretrained, never used by pull.
        record["hf_quantization_config"] = json.loads(json.dumps(hf.to_dict(), default=str))
    return Flat(out, record)


# -- the record, untrusted -----------------------------------------------------------------------

def check(record: dict[str, Any]) -> str | None:
    """Why a torchao record is malformed: a type outside torchao's allow list, a dtype that is
    not one, widths or shapes that disagree with its tensors' configs."""
    widths = record.get("weight_dtypes")
    if widths is not None and not (isinstance(widths, list) and widths
                                   and all(w in INTX_DTYPES for w in widths)):
        return f"has weight_dtypes {quoted(widths)}, not a list of int1..int8 / uint1..uint8"
    hf = record.get("hf_quantization_config")
    if hf is not None and (not isinstance(hf, dict) or hf.get("quant_method") != LIBRARY):
        return (f"has an hf_quantization_config {quoted(hf, 80)} whose quant_method is not "
                "'torchao'")
    from torchao.prototype.safetensors.safetensors_utils import (
        ALLOWED_CLASSES,
        ALLOWED_TENSORS_SUBCLASSES,
    )

    names = record.get("tensor_names")
    configs = record.get("config")
    shapes = record.get("shapes")
    if not isinstance(names, list) or not all(isinstance(n, str) and "." in n for n in names):
        return f"has tensor_names {quoted(names)}, not a list of module.attribute keys"
    if not isinstance(configs, dict) or not isinstance(shapes, dict) \
            or set(configs) != set(shapes) or not set(configs) <= set(names):
        return "has a config or shapes that do not match its tensor names"
    for name, config in configs.items():
        if not isinstance(config, dict) or config.get("_type") not in ALLOWED_TENSORS_SUBCLASSES:
            what = config.get("_type") if isinstance(config, dict) else config
            return (f"gives {name!r} the type {quoted(what, 80)}, which is not a torchao tensor "
                    f"type ({', '.join(ALLOWED_TENSORS_SUBCLASSES)})")
        if len(json.dumps(config)) > MAX_CONFIG_CHARS:
            return f"has a config for {name!r} longer than {MAX_CONFIG_CHARS} characters"
        parts = config.get("_tensor_data_names")
        if not isinstance(parts, list) or not all(isinstance(p, str) and p.isidentifier()
                                                  for p in parts):
            return f"has _tensor_data_names {quoted(parts)} for {name!r}"
        if problem := _check_value(config.get("_data"), set(ALLOWED_CLASSES), 0):
            return f"gives {name!r} {problem}"
        shape = shapes[name]
        if not isinstance(shape, list) or not all(isinstance(n, int) and 0 <= n < 2**50
                                                  for n in shape):
            return f"has shape {quoted(shape)} for {name!r}"
    # An intx record names its weights' width; the tensors' own configs must say the same.
    widths = {c["_data"]["target_dtype"].get("_data") for c in configs.values()
              if isinstance(c.get("_data"), dict)
              and isinstance(c["_data"].get("target_dtype"), dict)}
    if sorted(map(str, widths)) != sorted(record.get("weight_dtypes") or []):
        return (f"has weight_dtypes {quoted(record.get('weight_dtypes'))} while its tensors "
                f"are {quoted(sorted(map(str, widths)))}")
    return None


_DTYPE_NAMES = frozenset(n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype))


def _check_value(value: object, allowed: set[str], depth: int) -> str | None:
    """Every typed object in a torchao config is one torchao allows; a dtype is a dtype (torchao
    would otherwise ``getattr(torch, name)`` whatever the name says)."""
    if depth > MAX_NESTING:
        return "a config nested too deep"
    if isinstance(value, dict):
        if "_type" in value:
            kind = value.get("_type")
            if kind == "torch.dtype":
                if value.get("_data") not in _DTYPE_NAMES:
                    return f"the dtype {quoted(value.get('_data'), 60)}"
                return None
            if kind not in allowed:
                return f"the type {quoted(kind, 80)}, which torchao does not allow"
        for v in value.values():
            if problem := _check_value(v, allowed, depth + 1):
                return problem
    elif isinstance(value, list):
        for v in value:
            if problem := _check_value(v, allowed, depth + 1):
                return problem
    return None


# -- pull: the subclasses rebuilt ----------------------------------------------------------------

def steps(record: dict[str, Any], manifest: Mapping[str, Any], origin: str) -> Steps:
    """The module's keys are the recorded tensor names; each subclass's components (its
    ``_tensor_data_names``) are stored as ``<module>._<attr>_<part>``."""
    components = {f"{name.rpartition('.')[0]}._{name.rpartition('.')[2]}_{part}": name
                  for name, config in record["config"].items()
                  for part in config.get("_tensor_data_names", [])}
    return Steps(origin, METHODS[record["method"]], names=frozenset(record["tensor_names"]),
                 logical=record["shapes"], components=components,
                 format=Subclasses(record, origin))


def pull(record: dict[str, Any], manifest: Mapping[str, Any], origin: str,
         dequantize: torch.dtype | None, read: ReadBy) -> Read:
    """Pull, this format's one visit (:meth:`~.base.Format.pull`): its :func:`steps`, the
    pipeline's read by them, and what was read rebuilt: the components rebuilt as torchao's
    tensor subclasses (or ``pull_state_dict``'s tensors where no module was built)."""
    got = read(steps(record, manifest, origin))
    rebuild = Subclasses(record, origin)
    return replace(got, state=rebuild.state_dict(got.state, dequantize) if got.module is None
                   else rebuild.rebuild(got.module, got.state, dequantize))


class Subclasses(Checked):
    """A torchao version's checked record: its components rebuilt as torchao's tensor
    subclasses under the module's keys."""

    def state_dict(self, state: dict[str, Any], dequantize: torch.dtype | None) -> dict[str, Any]:
        """Its tensor subclasses under the module's keys, as ``quantize_``'s model's
        ``state_dict()`` holds them (floats when ``dequantize``)."""
        return self.rebuild(nn.Module(), state, dequantize)

    def rebuild(self, module: nn.Module, state: dict[str, Any],
                dequantize: torch.dtype | None) -> dict[str, Any]:
        from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

        if dequantize is not None:
            log.info("%s: dequantizing %s to %s on load, as dtype=%s asked", self.origin,
                     self.name, dtype_name(dequantize), repr(dtype_name(dequantize)))
        names = self.record["tensor_names"]
        configs = self.record["config"]
        tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
        try:
            rebuilt, leftover = unflatten_tensor_state_dict(tensors, torchao_metadata(self.record))
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

    def pretrained(self, requested: torch.dtype | None
                   ) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """transformers' torchao loader rebuilds the tensors from the metadata torchao's
        flatten wrote, under the ``TorchAoConfig`` the model was loaded with."""
        hf = self.record.get("hf_quantization_config")
        if hf is None:
            return super().pretrained(requested)
        keep_stored(self.origin, requested)
        return dict(hf), torchao_metadata(self.record)


def torchao_metadata(record: Mapping[str, Any]) -> dict[str, str]:
    """The safetensors metadata torchao's flatten wrote: each key's config, as JSON."""
    names = record["tensor_names"]
    return {"tensor_names": json.dumps(names),
            **{n: json.dumps(record["config"].get(n, {"_type": "Tensor"})) for n in names}}


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
