"""PEFT's LoRA layers for an adapter's pull: built by PEFT once per kind, copied for the rest.

PEFT builds each LoRA layer in Python (``lora.Linear.__init__``: ten modules, forty attribute
sets through ``nn.Module.__setattr__``), ~0.4 ms a layer here: most of attaching an adapter to
its base. The layers of one adapter differ only in their base layer and their name, and between
shapes in their sizes. Inside :func:`copying`, PEFT's ``LoraModel`` still matches, creates,
replaces, freezes and activates every layer itself; only its ``_create_new_module`` changes: the
first layer of each kind is PEFT's own, and every other layer of that kind is a copy of it (new
modules, new parameters on ``meta``, its own base layer and name), made in ~0.03 ms.

A copy is made only where it is what PEFT would build: the target an exact ``nn.Linear`` with
nothing but plain flags added to it (no quantized weight, no hooks from accelerate or tensor
parallelism; a flag is part of its kind, so it is built for each value), a
plain LoRA layer from PEFT (no DoRA or other variant, no LoRA bias, no tied adapter), its
parameters on ``meta`` (the pull's ``low_cpu_mem_usage``), and everything else in it plain
values, containers of them and modules. Anything else (a layer that keeps its name or its base
somewhere else, an object of an unknown type, a global registration hook that must see each
module built) and PEFT builds that layer as it always does.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as torch_module

# Values a copy may share or copy by value: what a plain PEFT LoRA layer holds besides modules.
_SCALARS = (type(None), bool, int, float, str, torch.device, torch.dtype)
_CONTAINERS = (dict, OrderedDict, list, tuple, set)  # OrderedDict: nn.Module's hook tables
_MUTABLE = (dict, OrderedDict, list, set)
# Attributes of a plain nn.Linear (its weight and bias live in _parameters), read from a bare
# module rather than built at import: anything more on a target is part of its kind.
_LINEAR_STATE = frozenset(nn.Module().__dict__) | {"in_features", "out_features"}

_local = threading.local()
_lock = threading.Lock()
_users = 0
_original: Callable[..., nn.Module] | None = None


@contextlib.contextmanager
def copying() -> Iterator[None]:
    """Within the block, in this thread, each kind of LoRA layer ``peft.get_peft_model`` creates
    is built by PEFT once and copied for its other targets. Other threads are untouched."""
    global _users, _original
    from peft.tuners.lora.model import LoraModel

    if not isinstance(LoraModel.__dict__.get("_create_new_module"), staticmethod):
        yield  # a PEFT whose LoraModel builds layers otherwise: it builds every one
        return
    with _lock:
        if _users == 0:
            _original = LoraModel.__dict__["_create_new_module"].__func__
            LoraModel._create_new_module = staticmethod(_create_new_module)  # type: ignore[method-assign]
        _users += 1
    outer = getattr(_local, "kinds", None)
    _local.kinds = [] if outer is None else outer
    try:
        yield
    finally:
        _local.kinds = outer
        with _lock:
            _users -= 1
            if _users == 0:
                LoraModel._create_new_module = staticmethod(_original)  # type: ignore[method-assign, arg-type]


def _create_new_module(lora_config: Any, adapter_name: str, target: nn.Module,
                       **kwargs: Any) -> nn.Module:
    original = _original
    assert original is not None  # installed only by copying(), which sets it first
    kinds: list[tuple[Any, tuple[Any, ...], dict[str, Any], _Plan]] | None = \
        getattr(_local, "kinds", None)
    name = kwargs.get("target_name")
    if kinds is None or not isinstance(name, str) or not _plain_target(target) \
            or not _plain(kwargs) or registration_hooks():
        return original(lora_config, adapter_name, target, **kwargs)
    rest = {key: value for key, value in kwargs.items() if key != "target_name"}
    weight = target.weight
    kind = (adapter_name, target.in_features, target.out_features, target.bias is not None,
            weight.dtype, weight.device, weight.requires_grad,
            tuple(sorted((key, value) for key, value in vars(target).items()
                         if key not in _LINEAR_STATE)))
    for config, seen, seen_rest, template in kinds:
        if config is lora_config and seen == kind and seen_rest == rest:
            return _copy(template, target, name)
    built = original(lora_config, adapter_name, target, **kwargs)
    if _copyable(built, target, name):
        # Planned from the layer as PEFT built it, before its replacement in the model.
        kinds.append((lora_config, kind, rest, _plan(built)))
    return built


def _plain_target(target: nn.Module) -> bool:
    weight = getattr(target, "weight", None)
    # Attributes added to it (transformers' _is_hf_initialized) are part of its kind, and
    # must be plain scalars: an object (an accelerate hook, a device mesh) makes PEFT build it.
    return (type(target) is nn.Linear
            and all(isinstance(value, _SCALARS) for key, value in vars(target).items()
                    if key not in _LINEAR_STATE)
            and type(weight) is nn.Parameter and type(weight.data) is torch.Tensor
            and not vars(weight) and not hooked(target))


def _plain(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    if type(value) in _CONTAINERS:
        items = value.items() if isinstance(value, dict) else ((v, v) for v in value)
        return all(isinstance(k, _SCALARS) and _plain(v) for k, v in items)
    return False


def registration_hooks() -> bool:
    """Whether a global module, parameter or buffer registration hook is set
    (``torch.nn.modules.module.register_module_*_registration_hook``): it must see PEFT build
    every module, which neither a copy nor a replay (replay.py) registers."""
    return any(getattr(torch_module, name, None) for name in (
        "_global_module_registration_hooks", "_global_parameter_registration_hooks",
        "_global_buffer_registration_hooks"))


def slotted(cls: type) -> bool:
    """Whether instances of ``cls`` keep state in slots (which a copy of ``__dict__`` misses);
    abc.ABC's empty slots hold none."""
    return any(vars(c).get("__slots__") for c in cls.__mro__)


