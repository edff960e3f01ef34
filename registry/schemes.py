"""Which quantization schemes this registry stores, where each runs, and whether a manifest's
``quantization`` record names one it knows.

These are facts about schemes, as :mod:`registry.devices` holds facts about the machine: the
pull's device check and ``device_map`` planning put the two together (:mod:`registry.quantized`).
A record is untrusted input: a library or method outside :data:`METHODS` is refused, and a
torchao config may name only the types torchao's own allow list holds, and dtypes that are
dtypes, before torchao sees it (torchao would otherwise ``getattr(torch, name)`` any name).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from . import devices as dev
from .errors import SchemeDeviceError, quoted

log = logging.getLogger(__name__)

TORCHAO = "torchao"
TORCH_AO = "torch.ao"
DYNAMIC_QINT8 = "dynamic_qint8"
COMPRESSED_TENSORS = "compressed-tensors"
PACK_QUANTIZED = "pack-quantized"
_MAX_CONFIG_CHARS = 4096
_MAX_NESTING = 8


@dataclass(frozen=True)
class Runs:
    """Where a method has kernels: the CPU, CUDA from a compute capability on, MPS."""

    cpu: bool
    cuda: tuple[int, int] | None  # the lowest compute capability; None: no CUDA kernels
    mps: bool = False

    def labels(self) -> list[str]:
        out = ["cpu"] if self.cpu else []
        if self.cuda is not None:
            out.append("cuda" if self.cuda == (0, 0) else f"cuda (capability >= "
                       f"{self.cuda[0]}.{self.cuda[1]})")
        return out + (["mps"] if self.mps else [])

    def on(self, device: torch.device, facts: dev.TorchFacts) -> bool:
        if device.type == "cpu":
            return self.cpu
        if device.type == "mps":
            return self.mps
        if device.type == "cuda" and self.cuda is not None:
            index = device.index if device.index is not None else facts.cuda_current
            gpu = next((d for d in facts.cuda if d.index == index), None)
            return gpu is not None and gpu.capability >= self.cuda
        return False


# (library, method) -> where it runs. torchao's int4 layouts need CUDA kernels (mslk/fbgemm);
# float8 weight-only has a CPU path in torch 2.x and CUDA kernels from Ada (8.9) on;
# quantize_dynamic's packed Linear runs on the CPU engines (fbgemm, qnnpack, x86) alone.
METHODS: dict[tuple[str, str], Runs] = {
    (TORCHAO, "int8_weight_only"): Runs(cpu=True, cuda=(0, 0)),
    (TORCHAO, "int8_dynamic_activation_int8_weight"): Runs(cpu=True, cuda=(0, 0)),
    (TORCHAO, "float8_weight_only"): Runs(cpu=True, cuda=(8, 9)),
    (TORCHAO, "float8_dynamic_activation_float8_weight"): Runs(cpu=False, cuda=(8, 9)),
    (TORCHAO, "int4_weight_only"): Runs(cpu=False, cuda=(8, 0)),
    # IntxUnpackedToInt8Tensor (int1..int8 weights, one int8 each, by group) dequantizes with
    # plain torch ops wherever torch runs: torchao's int4 weight-only for the CPU.
    (TORCHAO, "intx_weight_only"): Runs(cpu=True, cuda=(0, 0)),
    (TORCHAO, "int8_dynamic_activation_intx_weight"): Runs(cpu=True, cuda=(0, 0)),
    (TORCH_AO, DYNAMIC_QINT8): Runs(cpu=True, cuda=None),
    # compressed-tensors unpacks int1..int8 groups with plain torch ops wherever torch runs.
    (COMPRESSED_TENSORS, PACK_QUANTIZED): Runs(cpu=True, cuda=(0, 0)),
}

# torchao subclass -> method, by whether activations are quantized too.
TORCHAO_METHODS = {
    ("Int8Tensor", False): "int8_weight_only",
    ("Int8Tensor", True): "int8_dynamic_activation_int8_weight",
    ("Float8Tensor", False): "float8_weight_only",
    ("Float8Tensor", True): "float8_dynamic_activation_float8_weight",
    ("Int4Tensor", False): "int4_weight_only",
    ("Int4TilePackedTo4dTensor", False): "int4_weight_only",
    ("IntxUnpackedToInt8Tensor", False): "intx_weight_only",
    ("IntxUnpackedToInt8Tensor", True): "int8_dynamic_activation_intx_weight",
}

# The integer widths an intx scheme stores its weights in (``weight_dtypes`` of its record).
INTX_DTYPES = frozenset({*(f"int{n}" for n in range(1, 9)), *(f"uint{n}" for n in range(1, 9))})


def activations_quantized(tensor: object) -> bool:
    """Whether a torchao weight also quantizes the activations it multiplies: Int8Tensor and
    Float8Tensor carry ``act_quant_kwargs``, IntxUnpackedToInt8Tensor
    ``activation_quantization``."""
    return getattr(tensor, "act_quant_kwargs", None) is not None \
        or getattr(tensor, "activation_quantization", None) is not None


def check(record: object) -> str | None:
    """Why a manifest's ``quantization`` record is malformed or unknown, or None."""
    if not isinstance(record, dict):
        return f"is {quoted(record)}, not an object"
    key = (record.get("library"), record.get("method"))
    if key not in METHODS:
        known = ", ".join(f"{lib} {m}" for lib, m in METHODS)
        return (f"names {quoted(key[0], 60)} {quoted(key[1], 60)}, which is not a scheme this "
                f"registry loads ({known})")
    for field in ("float_params", "stored_bytes"):
        value = record.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"has {field} {quoted(value)}, not a count"
    if record["library"] == COMPRESSED_TENSORS:
        return _check_compressed(record)
    if record["library"] == TORCHAO:
        widths = record.get("weight_dtypes")
        if widths is not None and not (isinstance(widths, list) and widths
                                       and all(w in INTX_DTYPES for w in widths)):
            return f"has weight_dtypes {quoted(widths)}, not a list of int1..int8 / uint1..uint8"
        hf = record.get("hf_quantization_config")
        if hf is not None and (not isinstance(hf, dict) or hf.get("quant_method") != TORCHAO):
            return (f"has an hf_quantization_config {quoted(hf, 80)} whose quant_method is not "
                    "'torchao'")
        return _check_torchao(record)
    modules = record.get("modules")
    if not isinstance(modules, list) or not modules:
        return "lists no quantized modules"
    for m in modules:
        if not isinstance(m, dict) or not isinstance(m.get("path"), str) \
                or m.get("qscheme") not in ("per_tensor_affine", "per_channel_affine") \
                or not all(isinstance(m.get(k), int) and not isinstance(m.get(k), bool)
                           and 0 < m[k] < 2**31 for k in ("in_features", "out_features")) \
                or not isinstance(m.get("bias"), bool) \
                or m.get("axis", 0) not in (0, 1):
            return f"has a malformed module entry {quoted(m)}"
    return None


