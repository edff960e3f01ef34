"""The interface every quantization format implements, what push gets from the formats, and the
steps a pull takes for a version's format.

A format is one module of this package (``torchao.py``, ``dynamic.py``, ``ctensors.py``) that
satisfies :class:`Format` by its module-level names, as ``transformers/quantizers/`` has one
file per method behind ``base.py``'s interface. ``table.py`` maps a recorded library to its
module and is the only module that imports one: push asks the table once to detect and flatten
a model, and pull hands it the version once (:meth:`Format.pull`): the format decides its
:class:`Steps`, the pipeline reads the tensors by them (a callback, :data:`ReadBy`), and the
format's :class:`Rebuild` makes the module's state of what was read, all in one visit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ..errors import SchemeDeviceError
from ..model import devices as dev

if TYPE_CHECKING:
    from ..refs import Ref

log = logging.getLogger(__name__)


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


class Rebuild(Protocol):
    """A format's own part of a pull, once the stored tensors are read onto their devices (the
    rest of its steps are facts it decided at look-up, :class:`Steps`)."""

    @property
    def name(self) -> str:
        """``"LIBRARY METHOD"``, as messages name the format."""

    def rebuild(self, module: nn.Module, state: dict[str, Any],
                dequantize: torch.dtype | None) -> dict[str, Any]:
        """The module-keyed state from the stored components (``module``, the built model,
        given what the format needs), or float tensors when ``dequantize`` names a dtype."""

    def state_dict(self, state: dict[str, Any], dequantize: torch.dtype | None) -> dict[str, Any]:
        """What ``pull_state_dict`` returns from the stored components (dequantized when asked)."""

    def pretrained(self, requested: torch.dtype | None
                   ) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """The ``quantization_config`` and safetensors metadata of a ``from_pretrained``
        directory of the version (a QuantizationError where transformers cannot load it)."""


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


@dataclass(frozen=True)
class Shell:
    """A float module put where a model given at pull (``model=``) holds a quantized one of
    type ``replaces``, so the later steps fill it as the float builder's; the format's rebuild
    swaps the quantized module back in."""

    replaces: type
    build: Callable[[], nn.Module]


@dataclass(frozen=True)
class Steps:
    """What a pull does for a version's format, decided once by the format's ``pull`` (or
    ``table.lookup``): each step applies these facts (a float version's, all left empty,
    leave what they are given as it is); the format's :class:`Rebuild` (``format``) is run by
    the format's ``pull`` on what the pipeline read by them."""

    origin: str = ""
    runs: Runs | None = None  # where its kernels run; None: wherever torch runs (floats)
    names: frozenset[str] | None = None  # the module's keys, where the format lists them
    drop: frozenset[str] = frozenset()  # stored keys that are parts of another module key
    logical: Mapping[str, list[int]] = field(default_factory=dict)  # key -> its float shape
    components: Mapping[str, str] = field(default_factory=dict)  # stored part -> its module key
    shells: Mapping[str, Shell] = field(default_factory=dict)  # module path -> its float shell
    format: Rebuild | None = None  # the format's rebuild; None: a float version's

    @property
    def name(self) -> str:
        return "floats" if self.format is None else self.format.name

    def auto_device(self, request: dev.DeviceRequest, facts: dev.TorchFacts) -> dev.DeviceRequest:
        """``"auto"`` among the devices that run the format; a named device is left as asked."""
        if self.runs is None or not (isinstance(request, str) and request == "auto"):
            return request
        runnable = [d for d in facts.available() if self.runs.on(torch.device(d), facts)]
        if runnable and not any(d.startswith("cuda") for d in runnable) and facts.cuda:
            log.info("%s: %s has no CUDA kernels; device='auto' pulls it onto %s", self.origin,
                     self.name, runnable[0])
            return runnable[0]
        return request

    def module_keys(self, stored: Iterable[str]) -> set[str]:
        """The module's state-dict keys the stored keys fill."""
        if self.names is not None:
            return set(self.names)
        return (set(stored) - self.drop) | set(self.logical)

    def skeleton(self, module: nn.Module) -> nn.Module:
        """The built module as the later steps fill it: each shell where a quantized module of
        its kind is (a model given as ``model=`` may hold them; one missing is left for
        check_fits to name)."""
        for path, shell in self.shells.items():
            parent_path, _, attr = path.rpartition(".")
            try:
                parent = module.get_submodule(parent_path)
            except AttributeError:
                continue
            if isinstance(parent._modules.get(attr), shell.replaces):
                parent._modules[attr] = shell.build()
        return module

    def shapes(self, specs: dict[str, Any]) -> dict[str, Any]:
        """The module keys' shapes: a quantized weight's is its logical (float) shape."""
        out = {k: v for k, v in specs.items() if k not in self.drop
               and (self.names is None or k in self.names)}
        out.update({k: {"shape": list(v)} for k, v in self.logical.items()})
        return out

    def owners(self) -> dict[str, str]:
        """Stored component key -> the module key it belongs to (none: each is its own)."""
        return dict(self.components)

    def sizes(self, manifest: Mapping[str, Any]) -> dict[str, int] | None:
        """Stored bytes per module key: the components of a quantized weight count for it, so
        ``device_map='auto'`` plans by what the device will hold, not the float size (None:
        a float version's, planned by its tensors)."""
        if self.format is None:
            return None
        out: dict[str, int] = {}
        for key, spec in manifest["tensors"].items():
            size = math.prod(spec["shape"]) * getattr(torch, spec["dtype"]).itemsize
            owner = self.components.get(key, key)
            out[owner] = out.get(owner, 0) + size
        return out

    def check_devices(self, devices: Iterable[torch.device], facts: dev.TorchFacts,
                      dequantize: torch.dtype | None) -> None:
        """Refuse a device without kernels for the format, unless floats were asked for."""
        if self.runs is None or dequantize is not None:
            return
        for device in devices:
            if not self.runs.on(device, facts):
                can = ", ".join(self.runs.labels()) or "none known"
                raise SchemeDeviceError(
                    f"{self.origin} is quantized with {self.name}, which has no kernels on "
                    f"{device}; it runs on: {can}. Pull onto one of those, or pass "
                    "dtype='float32' (or 'bfloat16') to dequantize on load")

    def policy(self, policy: Any) -> Any:
        """A quantized version's components are read byte for byte; rebuild casts when asked."""
        return policy if self.format is None else stored_dtype

    def pretrained(self, requested: torch.dtype | None
                   ) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """The ``quantization_config`` and safetensors metadata a ``from_pretrained`` directory
        of the version needs: none for a float version."""
        return (None, None) if self.format is None else self.format.pretrained(requested)