def hooked(module: nn.Module) -> bool:
    """Whether ``module`` has a hook of any kind."""
    return any(value for key, value in module.__dict__.items()
               if key.endswith("_hooks") or key.endswith("_hooks_with_kwargs")
               or key == "_forward_hooks_always_called")


def _copyable(layer: nn.Module, target: nn.Module, name: str) -> bool:
    """Whether ``layer`` (PEFT's, for ``target``) can be copied for another target: a plain
    LoRA Linear whose only ties to ``target`` and its name are its base layer and
    ``kwargs["target_name"]``, and whose every other part is a module, a ``meta`` parameter or
    a plain value."""
    from peft.tuners.lora.layer import Linear

    if type(layer) is not Linear or layer.__dict__["_modules"].get("base_layer") is not target:
        return False
    if getattr(layer, "lora_variant", None) or any(getattr(layer, "lora_bias", {}).values()):
        return False
    kwargs = layer.__dict__.get("kwargs")
    if not isinstance(kwargs, dict) or kwargs.get("target_name") != name \
            or kwargs.get("tied_adapter"):
        return False
    return _copyable_module(layer, target, name, root=True)


def _copyable_module(module: nn.Module, target: nn.Module, name: str, *, root: bool) -> bool:
    # State in slots (not in __dict__) would not be copied; abc.ABC's empty slots hold none.
    if hooked(module) or module.__dict__.get("_buffers") \
            or slotted(type(module)):
        return False
    for key, value in module.__dict__.items():
        if value is None or type(value) is bool or (type(value) in _MUTABLE and not value):
            continue  # most of a module's state: flags and empty hook tables
        if key == "_modules":
            for child_name, child in value.items():
                if root and child_name == "base_layer":
                    continue
                if not isinstance(child, nn.Module) or child is target \
                        or not _copyable_module(child, target, name, root=False):
                    return False
        elif key == "_parameters":
            for param in value.values():
                if param is not None and (type(param) is not nn.Parameter or not param.is_meta
                                          or vars(param)):
                    return False
        elif root and key == "kwargs":
            if not _plain({k: v for k, v in value.items() if k != "target_name"}) \
                    or name in _strings(value, skip="target_name"):
                return False
        elif value == name if type(value) is str else not _plain(value) or name in _strings(value):
            return False
    return True


def _strings(value: Any, skip: str | None = None) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return {s for k, v in value.items() if k != skip for s in _strings(k) | _strings(v)}
    if isinstance(value, (list, tuple, set)):
        return {s for v in value for s in _strings(v)}
    return set()


@dataclass(frozen=True)
class _Plan:
    """How to copy one module of a layer :func:`_copyable` accepted: its attributes (plain
    values, shared where immutable), its empty containers (most are nn.Module's hook tables) and
    the others to copy, its parameters (on ``meta``: shape, dtype, requires_grad) and its
    children (``None``: the base layer)."""

    cls: type[nn.Module]
    state: dict[str, Any]
    empty: tuple[tuple[str, type], ...]
    containers: tuple[str, ...]
    params: tuple[tuple[str, torch.Size, torch.dtype, bool] | tuple[str, None, None, None], ...]
    children: tuple[tuple[str, _Plan | None], ...]


def _plan(module: nn.Module, *, root: bool = True) -> _Plan:
    state = dict(module.__dict__)
    params = tuple((key, None, None, None) if p is None
                   else (key, p.shape, p.dtype, p.requires_grad)
                   for key, p in state.pop("_parameters").items())
    children = tuple((key, None if root and key == "base_layer" else _plan(child, root=False))
                     for key, child in state.pop("_modules").items())
    empty = tuple((key, type(value)) for key, value in state.items()
                  if type(value) in _MUTABLE and not value)
    containers = tuple(key for key, value in state.items() if type(value) in _MUTABLE and value)
    for key in containers:  # as they are now: PEFT goes on with the layer it built
        state[key] = _value_copy(state[key])
    return _Plan(type(module), state, empty, containers, params, children)


def _copy(plan: _Plan, base: nn.Module, name: str, *, root: bool = True) -> nn.Module:
    """A new module from ``plan``: new modules and ``meta`` parameters, plain values copied,
    ``base`` as its base layer and ``name`` as its target name."""
    new: nn.Module = object.__new__(plan.cls)
    state = plan.state.copy()
    for key, kind in plan.empty:
        state[key] = kind()
    for key in plan.containers:
        state[key] = _value_copy(state[key])
    if root:
        state["kwargs"]["target_name"] = name
    state["_parameters"] = {key: None if shape is None else nn.Parameter(
        torch.empty(shape, dtype=dtype, device="meta"), requires_grad=bool(grad))
        for key, shape, dtype, grad in plan.params}
    state["_modules"] = {key: base if child is None else _copy(child, base, name, root=False)
                         for key, child in plan.children}
    vars(new).update(state)
    return new


def _value_copy(value: Any) -> Any:
    """A plain value with every container in it new (immutable values shared)."""
    kind = type(value)
    if kind is dict or kind is OrderedDict:
        out = value.copy()
        for key, item in value.items():
            if type(item) in _MUTABLE:
                out[key] = _value_copy(item)
        return out
    if kind is list or kind is set:
        return kind(_value_copy(item) if type(item) in _MUTABLE else item for item in value)
    return value
