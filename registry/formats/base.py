"""The interface every quantization format implements, and what push gets from the formats.

A format is one module of this package (``torchao.py``, ``dynamic.py``, ``ctensors.py``) that
satisfies :class:`Format` by its module-level names, as ``transformers/quantizers/`` has one
file per method behind ``base.py``'s interface. ``table.py`` maps a recorded library to its
module and is the only module that imports one: push asks the table once to detect and flatten
a model, pull asks it once for a version's :class:`Steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

if TYPE_CHECKING:
    from .. import devices as dev
    from ..refs import Ref
    from .common import Runs


@dataclass
class Flat:
    """What push stores of a model in a format: plain tensors (and non-tensor entries) under
    their stored keys, and the manifest's record of the format."""

    state: dict[str, Any]
    record: dict[str, Any]
    # The float model's keys and shapes, where they are not the quantized module's own.
    signature: dict[str, tuple[int, ...]] | None = None


@dataclass(frozen=True)
class Bases:
    """Where push finds the base version of an adapter (``lora.py``): the one named
    (``base="gpt2:v1"``), resolved by ``resolve`` (the backend's), else the stored versions,
    newest first."""

    named: Ref | None = None
    resolve: Callable[[Ref], Any] | None = None
    versions: Callable[[], Iterable[Any]] = tuple


@dataclass
class NormalizedWeights:
    """What push gets from the formats (``table.flatten``): tensors ready to serialize, plus
    what the manifest records about them."""

    tensors: dict[str, torch.Tensor]
    tied: dict[str, str] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    architecture: dict[str, Any] = field(default_factory=dict)
    # Each module's state-dict version (prefix -> {"version": N}) and every key in pushed order.
    module_metadata: dict[str, dict[str, int]] = field(default_factory=dict)
    key_order: list[str] = field(default_factory=list)
    # The manifest's sections of its format: "quantization" or "adapter" -> its record.
    sections: dict[str, Any] = field(default_factory=dict)
    # The manifest's ``tensors``: each stored key's dtype and shape.
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    name: str | None = None  # the version's default name, where its format gives one


class Steps(Protocol):
    """What a pull asks of a version's format, step by step (:class:`common.Plain` is a float
    version's: each step leaves what it is given as it is)."""

    def auto_device(self, request: dev.DeviceRequest,
                    facts: dev.TorchFacts) -> dev.DeviceRequest:
        """``device="auto"`` among the devices that run the format."""

    def module_keys(self, stored: Iterable[str]) -> set[str]:
        """The module's state-dict keys the stored keys fill."""

    def skeleton(self, module: nn.Module) -> nn.Module:
        """The built module as the later steps fill it."""

    def shapes(self, specs: dict[str, Any]) -> dict[str, Any]:
        """The module keys' shapes: a quantized weight's is its logical (float) shape."""

    def sizes(self, manifest: Mapping[str, Any]) -> dict[str, int] | None:
        """Stored bytes per module key, for ``device_map`` planning (None: the float sizes)."""

    def check_devices(self, devices: Iterable[torch.device], facts: dev.TorchFacts,
                      dequantize: torch.dtype | None) -> None:
        """Refuse a device that does not run the format (unless floats were asked for)."""

    def policy(self, policy: Any) -> Any:
        """The dtype policy the shards are read with."""

    def rebuild(self, module: Any, state: dict[str, Any],
                dequantize: torch.dtype | None) -> dict[str, Any]:
        """The module-keyed state from the stored tensors, on their devices; float tensors
        when ``dequantize`` names a dtype."""

    def state_dict(self, state: dict[str, Any], dequantize: torch.dtype | None) -> dict[str, Any]:
        """What ``pull_state_dict`` returns from the stored tensors (dequantized when asked)."""

    def owners(self) -> dict[str, str]:
        """Stored component key -> the module key it belongs to."""

    def pretrained(self, requested: torch.dtype | None
                   ) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """The ``quantization_config`` and safetensors metadata of a ``from_pretrained``
        directory of the version."""


class Format(Protocol):
    """A quantization format: one module of this package, by its module-level names."""

    @property
    def LIBRARY(self) -> str:  # noqa: N802 - a module's constant
        """The library a manifest's ``quantization`` record names (``record["library"]``)."""

    @property
    def METHODS(self) -> Mapping[str, Runs]:  # noqa: N802 - a module's constant
        """Each method it records (``record["method"]``) -> the devices that run it."""

    def flatten(self, module: nn.Module, state: Mapping[str, Any]) -> Flat | None:
        """Push: detect and flatten. ``module`` (unwrapped; its state dict is ``state``) as
        plain tensors and its record when it is in this format, else None; a model in this
        format that cannot be stored faithfully is refused."""

    def check(self, record: dict[str, Any]) -> str | None:
        """Why a manifest's record of this format is malformed (the common fields, library,
        method and counts, are checked already), or None."""

    def steps(self, record: dict[str, Any], manifest: Mapping[str, Any],
              origin: str) -> Steps:
        """Pull: the checked record against the version's stored tensors (their manifest
        specs), and the steps that rebuild the module, dequantize and name its devices."""
