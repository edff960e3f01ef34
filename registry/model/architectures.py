"""How a Hugging Face ``transformers`` or ``timm`` module is recorded at push and rebuilt at pull,
with no code from the store.

- A ``transformers.PreTrainedModel`` whose class ``transformers`` exports at top level records
  ``{"kind": "transformers", "class": "transformers:LlamaForCausalLM", "config": {...}}`` (plus
  ``"generation_config"`` when it is not the one derived from the config). Pull looks the class up
  as ``getattr(transformers, name)`` only once the name is a public identifier, admits it only if
  it is a ``PreTrainedModel`` subclass, and builds it with ``_from_config`` on ``meta``.
- A ``timm`` model records ``factory="timm:create_model"`` and the keyword arguments that give the
  same shapes (``model_name``, ``num_classes``, ``in_chans``, ``img_size``); the factory rule in
  ``factories.py`` then governs pull.
- A ``torchvision`` model records its builder (``factory="torchvision.models:resnet18"``) and
  the keyword arguments that change shapes (``num_classes``, ``aux_logits``...), found by
  ``torchvision_builders.py`` among the builders of its class by keys and shapes on ``meta``.

Both are recorded only if rebuilding from the record on ``meta`` at push gives the pushed keys and
shapes. ``transformers``, ``timm`` and ``torchvision`` are never imported here unless the pushed
module comes from them (then they are already imported) or a pulled version records them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ArchitectureUnknownError, RefError, UntrustedFactoryError, quoted
from . import torchvision_builders
from .metaparams import empty_parameters

if TYPE_CHECKING:
    # Annotations only: manifest validation reads this module, and `registry ls` must not pay
    # for importing torch.
    from torch import nn

TRANSFORMERS = "transformers"
TIMM_FACTORY = "timm:create_model"
MAX_CONFIG_BYTES = 4 * 2**20
_CLASS_RE = re.compile(r"transformers:(?P<name>[A-Za-z][A-Za-z0-9_]{0,199})")
# Config keys that would make building load code or kernels from elsewhere (remote code, hub
# kernels, quantizers): dropped, at any depth, before a recorded config is used.
_LOADING_KEYS = frozenset({"auto_map", "attn_implementation", "_attn_implementation",
                           "_attn_implementation_internal", "experts_implementation",
                           "_experts_implementation", "quantization_config",
                           "trust_remote_code", "custom_generate"})
# A config's dtype string is looked up on torch (getattr(torch, name)): only these are kept.
_FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
_DTYPE_KEYS = frozenset({"dtype", "torch_dtype"})
_INSTALL = "pip install 'torch-registry[hf]'"

if TYPE_CHECKING:  # torch is for the push and pull paths; a server reading manifests needs none
    from torch import nn
log = logging.getLogger(__name__)


# -- push: what a module records ----------------------------------------------------------------

def capture(module: nn.Module, signature: Mapping[str, tuple[int, ...]] | None = None,
            ) -> dict[str, Any]:
    """The architecture entries that rebuild ``module`` (empty for anything else).
    ``signature``: the keys and shapes the rebuilt float module must have, when they are not
    ``module``'s own (a packed quantized model's, registry/formats/ctensors.py)."""
    if _comes_from(module, "transformers"):
        return _transformers_record(module, signature)
    if _comes_from(module, "timm"):
        return _timm_record(module)
    if torchvision_builders.comes_from_torchvision(module):
        return _torchvision_record(module)
    return {}


def _comes_from(module: nn.Module, package: str) -> bool:
    # The MRO says where the class was defined without importing anything; a module from the
    # package means the package is already imported.
    return package in sys.modules and any(
        c.__module__ == package or c.__module__.startswith(package + ".")
        for c in type(module).__mro__)


def _transformers_record(module: nn.Module,
                         signature: Mapping[str, tuple[int, ...]] | None) -> dict[str, Any]:
    import transformers

    cls = type(module)
    if not isinstance(module, transformers.PreTrainedModel) \
            or getattr(transformers, cls.__name__, None) is not cls:
        return {}  # a subclass of the user's own: pull needs model=
    record: dict[str, Any] = {
        "kind": TRANSFORMERS, "class": f"transformers:{cls.__name__}",
        "config": json.loads(module.config.to_json_string(use_diff=False)),
    }
    generation = getattr(module, "generation_config", None)
    if generation is not None and not getattr(generation, "_from_model_config", False):
        diff = json.loads(generation.to_json_string(use_diff=True))
        diff.pop("transformers_version", None)
        if diff:
            record["generation_config"] = diff
    problem = check(record)
    try:
        json.dumps(record, allow_nan=False)
    except ValueError as exc:
        problem = f"holds {exc}"
    if problem:
        log.warning("%s is pushed without its config, which pull could not use (%s); pull it "
                    "with model=", cls.__name__, problem)
        return {}
    return record if _rebuilds(transformers_builder(record, "push"), module, signature) else {}


def _timm_record(module: nn.Module) -> dict[str, Any]:
    cfg = getattr(module, "pretrained_cfg", None) or getattr(module, "default_cfg", None)
    if not isinstance(cfg, Mapping) or not isinstance(arch := cfg.get("architecture"), str) \
            or not arch:
        return {}
    kwargs: dict[str, Any] = {"model_name": arch}
    classes = getattr(module, "num_classes", None)
    if isinstance(classes, int) and not isinstance(classes, bool):
        kwargs["num_classes"] = classes
    size = cfg.get("input_size")
    default_chans, default_hw = (size[0], list(size[1:])) if isinstance(size, (list, tuple)) \
        and len(size) == 3 else (3, None)
    first = cfg.get("first_conv")
    weight = _first_weight(module, first) if isinstance(first, str) else None
    if weight is not None and weight.dim() >= 2 and weight.shape[1] != default_chans:
        kwargs["in_chans"] = int(weight.shape[1])
    img_size = getattr(getattr(module, "patch_embed", None), "img_size", None)
    if isinstance(img_size, (list, tuple)) and default_hw is not None \
            and list(img_size) != default_hw:
        kwargs["img_size"] = [int(n) for n in img_size]
    record = {"factory": TIMM_FACTORY, "factory_kwargs": kwargs}

    def make() -> Any:
        import timm

        return timm.create_model(**kwargs)

    return record if _rebuilds(make, module) else {}


def _torchvision_record(module: nn.Module) -> dict[str, Any]:
    found = torchvision_builders.find_builders(module, _meta_signature)
    if len(found) == 1:
        return {"factory": found[0].factory, "factory_kwargs": found[0].kwargs}
    cls = type(module)
    why = (f"several torchvision builders give its keys and shapes "
           f"({', '.join(b.factory for b in found)})" if found else
           f"no torchvision builder of {cls.__module__}.{cls.__qualname__} gives its keys and "
           "shapes")
    example = found[0].factory if found else "torchvision.models:resnet18"
    warnings.warn(
        f"{cls.__name__} is pushed without its builder: {why}, so pull will need model=. Pass "
        f"the builder to push: factory='{example}' (with factory_kwargs= for arguments such "
        "as num_classes)", UserWarning, stacklevel=caller_level())
    return {}


def _meta_signature(make: Callable[[], Any]) -> dict[str, tuple[int, ...]]:
    """The keys and shapes of ``make()``, built with its parameters on ``meta``."""
    # The candidates are ours, not the user's: their builders' notices (googlenet's init
    # FutureWarning) would only confuse a push.
    with empty_parameters(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = make()
    return {k: tuple(v.shape) for k, v in built.state_dict().items() if hasattr(v, "shape")}


def _first_weight(module: nn.Module, path: str) -> Any:
    try:
        return getattr(module.get_submodule(path), "weight", None)
    except AttributeError:
        return None


def _rebuilds(make: Callable[[], Any], module: nn.Module,
              signature: Mapping[str, tuple[int, ...]] | None = None) -> bool:
    """Whether ``make()``, built with parameters on ``meta``, has ``module``'s keys and shapes
    (or ``signature``)."""
    want = dict(signature) if signature is not None else {
        k: tuple(v.shape) for k, v in module.state_dict().items() if hasattr(v, "shape")}
    try:
        with empty_parameters():
            built = make()
        got = {k: tuple(v.shape) for k, v in built.state_dict().items() if hasattr(v, "shape")}
    except Exception as exc:  # noqa: BLE001 - any failure means: record no architecture
        got, why = {}, f"{type(exc).__name__}: {str(exc)[:200]}"
    else:
        why = "other keys or shapes"
    if got == want:
        return True
    log.warning("%s is pushed without a way to rebuild it (rebuilding it from what it records "
                "gave %s); pull it with model=", type(module).__name__, why)
    return False


# -- the manifest's architecture, untrusted -------------------------------------------------------

def check(architecture: Mapping[str, Any]) -> str | None:
    """Why a manifest's ``architecture`` is malformed, or None (``manifest.validate`` asks)."""
    kind = architecture.get("kind")
    if kind is None:
        return None
    if kind != TRANSFORMERS:
        return None if isinstance(kind, str) and len(kind) <= 64 else "kind is not a short string"
    if not isinstance(architecture.get("class"), str) \
            or not _CLASS_RE.fullmatch(architecture["class"]):
        return (f"class {quoted(architecture.get('class'))} is not 'transformers:<ClassName>' "
                "of a public name")
    for part in ("config", "generation_config"):
        value = architecture.get(part, {})
        if not isinstance(value, dict):
            return f"{part} is {quoted(value)}, not a JSON object"
        if len(json.dumps(value)) > MAX_CONFIG_BYTES:
            return f"{part} holds more than {MAX_CONFIG_BYTES} bytes of JSON"
    return None


