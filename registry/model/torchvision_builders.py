"""Which ``torchvision`` builder, with which shape-changing keyword arguments, gives a module.

A torchvision model object does not remember the builder that made it (``resnet18`` and
``resnet152`` are both a ``ResNet``), so :func:`find_builder` finds it by its keys and shapes:

1. candidates are the builders ``torchvision.models.list_models()`` registers whose annotated
   return class *is* the module's class (a user's subclass matches none), tried in order of how
   close the parameter count their weights declare (``meta["num_params"]``, read without any
   download) is to the module's, so the right one is nearly always built first;
2. each candidate is built with its defaults (``weights=None``, and ``weights_backbone=None`` so
   nothing is downloaded) by the caller's ``signature_of``, which builds on ``meta``;
3. where a candidate has the module's keys with a few head shapes changed, or other keys that
   an auxiliary head explains, the keyword arguments that change them (``num_classes``,
   ``aux_logits``, ``aux_loss``) are varied, each variant built and compared the same way.

The first builder and keyword arguments whose keys and shapes equal the module's are the
answer, unless a builder declaring the same parameter count matches too: two builders with one
signature may compute different things (``fasterrcnn_mobilenet_v3_large_fpn`` and its ``_320_``
twin differ only in image sizes), so then both are returned and the caller records neither.
Signatures are cached per builder and arguments: a second push of the same family builds
nothing.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # manifest -> architectures -> here: the torch-free CLI imports this module
    from torch import nn

Signature = dict[str, tuple[int, ...]]
# Builds ``make()`` (parameters on meta) and returns its keys and shapes; raises if it cannot.
SignatureOf = Callable[[Callable[[], "nn.Module"]], Signature]

# Keyword arguments that fetch weights: always None, so neither capture nor pull downloads.
_NO_FETCH = ("weights_backbone",)
_INT_KWARGS = ("num_classes",)
_BOOL_KWARGS = ("aux_logits", "aux_loss")
_MAX_VARIANTS = 16
# At most this many keys may differ in shape for a head-size argument to explain them
# (classifier weight and bias; a detector's class and box heads; a segmenter's two heads).
_MAX_HEAD_KEYS = 8
_MAX_CACHED = 512
_signatures: dict[tuple[str, tuple[tuple[str, Any], ...]], Signature | None] = {}


@dataclass(frozen=True)
class Builder:
    """A torchvision builder found for a module: ``factory`` is ``"package:function"``."""

    factory: str
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.factory.rpartition(":")[2]


def comes_from_torchvision(module: nn.Module) -> bool:
    """Whether ``module``'s class is defined in ``torchvision.models`` (already imported then)."""
    where = type(module).__module__
    return "torchvision" in sys.modules and where.startswith("torchvision.models.")


def find_builders(module: nn.Module, signature_of: SignatureOf) -> list[Builder]:
    """The builders (with keyword arguments) that rebuild ``module``'s keys and shapes: one is
    the answer, none or several (twins, see above) is none."""
    import torchvision.models as tvm

    want = {k: tuple(v.shape) for k, v in module.state_dict().items() if hasattr(v, "shape")}
    params = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
    found: list[Builder] = []
    found_at: float | None = None
    for distance, name in _candidates(tvm, type(module), params):
        if found_at is not None and distance != found_at:
            break  # only a builder declaring the same parameter count can be a twin
        builder = tvm.get_model_builder(name)
        factory = _factory_string(builder)
        if factory is None:
            continue
        match = _match(factory, builder, type(module), want, signature_of)
        if match is not None:
            found.append(match)
            found_at = distance
    return found


def _candidates(tvm: Any, cls: type, params: int) -> list[tuple[float, str]]:
    ranked: list[tuple[float, str]] = []
    for name in tvm.list_models():
        try:
            returns = inspect.signature(tvm.get_model_builder(name)).return_annotation
        except (TypeError, ValueError):
            continue
        if returns is cls:
            ranked.append((_distance(tvm, name, params), name))
    return sorted(ranked)


