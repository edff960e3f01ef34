"""Stored tensors -> a state dict or a module on the requested device(s) and dtype, in one copy.

The module is built with its parameters on the ``meta`` device (no memory, no random init) and
filled by assignment (``load_state_dict(assign=True)``, or the same assignments done directly
where no module loads its own way: :func:`assign_plainly`), so the tensors read from the file
*are* the module's weights. Each tensor is cast and moved in a single ``Tensor.to`` call; a
tensor already on the right device with the right dtype is not copied at all (the file's memory
map backs it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import ArchitectureUnknownError, RegistryError, StateDictMismatchError, quoted
from . import architectures
from . import devices as dev
from .factories import resolve_factory
from .keyfit import likely_cause
from .metaparams import empty_parameters

ModelSpec = nn.Module | Callable[[], nn.Module] | None

_MISMATCH_SHOWN = 5
log = logging.getLogger(__name__)


# -- which dtype each tensor gets -------------------------------------------------------------

class DtypePolicy:
    """Decides the dtype of each stored tensor on its target device."""

    def __init__(self, requested: torch.dtype | None, keep_in_fp32: list[str],
                 facts: dev.TorchFacts) -> None:
        self.requested = requested
        self.keep_patterns = [f".{p}." for p in keep_in_fp32]
        self.facts = facts

    def __call__(self, key: str, stored: torch.dtype, device: torch.device) -> torch.dtype:
        if not stored.is_floating_point:
            return stored  # integer and bool tensors are never cast
        if self.keep_patterns and any(p in f".{key}" for p in self.keep_patterns):
            return torch.float32
        if self.requested is None:
            return dev.auto_dtype(stored, device, self.facts)
        return self.requested


# -- building the module ----------------------------------------------------------------------

def build_module(
    model: ModelSpec,
    architecture: Mapping[str, Any],
    trusted_prefixes: tuple[str, ...],
    ref: str,
    stored: Collection[str] | None = None,
) -> nn.Module:
    """The module to fill: ``model=``, else the transformers class or factory recorded at push.

    A callable or factory is built with its parameters on ``meta``; where that raises, or
    leaves on ``meta`` a tensor that ``stored`` (the keys the weights fill) lacks, the module
    is built again normally on the CPU (see :func:`build_on_meta_or_cpu`).
    """
    if isinstance(model, nn.Module):
        return model
    if model is not None:
        if not callable(model):
            raise ArchitectureUnknownError(
                f"model= must be an nn.Module or a zero-argument callable, got "
                f"{type(model).__name__}"
            )
        return build_on_meta_or_cpu(model, repr(model), stored)
    recorded_build = architectures.builder(architecture, ref)
    if recorded_build is not None:
        origin = str(architecture.get("class"))
        try:
            return build_on_meta_or_cpu(recorded_build, origin, stored)
        except RegistryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a recorded config is untrusted input
            raise ArchitectureUnknownError(
                f"{ref}: building {origin} from its recorded config failed ({type(exc).__name__}"
                f": {quoted(str(exc))}); pass model= to pull") from None
    factory = architecture.get("factory")
    if not factory:
        recorded = architecture.get("class")
        hint = f" (it was pushed from a {recorded})" if recorded else ""
        raise ArchitectureUnknownError(
            f"{ref} records no factory to build the model{hint}: pass model=YourModel(...) or a "
            "zero-argument callable, or use pull_state_dict() for the weights alone"
        )
    target = _import_factory(factory, trusted_prefixes)
    kwargs = dict(architecture.get("factory_kwargs") or {})
    return build_on_meta_or_cpu(lambda: target(**kwargs), factory, stored)


def build_on_meta_or_cpu(make: Callable[[], object], origin: str,
                         stored: Collection[str] | None) -> nn.Module:
    """``make()`` with its parameters on ``meta`` when that builds the same module, else a
    normal CPU build: correct first, then one copy where possible.

    Some constructors cannot run on ``meta`` (a forward pass while building, a buffer computed
    from parameters, a copy out of a parameter): they raise, or leave a buffer on ``meta``
    that no stored tensor replaces. Random initialisation then costs time, and the loaded
    weights replace the initial ones by assignment, which frees them.
    """
    try:
        with empty_parameters():
            module = _checked_module(make(), origin)
    except ArchitectureUnknownError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure on meta is retried the normal way
        log.debug("building %s with parameters on meta failed (%s: %s); building it on the "
                  "CPU instead", origin, type(exc).__name__, str(exc)[:200])
        return _checked_module(make(), origin)
    unfilled = [] if stored is None else unfilled_meta_tensors(module, stored)
    if unfilled:
        log.debug("building %s with parameters on meta left %s on meta, which the stored "
                  "weights do not fill; building it on the CPU instead", origin,
                  ", ".join(unfilled[:_MISMATCH_SHOWN]))
        return _checked_module(make(), origin)
    return module


def unfilled_meta_tensors(module: nn.Module, stored: Collection[str]) -> list[str]:
    """Parameters and buffers of ``module`` on ``meta`` that no key in ``stored`` fills (a
    tensor the module shares between names is filled through any of them)."""
    named = [*module.named_parameters(remove_duplicate=False),
             *module.named_buffers(remove_duplicate=False)]
    filled = {id(t) for name, t in named if name in stored}
    return [name for name, t in named if t.is_meta and id(t) not in filled]


def implied_ties(module: nn.Module, stored: Collection[str]) -> dict[str, str]:
    """alias -> stored key, for every name the module shares a tensor under that ``stored``
    lacks while it holds another name of the same tensor.

    A ``save_pretrained`` checkpoint leaves out the tied copies (GPT-2's ``lm_head.weight``,
    T5's embeddings): the module built from its config ties them itself, so they are filled
    from the name that was stored, as transformers does."""
    groups: dict[int, list[str]] = {}
    for name, t in (*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)):
        groups.setdefault(id(t), []).append(name)
    out: dict[str, str] = {}
    for names in groups.values():
        kept = next((n for n in names if n in stored), None)
        if kept is not None:
            out.update({n: kept for n in names if n not in stored})
    return out


def _import_factory(factory: str, trusted_prefixes: tuple[str, ...]) -> Callable[..., Any]:
    # The factory rule lives in registry/model/factories.py: nothing is imported before it passes.
    return resolve_factory(factory, trusted_prefixes)


def _checked_module(built: object, origin: str) -> nn.Module:
    if not isinstance(built, nn.Module):
        raise ArchitectureUnknownError(
            f"{origin} returned a {type(built).__name__}, not an nn.Module; pass model= instead"
        )
    return built


# -- filling the module -----------------------------------------------------------------------

def check_fits(module: nn.Module, tensors: Mapping[str, Any], ref: str) -> None:
    """Raise :class:`StateDictMismatchError` before loading if keys or shapes disagree."""
    expected = module.state_dict(keep_vars=True)
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    if missing or unexpected:
        raise StateDictMismatchError(
            f"{ref} does not fit the model: "
            + "; ".join(
                part for part in (
                    _listing("missing", missing), _listing("unexpected", unexpected),
                ) if part
            )
            + f". {likely_cause(list(expected), list(tensors))}"
        )
    bad = [
        f"{k} stored {tuple(shape)} vs model {tuple(expected[k].shape)}"
        for k, shape in ((k, _shape(v)) for k, v in tensors.items())
        if shape is not None and tuple(expected[k].shape) != tuple(shape)
    ]
    if bad:
        raise StateDictMismatchError(
            f"{ref} does not fit the model: shape mismatch in {len(bad)} tensor(s): "
            f"{'; '.join(bad[:_MISMATCH_SHOWN])}. Build the model with the same configuration "
            "it was trained with (e.g. factory_kwargs or num_classes)"
        )


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, Mapping) and "shape" in value:
        return tuple(value["shape"])
    return None


def _listing(label: str, keys: list[str]) -> str:
    if not keys:
        return ""
    shown = ", ".join(keys[:_MISMATCH_SHOWN])
    more = f" and {len(keys) - _MISMATCH_SHOWN} more" if len(keys) > _MISMATCH_SHOWN else ""
    return f"{len(keys)} {label} key(s): {shown}{more}"


def fill_module(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    tied: Mapping[str, str],
    buffer_device: Callable[[str], torch.device],
) -> nn.Module:
    """Assign ``state`` into ``module``, tie aliases again, place leftover buffers, eval()."""
    if not assign_plainly(module, state):
        try:
            module.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as exc:
            raise StateDictMismatchError(f"loading the weights failed: {exc}") from None
    for alias, kept in tied.items():
        _tie(module, alias, kept)
    # One walk over the modules (a named_* walk each costs as much): buffers the state does not
    # hold go to their device, and whatever is still on meta is named.
    leftover: list[str] = []
    seen: set[int] = set()
    for owner_name, owner in module.named_modules():
        prefix = f"{owner_name}." if owner_name else ""
        for attr, param in owner._parameters.items():
            if param is not None and param.is_meta and id(param) not in seen:
                seen.add(id(param))
                leftover.append(prefix + attr)
        for attr, buf in list(owner._buffers.items()):
            if buf is None or id(buf) in seen:
                continue
            seen.add(id(buf))
            name = prefix + attr
            if name in state:
                if buf.is_meta:
                    leftover.append(name)
                continue
            if buf.is_meta:
                raise StateDictMismatchError(
                    f"buffer {name!r} is on the meta device and not stored; build the model "
                    "with real buffers (e.g. pass model= constructed normally)"
                )
            target = buffer_device(name)
            if buf.device != target:
                owner._buffers[attr] = buf.to(target)
    if leftover:
        raise StateDictMismatchError(
            f"parameters left without weights: {', '.join(leftover[:_MISMATCH_SHOWN])}"
        )
    return module.eval()


def _plain_loading(module: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """``module``'s submodules by name (duplicates kept) when ``load_state_dict(assign=True)``
    would do nothing but assign each entry, else None: no load hooks anywhere, no module that
    loads its own way (``_load_from_state_dict``, extra state, ``load_state_dict`` itself), no
    registration hooks, no swap-tensors mode."""
    from torch.nn.modules import batchnorm
    from torch.nn.modules import module as module_mod

    hooks = [getattr(module_mod, name, None) for name in (
        "_global_parameter_registration_hooks", "_global_buffer_registration_hooks")]
    if any(h is None or h for h in hooks) or type(module).load_state_dict \
            is not nn.Module.load_state_dict \
            or torch.__future__.get_swap_module_params_on_conversion():
        return None
    # _NormBase only adds num_batches_tracked when the state lacks it, and check_fits has
    # made sure that every key the module has is in the state.
    plain = (nn.Module._load_from_state_dict, batchnorm._NormBase._load_from_state_dict)
    named = list(module.named_modules(remove_duplicate=False))
    for _, sub in named:
        kind = type(sub)
        if kind._load_from_state_dict not in plain \
                or kind.set_extra_state is not nn.Module.set_extra_state \
                or kind.get_extra_state is not nn.Module.get_extra_state \
                or sub._load_state_dict_pre_hooks or sub._load_state_dict_post_hooks:
            return None
    return named


def assign_plainly(module: nn.Module, state: Mapping[str, torch.Tensor]) -> bool:
    """Do what ``module.load_state_dict(state, strict=True, assign=True)`` does, without its
    per-module filtering of the whole state (2.4 ms of a 200 MB pull's ~10 ms), where that
    call would only assign (:func:`_plain_loading`); False, doing nothing, elsewhere.

    The caller has checked (:func:`check_fits`) that ``state`` holds exactly the module's keys
    with its shapes. Like ``load_state_dict``, a tensor replacing a parameter becomes a new
    ``Parameter`` with the old one's ``requires_grad``; a buffer is the tensor itself."""
    named = _plain_loading(module)
    if named is None:
        return False
    owners = dict(named)
    plan: list[tuple[dict[str, Any], str, Any]] = []
    for key, value in state.items():
        owner_name, _, attr = key.rpartition(".")
        owner = owners.get(owner_name)
        if owner is None or not isinstance(value, torch.Tensor):
            return False
        if owner._parameters.get(attr) is not None:
            old = owner._parameters[attr]
            if isinstance(old, nn.Parameter):
                value = nn.Parameter(value, requires_grad=old.requires_grad)
            plan.append((owner._parameters, attr, value))
        elif owner._buffers.get(attr) is not None \
                and attr not in owner._non_persistent_buffers_set:
            plan.append((owner._buffers, attr, value))
        else:
            return False
    for table, attr, value in plan:
        table[attr] = value
    return True


def _tie(module: nn.Module, alias: str, kept: str) -> None:
    a_owner, _, a_attr = alias.rpartition(".")
    k_owner, _, k_attr = kept.rpartition(".")
    source = module.get_submodule(k_owner)
    target = module.get_submodule(a_owner)
    if k_attr in source._parameters and a_attr in target._parameters:
        target._parameters[a_attr] = source._parameters[k_attr]
    elif k_attr in source._buffers and a_attr in target._buffers:
        target._buffers[a_attr] = source._buffers[k_attr]