# -- pull: building what was recorded --------------------------------------------------------

def builder(architecture: Mapping[str, Any], ref: str) -> Callable[[], nn.Module] | None:
    """A zero-argument builder for a recorded ``kind``, or None where none is recorded."""
    kind = architecture.get("kind")
    if kind is None:
        return None
    if kind == TRANSFORMERS:
        return transformers_builder(architecture, ref)
    raise ArchitectureUnknownError(
        f"{ref} records an architecture of kind {quoted(kind)}, which this registry does not "
        "know; upgrade the registry package, or pass model= to pull")


def transformers_builder(architecture: Mapping[str, Any], ref: str) -> Callable[[], nn.Module]:
    """Builds the recorded ``transformers`` class from its recorded config (checked first)."""
    problem = check(architecture)
    if problem:
        raise UntrustedFactoryError(f"{ref} records an invalid transformers architecture: "
                                    f"{problem}; nothing was imported. Pass model= to pull")
    name = _CLASS_RE.fullmatch(architecture["class"])["name"]  # type: ignore[index]
    try:
        import transformers
    except ImportError:
        raise ArchitectureUnknownError(
            f"{ref} is a transformers {name}; install transformers to rebuild it ({_INSTALL}), "
            "or pass model= to pull") from None
    try:
        cls = getattr(transformers, name, None)
    except (ImportError, RuntimeError):  # a lazily exported name whose own imports fail
        cls = None
    config_class = getattr(cls, "config_class", None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
            and isinstance(config_class, type)
            and issubclass(config_class, transformers.PretrainedConfig)):
        raise UntrustedFactoryError(
            f"{ref} records class {architecture['class']!r}, which is not a PreTrainedModel class "
            "that transformers exports; it was not built. Pass model= to pull")
    config = _without_loading_keys(architecture.get("config", {}))
    generation = _without_loading_keys(architecture.get("generation_config") or {})

    dtype = config.get("dtype", config.get("torch_dtype"))
    dtype = dtype if dtype in _FLOAT_DTYPES else None

    def make() -> nn.Module:
        import torch

        model = cls._from_config(config_class.from_dict(config),
                                 dtype=getattr(torch, dtype) if dtype else None)
        if generation:
            model.generation_config = transformers.GenerationConfig.from_dict(generation)
        return model

    return make


