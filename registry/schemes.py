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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from . import devices as dev
from .errors import quoted

TORCHAO = "torchao"
TORCH_AO = "torch.ao"
DYNAMIC_QINT8 = "dynamic_qint8"
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
    (TORCH_AO, DYNAMIC_QINT8): Runs(cpu=True, cuda=None),
}

# torchao subclass -> method, by whether activations are quantized too.
TORCHAO_METHODS = {
    ("Int8Tensor", False): "int8_weight_only",
    ("Int8Tensor", True): "int8_dynamic_activation_int8_weight",
    ("Float8Tensor", False): "float8_weight_only",
    ("Float8Tensor", True): "float8_dynamic_activation_float8_weight",
    ("Int4Tensor", False): "int4_weight_only",
    ("Int4TilePackedTo4dTensor", False): "int4_weight_only",
}


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
    if record["library"] == TORCHAO:
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
