"""Where each tensor of a pulled module lives, and the hooks that let the module run there.

:func:`plan` turns ``device=`` / ``device_map=`` / ``max_memory=`` / ``no_split=`` into a
:class:`Placement`: module prefix -> device, and through it every state-dict key -> device.

``device_map="auto"`` plans *units* in model order: a module's own tensors, or a whole
``no_split`` block. A tied alias has no bytes of its own (the manifest stores only the kept
key), so its unit joins the unit of the tensor it shares: ``lm_head`` runs where
``transformer.wte``'s weight is. Devices fill in order (GPUs, then MPS, then the CPU) and the
first GPU keeps room for the largest unit, for the activations of the forward pass.

:func:`install_hooks` adds what a caller needs to run the result: on a split module, each placed
submodule moves its inputs to its device; with ``align_inputs=True`` the whole module takes
inputs from any device and dtype and answers on the device they came from.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import DeviceUnavailableError, SettingsError, quoted
from ..settings import parse_size
from . import devices as dev

DeviceMap = Mapping[str, dev.DeviceRequest] | str | None
NoSplit = Iterable[str] | None

_SHOWN = 5


@dataclass(frozen=True)
class Placement:
    """Module prefix -> device; every key lives on the device of its longest placed prefix."""

    modules: dict[str, torch.device]

    def device_of(self, key: str) -> torch.device:
        prefix = longest_prefix(key, self.modules)
        if prefix is None:  # plan() guarantees a home for every key of the module it planned
            raise DeviceUnavailableError(f"no device is planned for {quoted(key, 80)}")
        return self.modules[prefix]

    @property
    def devices(self) -> list[torch.device]:
        """The distinct devices used, in first-use order."""
        return list(dict.fromkeys(self.modules.values()))


@dataclass(frozen=True)
class Unit:
    """Module prefixes that must share a device, and the bytes they bring there."""

    names: tuple[str, ...]
    size: int


# -- sizes ------------------------------------------------------------------------------------

def tensor_bytes(spec: Mapping[str, Any], dtype: torch.dtype | None = None) -> int:
    """Bytes of a manifest tensor spec, stored or (with ``dtype``) once floats are cast."""
    stored: torch.dtype = getattr(torch, spec["dtype"])
    target = dtype if dtype is not None and stored.is_floating_point else stored
    return math.prod(spec["shape"]) * target.itemsize


def bytes_needed(manifest: Mapping[str, Any], dtype: torch.dtype | None = None) -> int:
    """Bytes the weights of ``manifest`` take on a device, as stored or cast to ``dtype``."""
    if dtype is None:
        return int(manifest["source"]["size_bytes"])
    return sum(tensor_bytes(spec, dtype) for spec in manifest["tensors"].values())


# -- planning ---------------------------------------------------------------------------------

def plan(
    module: nn.Module,
    manifest: Mapping[str, Any],
    *,
    device: dev.DeviceRequest = "auto",
    device_map: DeviceMap = None,
    max_memory: Mapping[str, int | str] | None = None,
    no_split: NoSplit = None,
    dtype: torch.dtype | None = None,
    facts: dev.TorchFacts,
    sizes: Mapping[str, int] | None = None,
) -> Placement:
    """Where every tensor of ``module`` (to be filled from ``manifest``) goes. ``sizes``
    (module key -> bytes) replaces the manifest's per-tensor sizes where stored tensors are
    not the module's (a quantized version's components)."""
    needed = bytes_needed(manifest, dtype)
    tied = dict(manifest["source"].get("tied", {}))
    if device_map != "auto":
        if max_memory is not None:
            raise SettingsError("max_memory only applies with device_map='auto'")
        if no_split is not None:
            raise SettingsError("no_split only applies with device_map='auto'")
    if device_map is None:
        target = dev.resolve_device(device, needed, facts)
        if dtype is not None:
            dev.check_dtype_runs(dtype, target)
        return Placement({"": target})
    if device != "auto":
        raise SettingsError("pass either device= or device_map=, not both")
    if device_map == "auto":
        if sizes is None:
            sizes = {k: tensor_bytes(v, dtype) for k, v in manifest["tensors"].items()}
        blocks = _no_split_classes(module, no_split)
        requested: Mapping[str, dev.DeviceRequest] = auto_device_map(
            module, sizes, max_memory, facts, no_split=blocks, tied=tied)
    elif isinstance(device_map, Mapping):
        _check_prefixes(module, device_map)
        requested = device_map
    else:
        raise SettingsError(f"invalid device_map {quoted(device_map, 60)}: use 'auto' or a dict "
                            "of module prefix -> device")
    keys = [k for k, _ in (*module.named_parameters(remove_duplicate=False),
                           *module.named_buffers(remove_duplicate=False))]
    placement = Placement(_resolve_map(requested, keys, needed, facts))
    _check_tied(placement, tied)
    if dtype is not None:
        for target in placement.devices:
            dev.check_dtype_runs(dtype, target)
    return placement


def _resolve_map(device_map: Mapping[str, dev.DeviceRequest], keys: list[str],
                 model_bytes: int, facts: dev.TorchFacts) -> dict[str, torch.device]:
    """Resolve every device named in a device map and check every key has a home."""
    resolved: dict[str, torch.device] = {}
    for prefix, request in device_map.items():
        # Memory is checked per plan, not per device: pass 0 so a GPU is not refused for the whole.
        resolved[prefix] = dev.resolve_device(request, 0, facts) if request != "auto" else \
            dev.resolve_device("auto", model_bytes, facts)
    homeless = [k for k in keys if longest_prefix(k, resolved) is None]
    if homeless:
        raise DeviceUnavailableError(
            f"device_map places no prefix of {homeless[0]!r}"
            + (f" (and {len(homeless) - 1} more keys)" if len(homeless) > 1 else "")
            + "; add a default entry such as '': 'cpu'"
        )
    return resolved


def _check_prefixes(module: nn.Module, device_map: Mapping[str, Any]) -> None:
    names = {name for name, _ in module.named_modules(remove_duplicate=False)}
    unknown = [p for p in device_map if not isinstance(p, str) or p not in names]
    if unknown:
        raise SettingsError(
            f"device_map entry {quoted(unknown[0], 60)} names no submodule of the model; use "
            f"module names such as {', '.join(repr(n) for n in sorted(names)[:_SHOWN])}"
        )


def _check_tied(placement: Placement, tied: Mapping[str, str]) -> None:
    """A tied alias's module must run where the one shared tensor lives."""
    for alias, kept in tied.items():
        here, there = placement.device_of(alias), placement.device_of(kept)
        if here != there:
            owner = alias.rpartition(".")[0] or "<root>"
            raise SettingsError(
                f"device_map puts {owner!r} on {here} but its {alias!r} is tied to {kept!r} on "
                f"{there} (one tensor); map {owner!r} to {there} too, or use device_map='auto'"
            )