def _check_torchao(record: Mapping[str, Any]) -> str | None:
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
        if len(json.dumps(config)) > _MAX_CONFIG_CHARS:
            return f"has a config for {name!r} longer than {_MAX_CONFIG_CHARS} characters"
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
    if depth > _MAX_NESTING:
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


# -- compressed-tensors: a transformers quantization_config, checked as data ----------------------

_CT_KEYS = frozenset({"config_groups", "quant_method", "kv_cache_scheme", "format", "version",
                      "quantization_status", "global_compression_ratio", "ignore",
                      "moe_sparsity_config", "sparsity_config", "transform_config"})
_CT_GROUP_KEYS = frozenset({"targets", "weights", "input_activations", "output_activations",
                            "format"})
_CT_WEIGHT_KEYS = frozenset({"num_bits", "type", "symmetric", "group_size", "strategy",
                             "dynamic", "actorder", "observer", "observer_kwargs", "scale_dtype",
                             "zp_dtype", "block_structure"})


def _check_compressed(record: Mapping[str, Any]) -> str | None:
    """A pack-quantized, weight-only int config whose every value is plain data (the library
    validates it again with pydantic; nothing in it names code), and the modules it packed."""
    config = record.get("config")
    if not isinstance(config, dict) or len(json.dumps(config)) > 16 * _MAX_CONFIG_CHARS:
        return f"has a compressed-tensors config {quoted(config, 80)} that is not an object"
    if unknown := sorted(str(k) for k in config if k not in _CT_KEYS):
        return f"has a config key {quoted(unknown[0], 60)} compressed-tensors configs lack"
    if config.get("quant_method") != COMPRESSED_TENSORS or config.get("format") != PACK_QUANTIZED:
        return (f"has quant_method {quoted(config.get('quant_method'), 40)} format "
                f"{quoted(config.get('format'), 40)}; only {PACK_QUANTIZED!r} is loaded")
    if any(config.get(k) for k in ("kv_cache_scheme", "sparsity_config", "transform_config",
                                   "moe_sparsity_config")):
        return "quantizes more than weights (kv cache, sparsity or transforms)"
    if not _strings(config.get("ignore") or []):
        return f"has ignore {quoted(config.get('ignore'), 80)}, not a list of names"
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return "has no config_groups"
    for name, group in groups.items():
        if problem := _check_group(group):
            return f"gives group {quoted(name, 40)} {problem}"
    modules = record.get("modules")
    if not isinstance(modules, dict) or not modules:
        return "lists no quantized modules"
    for path, m in modules.items():
        if not isinstance(m, dict) or m.get("group") not in groups or not isinstance(path, str) \
                or not isinstance(m.get("shape"), list) or len(m["shape"]) != 2 \
                or not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2**31
                           for n in m["shape"]):
            return f"has a malformed module entry {quoted(path, 80)}: {quoted(m, 80)}"
    return None