@dataclass(frozen=True)
class Read:
    """What the pull pipeline read for a version by its format's :class:`Steps` (the callback
    :data:`ReadBy` a format's ``pull`` calls once): the module built for the tensors (None where
    a state dict is pulled), the stored tensors on their devices, and what the pipeline keeps
    for after the rebuild (``placed``: the module's placement). A format's ``pull`` hands it back
    with ``state`` rebuilt."""

    steps: Steps
    module: nn.Module | None
    state: dict[str, Any]
    placed: Any = None


# The pipeline's part of a pull, given the steps of the version's format: build, place, read.
ReadBy = Callable[[Steps], Read]


def stored_dtype(key: str, stored: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype policy of a quantized pull: components are read as stored, byte for byte."""
    return stored


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
        specs), and the pull's :class:`Steps`: where it runs, which stored keys make
        which module key and its logical shape, and its :class:`Rebuild` (dequantize too)."""

    def pull(self, record: dict[str, Any], manifest: Mapping[str, Any], origin: str,
             dequantize: torch.dtype | None, read: ReadBy) -> Read:
        """Pull, the format's one visit: its :func:`steps`, the pipeline's ``read`` by them,
        and what was read rebuilt (the module's state, or ``pull_state_dict``'s where no module
        was built; floats when ``dequantize`` names a dtype)."""