def _distance(tvm: Any, name: str, params: int) -> float:
    """How far the parameter counts ``name``'s weights declare are from ``params``."""
    try:
        declared = [w.meta.get("num_params") for w in tvm.get_model_weights(name)]
    except (KeyError, ValueError, AttributeError):
        declared = []
    counts = [n for n in declared if isinstance(n, int)]
    return min((abs(n - params) for n in counts), default=float("inf"))


def _factory_string(builder: Callable[..., Any]) -> str | None:
    """``torchvision.models:resnet18`` where the package exports the builder (as users import
    it), else its own module (``torchvision.models.detection.faster_rcnn:...``)."""
    function = getattr(builder, "__name__", "")
    where = getattr(builder, "__module__", "")
    parts = where.split(".")
    for cut in range(2, len(parts) + 1):
        package = ".".join(parts[:cut])
        try:
            if getattr(importlib.import_module(package), function, None) is builder:
                return f"{package}:{function}"
        except ImportError:
            continue
    return None


def _match(factory: str, builder: Callable[..., nn.Module], cls: type, want: Signature,
           signature_of: SignatureOf) -> Builder | None:
    accepted = _accepted_kwargs(builder, cls)
    base = {k: None for k in _NO_FETCH if k in accepted}
    default = _signature(factory, builder, base, signature_of)
    if default is None:
        return None
    if default == want:
        return Builder(factory, base)
    if not _explainable(default, want, accepted):
        return None
    for kwargs in itertools.islice(_variants(base, default, want, accepted), _MAX_VARIANTS):
        if _signature(factory, builder, kwargs, signature_of) == want:
            return Builder(factory, kwargs)
    return None


def _accepted_kwargs(builder: Callable[..., Any], cls: type) -> set[str]:
    """Keyword arguments the builder takes, itself or through ``**kwargs`` to the class."""
    names: set[str] = set()
    for target in (builder, cls.__init__):  # type: ignore[misc]
        try:
            names |= set(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            continue
    return names - {"self", "args", "kwargs", "weights", "progress"}


def _explainable(default: Signature, want: Signature, accepted: set[str]) -> bool:
    """Whether the difference could come from the varied arguments: the same keys (heads of
    another size), or keys that differ only under auxiliary heads."""
    if default.keys() == want.keys():
        changed = sum(default[k] != want[k] for k in want)
        return changed <= _MAX_HEAD_KEYS and any(k in accepted for k in _INT_KWARGS)
    if not any(k in accepted for k in _BOOL_KWARGS):
        return False
    return all(_auxiliary(k) for k in default.keys() ^ want.keys())


def _auxiliary(key: str) -> bool:
    """Whether ``key`` is under an auxiliary head (``aux1.``, ``AuxLogits.``,
    ``aux_classifier.``)."""
    return any(part.lower().startswith("aux") for part in key.split(".")[:-1])


def _variants(base: dict[str, Any], default: Signature, want: Signature,
              accepted: set[str]) -> Iterator[dict[str, Any]]:
    # Head sizes: the leading dims of tensors whose shapes differ (num_classes, or 4x it for
    # a box regressor), smallest first.
    sizes = sorted({d for k in default.keys() & want.keys() if default[k] != want[k]
                    and want[k] for d in (want[k][0], want[k][0] // 4) if d > 0})
    ints: list[list[tuple[str, Any]]] = [
        [(name, None), *((name, n) for n in sizes)] for name in _INT_KWARGS if name in accepted]
    aux_wanted = any(_auxiliary(k) for k in want)
    bools: list[list[tuple[str, Any]]] = [
        [(name, None), (name, aux_wanted)] for name in _BOOL_KWARGS if name in accepted]
    for choice in itertools.product(*ints, *bools):
        kwargs = {**base, **{k: v for k, v in choice if v is not None}}
        if kwargs != base:
            yield kwargs


def _signature(factory: str, builder: Callable[..., nn.Module], kwargs: Mapping[str, Any],
               signature_of: SignatureOf) -> Signature | None:
    key = (factory, tuple(sorted(kwargs.items())))
    if key not in _signatures:
        try:
            found: Signature | None = signature_of(lambda: builder(weights=None, **kwargs))
        except Exception:  # noqa: BLE001 - a builder that does not build here is no candidate
            found = None
        if len(_signatures) >= _MAX_CACHED:
            _signatures.clear()
        _signatures[key] = found
    return _signatures[key]