def _without_loading_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_loading_keys(v) for k, v in value.items()
                if k not in _LOADING_KEYS and not (k in _DTYPE_KEYS and isinstance(v, str)
                                                   and v not in _FLOAT_DTYPES)}
    if isinstance(value, list):
        return [_without_loading_keys(v) for v in value]
    return value


def retie(module: nn.Module, stored: Collection[str] = ()) -> None:
    """Tie a filled ``transformers`` model's weights as transformers ties them, except two
    weights the version stores apart (``stored``: the keys filled from tensors of their own,
    tied aliases not among them). The pushed model held those untied (torchao's ``quantize_``
    gives a tied ``lm_head`` a quantized weight of its own), so each keeps its stored value;
    transformers' ``from_pretrained`` does not tie two keys a checkpoint holds apart either."""
    if not _comes_from(module, "transformers"):
        return
    tie = getattr(module, "tie_weights", None)
    if not callable(tie):
        return
    held = {name: p for name, p in module.named_parameters(remove_duplicate=False)
            if name in stored}
    tie()
    for name, p in module.named_parameters(remove_duplicate=False):
        kept = held.get(name)
        if kept is not None and p is not kept:
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, leaf, kept)


# -- push without a name ------------------------------------------------------------------------

_INVALID_RUN = re.compile(r"[^a-z0-9._-]+")


def default_name(tags: Mapping[str, str], architecture: Mapping[str, Any]) -> str:
    """The name a push without one gets: ``tags["name"]``, else one derived from what was pushed
    (HF ``name_or_path`` or ``model_type``, the timm architecture, the factory, the class)."""
    for candidate in (tags.get("name"), *_candidates(architecture)):
        fitted = fit_name(candidate) if isinstance(candidate, str) else None
        if fitted:
            return fitted
    raise RefError("no model name given and none can be derived from what was pushed (a state "
                   "dict or checkpoint records no class); pass one: push(model, 'my-model'), or "
                   "tags={'name': 'my-model'}")


def _candidates(architecture: Mapping[str, Any]) -> list[Any]:
    config = architecture.get("config") if architecture.get("kind") == TRANSFORMERS else None
    found: list[Any] = []
    if isinstance(config, dict):
        path = config.get("_name_or_path")
        found += [path.rstrip("/").rsplit("/", 1)[-1] if isinstance(path, str) else None,
                  config.get("model_type")]
    factory = architecture.get("factory")
    if factory == TIMM_FACTORY:
        found.append((architecture.get("factory_kwargs") or {}).get("model_name"))
    for recorded in (factory, architecture.get("class")):
        if isinstance(recorded, str):
            found.append(recorded.rpartition(":")[2].rpartition(".")[2])
    return found


def fit_name(text: str) -> str | None:
    """``text`` in the name grammar: lowercase, invalid runs as '-', trimmed; None if empty."""
    name = _INVALID_RUN.sub("-", text.strip().lower())
    name = name.lstrip("._-")[:128].rstrip("._-")
    return name or None


def caller_level() -> int:
    """The ``stacklevel`` that names the first line outside the ``registry`` package (the user's
    push), whichever facade, verb or pipeline step the call came through."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package + os.sep):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level