def _no_split_classes(module: nn.Module, no_split: NoSplit) -> frozenset[str]:
    if no_split is None:
        return frozenset(getattr(module, "_no_split_modules", None) or ())
    names = [no_split] if isinstance(no_split, str) else list(no_split)
    present = {type(m).__name__ for m in module.modules()}
    unknown = [n for n in names if n not in present]
    if unknown:
        raise SettingsError(
            f"no_split names {quoted(unknown[0], 60)} but the model has no module of that class; "
            f"its classes include {', '.join(sorted(present)[:_SHOWN * 2])}"
        )
    return frozenset(names)


def auto_device_map(
    module: nn.Module,
    sizes: Mapping[str, int],
    max_memory: Mapping[str, int | str] | None,
    facts: dev.TorchFacts,
    *,
    no_split: Iterable[str] = (),
    tied: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Plan ``device_map="auto"``: module prefix -> device name, tied groups and blocks whole."""
    budget = default_max_memory(facts) if max_memory is None else {
        _canonical_device(k, facts): parse_memory(v) for k, v in max_memory.items()
    }
    ordered = dict(sorted(budget.items(), key=lambda kv: _device_rank(kv[0])))
    return assign(plan_units(module, sizes, no_split=no_split, tied=tied or {}), ordered)


def plan_units(
    module: nn.Module,
    sizes: Mapping[str, int],
    *,
    no_split: Iterable[str] = (),
    tied: Mapping[str, str],
) -> list[Unit]:
    """The units of ``module`` in model order: each ``no_split`` block whole, else each
    module's own tensors; units that share a tied tensor merge at the first one's place."""
    blocks = frozenset(no_split)
    raw: list[tuple[str, int]] = []
    owner: dict[str, int] = {}
    inside: str | None = None
    for name, sub in module.named_modules(remove_duplicate=False):
        if inside is not None and (inside == "" or name.startswith(inside + ".")):
            continue
        whole = type(sub).__name__ in blocks
        inside = name if whole else None
        own = [f"{name}.{t}" if name else t for t, _ in
               (*sub.named_parameters(recurse=whole, remove_duplicate=False),
                *sub.named_buffers(recurse=whole, remove_duplicate=False))]
        if own:
            for key in own:
                owner[key] = len(raw)
            raw.append((name, sum(sizes.get(k, 0) for k in own)))
    parent = list(range(len(raw)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for alias, kept in tied.items():
        if alias in owner and kept in owner:
            a, b = root(owner[alias]), root(owner[kept])
            parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(raw)):
        groups.setdefault(root(i), []).append(i)
    return [Unit(tuple(raw[i][0] for i in members), sum(raw[i][1] for i in members))
            for _, members in sorted(groups.items())]


def assign(units: Sequence[Unit], max_memory: Mapping[str, int]) -> dict[str, str]:
    """Place each unit on the first device with room, in order; a unit never splits.

    ``max_memory`` is ordered: GPUs first, then the CPU. The first GPU keeps room for the
    largest unit. Once placement moves to the next device it never goes back, so a model runs
    through its devices in order. Pure: sizes in, module prefix -> device name out.
    """
    order = list(max_memory)
    left = dict(max_memory)
    reserve = max((u.size for u in units), default=0)
    first_gpu = next((d for d in order if d != "cpu"), None)
    if first_gpu is not None:
        left[first_gpu] = max(0, left[first_gpu] - reserve)
    placement: dict[str, str] = {}
    position = 0
    for unit in units:
        while position < len(order) and left[order[position]] < unit.size:
            position += 1
        if position == len(order):
            budget = ", ".join(f"{d}={_gib(b)}" for d, b in max_memory.items())
            kept = f"; {first_gpu} keeps {_gib(reserve)} for activations" if first_gpu else ""
            raise DeviceUnavailableError(
                f"module {unit.names[0] or '<root>'!r} needs {_gib(unit.size)} and no device has "
                f"that much left (max_memory: {budget}{kept}); raise max_memory or add a device"
            )
        target = order[position]
        left[target] -= unit.size
        placement.update(dict.fromkeys(unit.names, target))
    return placement


def default_max_memory(facts: dev.TorchFacts) -> dict[str, int]:
    """What ``device_map="auto"`` may fill without ``max_memory``: most of each GPU's free
    memory, and the available RAM."""
    budget: dict[str, int] = {
        f"cuda:{d.index}": int(d.free_bytes * dev.AUTO_FIT_FRACTION) for d in facts.cuda
    }
    if facts.mps:
        budget["mps"] = int((facts.cpu_bytes or 0) * dev.AUTO_FIT_FRACTION)
    budget["cpu"] = facts.cpu_bytes if facts.cpu_bytes is not None else 2**62
    return budget


def parse_memory(value: int | str) -> int:
    """``"10GiB"``, ``"512MB"`` or an int -> bytes."""
    try:
        return parse_size(value, "max_memory")
    except SettingsError:
        raise DeviceUnavailableError(
            f"invalid memory size {str(value)[:40]!r} in max_memory: use bytes or a string such "
            "as '10GiB'"
        ) from None


def longest_prefix(key: str, prefixes: Mapping[str, object]) -> str | None:
    """The longest module-name prefix of ``key`` in ``prefixes`` (``""`` matches everything)."""
    parts = key.split(".")
    for end in range(len(parts), -1, -1):
        candidate = ".".join(parts[:end])
        if candidate in prefixes:
            return candidate
    return None


def _canonical_device(name: str, facts: dev.TorchFacts) -> str:
    device = dev.resolve_device(name, 0, facts)
    return f"cuda:{device.index}" if device.type == "cuda" else device.type


def _device_rank(name: str) -> tuple[int, int]:
    if name.startswith("cuda"):
        return (0, int(name.partition(":")[2] or 0))
    return (1, 0) if name == "mps" else (2, 0)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


# -- hooks ------------------------------------------------------------------------------------

def install_hooks(module: nn.Module, placement: Placement, *, align_inputs: bool = False) -> None:
    """Make ``module`` runnable where ``placement`` put it.

    A split module gets a forward pre-hook on each placed submodule that moves its tensor inputs
    to that submodule's device. ``align_inputs=True`` also makes the whole module accept inputs on
    any device and in any floating dtype (they are moved to its device and cast to its floating
    dtype) and return its outputs on the device the first input tensor came from.
    """
    if align_inputs:
        _align_whole(module)
    if len(placement.devices) > 1:
        for name, device in placement.modules.items():
            sub = module.get_submodule(name) if name else module

            def move(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     device: torch.device = device) -> tuple[tuple[Any, ...], dict[str, Any]]:
                return convert(args, device), convert(kwargs, device)

            sub.register_forward_pre_hook(move, with_kwargs=True)


def _align_whole(module: nn.Module) -> None:
    tensors = [*module.parameters(), *module.buffers()]
    if not tensors:
        return
    device = tensors[0].device
    counts: dict[torch.dtype, int] = {}
    for p in module.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    dtype = max(counts, key=lambda d: counts[d]) if counts else None
    origins = threading.local()

    def before(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        stack = origins.__dict__.setdefault("stack", [])
        stack.append(_first_device((args, kwargs)))
        return convert(args, device, dtype), convert(kwargs, device, dtype)

    def after(_m: nn.Module, _args: tuple[Any, ...], _kwargs: dict[str, Any],
              output: Any) -> Any:
        stack = origins.__dict__.get("stack")
        origin = stack.pop() if stack else None
        return output if origin is None else convert(output, origin)

    module.register_forward_pre_hook(before, with_kwargs=True)
    # always_call: the origin is popped even when forward raises, so the stack stays balanced.
    module.register_forward_hook(after, with_kwargs=True, always_call=True)


def _first_device(value: Any) -> torch.device | None:
    if isinstance(value, torch.Tensor):
        return value.device
    items = value.values() if isinstance(value, dict) else \
        value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _first_device(item)
        if found is not None:
            return found
    return None


def convert(value: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """``value`` with every tensor in it (nested in lists, tuples, dicts) moved to ``device``;
    floating tensors are also cast to ``dtype`` when one is given."""
    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            return value.to(device=device, dtype=dtype)
        return value.to(device)
    if isinstance(value, tuple):
        items = [convert(v, device, dtype) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [convert(v, device, dtype) for v in value]
    if isinstance(value, dict):
        if type(value) is dict:
            return {k: convert(v, device, dtype) for k, v in value.items()}
        out = copy.copy(value)  # keeps the type (OrderedDict, transformers' ModelOutput)
        for k, v in value.items():
            out[k] = convert(v, device, dtype)
        return out
    return value
