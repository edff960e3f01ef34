"""What several formats share: where a method runs (:class:`Runs`), the pull steps of a float
version (:class:`Plain`) and of a checked quantization record (:class:`Checked`), the fields
every ``quantization`` record has, and dtype names.

These are facts about formats, as :mod:`registry.devices` holds facts about the machine: the
pull's device check and ``device_map`` planning put the two together. No format module is
imported here; each format module builds on this one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import devices as dev
from ..errors import QuantizationError, SchemeDeviceError, quoted

log = logging.getLogger(__name__)

MAX_CONFIG_CHARS = 4096  # a recorded config's JSON, per tensor (x16 for a whole model's)
MAX_NESTING = 8


def dtype_name(dtype: torch.dtype) -> str:
    """``"bfloat16"`` for ``torch.bfloat16``: how a manifest names a dtype."""
    return str(dtype).removeprefix("torch.")


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


# -- push: the fields every quantization record has ----------------------------------------------

def param_count(module: nn.Module) -> int:
    """The module's parameters, each shared one counted once."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def quantization_record(library: str, version: str, method: str, runs: Runs,
                        flat: Mapping[str, Any], group_sizes: Iterable[int],
                        float_params: int) -> dict[str, Any]:
    """The fields every ``quantization`` record opens with, in the order manifests hold them."""
    tensors = [t for t in flat.values() if isinstance(t, torch.Tensor)]
    return {
        "library": library,
        "library_version": version,
        "method": method,
        "group_sizes": sorted(group_sizes),
        "float_params": float_params,
        "stored_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "devices": runs.labels(),
    }


def check_counts(record: Mapping[str, Any]) -> str | None:
    """Why a record's counts are not counts, or None."""
    for field in ("float_params", "stored_bytes"):
        value = record.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"has {field} {quoted(value)}, not a count"
    return None


# -- pull: the steps a format takes --------------------------------------------------------------

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

    def pretrained(self, requested: torch.dtype | None
                   ) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """The ``quantization_config`` and safetensors metadata a ``from_pretrained`` directory
        of the version needs: none for a float version."""
        return None, None


@dataclass(frozen=True)
class Checked(Plain):
    """A version's quantization record once checked against what this registry knows: the
    device facts of its method. Each format's subclass says how its components are rebuilt."""

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
        """``"auto"`` among the devices that run the method; a named device is left as asked."""
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
        """Refuse a device without kernels for the method, unless floats were asked for."""
        for device in devices:
            if self.runs.on(device, facts) or dequantize is not None:
                continue
            can = ", ".join(self.runs.labels()) or "none known"
            raise SchemeDeviceError(
                f"{self.origin} is quantized with {self.name}, which has no kernels on "
                f"{device}; it runs on: {can}. Pull onto one of those, or pass dtype='float32' "
                "(or 'bfloat16') to dequantize on load")

    def pretrained(self, requested: torch.dtype | None
                   ) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """A format whose components transformers cannot load quantized has no directory."""
        raise QuantizationError(
            f"{self.origin} is quantized with {self.name} without a transformers "
            "quantization_config, so transformers could not load it quantized; pull it with "
            "registry.pull(), or push a model loaded with quantization_config=TorchAoConfig(...)")


def stored_dtype(key: str, stored: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype policy of a quantized pull: components are read as stored, byte for byte."""
    return stored


def keep_stored(origin: str, requested: torch.dtype | None) -> None:
    """A ``from_pretrained`` directory of a quantized version holds its components as stored."""
    if requested is not None:
        raise QuantizationError(f"{origin} is quantized: a from_pretrained directory keeps its "
                                "stored components; pass dtype='auto'")