def _check_group(group: object) -> str | None:
    if not isinstance(group, dict) or not set(group) <= _CT_GROUP_KEYS:
        return f"{quoted(group, 80)}, not a scheme"
    if group.get("input_activations") is not None or group.get("output_activations") is not None:
        return "quantized activations; only weight-only schemes are loaded"
    if group.get("format") not in (None, PACK_QUANTIZED) or not _strings(group.get("targets")):
        return f"format {quoted(group.get('format'), 40)} or targets that are not names"
    w = group.get("weights")
    if not isinstance(w, dict) or not set(w) <= _CT_WEIGHT_KEYS or w.get("type") != "int" \
            or w.get("num_bits") not in range(1, 9) or w.get("dynamic") not in (False, None) \
            or w.get("strategy") not in ("group", "channel") or w.get("observer_kwargs") \
            or not all(v is None or isinstance(v, (bool, int, float)) or
                       (isinstance(v, str) and len(v) <= 64) for k, v in w.items()
                       if k not in ("observer_kwargs", "block_structure")):
        return f"weights {quoted(w, 120)}, not int1..int8 by group or channel"
    size = w.get("group_size")
    if w["strategy"] == "group" and not (isinstance(size, int) and 0 < size < 2**31):
        return f"group_size {quoted(size)}"
    return None


def _strings(value: object) -> bool:
    return isinstance(value, list) and len(value) <= 1024 and all(
        isinstance(v, str) and len(v) <= 256 for v in value)


# -- the pull steps a scheme takes --------------------------------------------------------------

class Plain:
    """The pull steps of a float version: each leaves what it is given as it is."""

    def auto_device(self, request: dev.DeviceRequest, facts: dev.TorchFacts) -> dev.DeviceRequest:
        return request

    def module_keys(self, stored: Iterable[str]) -> set[str]:
        return set(stored)

    def skeleton(self, module: torch.nn.Module) -> torch.nn.Module:
        """The built module as the later steps fill it."""
        return module

    def shapes(self, specs: dict[str, Any]) -> dict[str, Any]:
        return specs

    def sizes(self, manifest: Mapping[str, Any]) -> dict[str, int] | None:
        return None

    def check_devices(self, devices: Iterable[torch.device], facts: dev.TorchFacts,
                      dequantize: torch.dtype | None) -> None:
        return None

    def policy(self, policy: Any) -> Any:
        return policy

    def rebuild(self, module: Any, state: dict[str, Any],
                dequantize: torch.dtype | None) -> dict[str, Any]:
        return state

    def state_dict(self, state: dict[str, Any], dequantize: torch.dtype | None) -> dict[str, Any]:
        """What ``pull_state_dict`` returns from the stored tensors."""
        return state

    def owners(self) -> dict[str, str]:
        """Stored component key -> the module key it belongs to (none: each is its own)."""
        return {}


@dataclass(frozen=True)
class Checked(Plain):
    """A version's quantization record once checked against what this registry knows: the
    device facts of its scheme. Each library's subclass says how its components are rebuilt."""

    record: dict[str, Any]
    runs: Runs
    origin: str

    @property
    def name(self) -> str:
        return f"{self.record['library']} {self.record['method']}"

    def policy(self, policy: Any) -> Any:
        return stored_dtype  # components are read byte for byte; rebuild casts when asked

    def owners(self) -> dict[str, str]:
        """Stored component key -> the module key it belongs to."""
        raise NotImplementedError

    def sizes(self, manifest: Mapping[str, Any]) -> dict[str, int]:
        """Stored bytes per module key: the components of a quantized weight count for it, so
        ``device_map='auto'`` plans by what the device will hold, not the float size."""
        out: dict[str, int] = {}
        owners = self.owners()
        for key, spec in manifest["tensors"].items():
            size = math.prod(spec["shape"]) * getattr(torch, spec["dtype"]).itemsize
            owner = owners.get(key, key)
            out[owner] = out.get(owner, 0) + size
        return out

    def auto_device(self, request: dev.DeviceRequest, facts: dev.TorchFacts) -> dev.DeviceRequest:
        """``"auto"`` among the devices that run the scheme; a named device is left as asked."""
        if not (isinstance(request, str) and request == "auto"):
            return request
        runnable = [d for d in facts.available() if self.runs.on(torch.device(d), facts)]
        if runnable and not any(d.startswith("cuda") for d in runnable) and facts.cuda:
            log.info("%s: %s has no CUDA kernels; device='auto' pulls it onto %s", self.origin,
                     self.name, runnable[0])
            return runnable[0]
        return request

    def check_devices(self, devices: Iterable[torch.device], facts: dev.TorchFacts,
                      dequantize: torch.dtype | None) -> None:
        """Refuse a device without kernels for the scheme, unless floats were asked for."""
        for device in devices:
            if self.runs.on(device, facts) or dequantize is not None:
                continue
            can = ", ".join(self.runs.labels()) or "none known"
            raise SchemeDeviceError(
                f"{self.origin} is quantized with {self.name}, which has no kernels on "
                f"{device}; it runs on: {can}. Pull onto one of those, or pass dtype='float32' "
                "(or 'bfloat16') to dequantize on load")


def stored_dtype(key: str, stored: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype policy of a quantized pull: components are read as stored, byte for byte."""
    return stored
