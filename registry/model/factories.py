"""Which recorded factories ``pull`` may call: the factory rule.

A factory string comes from a manifest, which anyone with write access to the catalog or the
store can edit; calling it runs code on every machine that pulls. The rule, checked before
anything is imported:

1. it parses strictly as ``package.module:Qual.name`` of public identifiers (none starts with
   ``_``, so no ``_api``/``__class__`` hops), or ``__main__:Name`` (a class of the script that
   pushed it, found only in a process whose ``__main__`` defines it);
2. either the module path is a trusted prefix (``REGISTRY_TRUSTED_FACTORIES``, default
   ``torchvision.models,timm``) or below one, or the module is already imported
   (``sys.modules``) and the target, found without running any attribute hook, is an
   ``nn.Module`` subclass;
3. no attribute on the path is a module object (``timm:models._hub.os.system`` would reach
   ``os`` through a trusted package's re-exports);
4. a trusted factory function is never given keyword arguments that make it fetch or read
   weights itself (``weights=``, ``pretrained=``, ``checkpoint_path=``...): pull fills every
   weight from the registry, and honouring them would download or read files outside it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from ..errors import ArchitectureUnknownError, NormalizationError, UntrustedFactoryError, quoted
from .architectures import caller_level

_PUBLIC_ID = r"[A-Za-z][A-Za-z0-9_]*"
# `__main__` (the user's script, `__main__:MyNet`) is the one module name with underscores.
_FACTORY_RE = re.compile(rf"(?P<module>__main__|{_PUBLIC_ID}(?:\.{_PUBLIC_ID})*)"
                         rf":(?P<qualname>{_PUBLIC_ID}(?:\.{_PUBLIC_ID})*)")
_MAX_FACTORY = 300
_FETCHING_KWARG_RE = re.compile(
    r"(?:^|_)(?:pretrained|weights|checkpoint|ckpt|url|path|file|dir|cache|hub|download)(?:_|$)")
_HARMLESS_KWARGS = frozenset({"init_weights"})  # torchvision's VGG/GoogLeNet: random init only
_EXTRA_HINT = {"timm": " (pip install 'torch-registry[hf]')"}
# Packages that hold no model builders of anyone's: trusting one would let a manifest run it.
_NEVER_TRUST = frozenset({"torch", "builtins", "__main__"})


def resolve_factory(factory: str, trusted_prefixes: tuple[str, ...]) -> Callable[..., Any]:
    """The callable a recorded factory names, if the factory rule admits it; else a
    :class:`UntrustedFactoryError`, raised before anything is imported."""
    module_name, attrs = _parse_factory(factory)
    if any(module_name == p or module_name.startswith(p + ".") for p in trusted_prefixes):
        return _trusted_target(factory, module_name, attrs)
    return _imported_module_class(factory, module_name, attrs, trusted_prefixes)


def _parse_factory(factory: object) -> tuple[str, list[str]]:
    if not isinstance(factory, str) or len(factory) > _MAX_FACTORY \
            or not (match := _FACTORY_RE.fullmatch(factory)):
        raise UntrustedFactoryError(
            f"recorded factory {quoted(factory)} is not a 'package.module:callable' of public "
            "names (none may start with '_'); it was not imported. Pass model= to pull"
        )
    return match["module"], match["qualname"].split(".")


def _trusted_target(factory: str, module_name: str, attrs: list[str]) -> Callable[..., Any]:
    try:
        target: Any = importlib.import_module(module_name)
        for attr in attrs:
            target = getattr(target, attr)
            _refuse_module_hop(target, factory, attr)
    except (ImportError, AttributeError) as exc:
        raise ArchitectureUnknownError(
            f"recorded factory {factory!r} cannot be imported here ({quoted(str(exc))}); install "
            f"the package that provides it{_EXTRA_HINT.get(module_name.split('.')[0], '')}, or "
            "pass model= to pull"
        ) from None
    if not callable(target):
        raise UntrustedFactoryError(f"recorded factory {factory!r} is not callable; pass model= "
                                    "to pull")
    if isinstance(target, type):
        return target
    return _without_weight_fetching(target, factory)


def _imported_module_class(factory: str, module_name: str, attrs: list[str],
                           trusted_prefixes: tuple[str, ...]) -> type[nn.Module]:
    refusal = (
        f"recorded factory {factory!r} is not under a trusted prefix "
        f"({', '.join(trusted_prefixes) or 'none'}) and is not an nn.Module subclass of a module "
        f"this process has already imported; it was not imported. "
        + (f"Import {module_name} before pulling if its class builds the model, add it to "
           "REGISTRY_TRUSTED_FACTORIES if you trust it, or pass model= to pull"
           if could_hold_models(module_name) else
           f"{module_name} is not a package of model builders: pass model= to pull")
    )
    module = sys.modules.get(module_name)
    if not isinstance(module, types.ModuleType):
        raise UntrustedFactoryError(refusal)
    target: Any = module
    for attr in attrs:
        try:
            # getattr_static: no module __getattr__, property or descriptor of the untrusted
            # module runs while the path is followed.
            target = inspect.getattr_static(target, attr)
        except AttributeError:
            raise ArchitectureUnknownError(
                f"recorded factory {factory!r} does not exist in {module_name} as imported here "
                f"(no attribute {attr!r}); pass model= to pull"
            ) from None
        _refuse_module_hop(target, factory, attr)
    if isinstance(target, type) and issubclass(target, nn.Module):
        return target
    raise UntrustedFactoryError(refusal)


def _refuse_module_hop(target: object, factory: str, attr: str) -> None:
    if isinstance(target, types.ModuleType):
        raise UntrustedFactoryError(
            f"recorded factory {factory!r} reaches module {attr!r} through an attribute; name "
            "the module before the ':' (e.g. 'timm.models:create_model'), or pass model= to pull"
        )


def _without_weight_fetching(target: Callable[..., Any], factory: str) -> Callable[..., Any]:
    """``target``, refusing keyword arguments that would make it fetch or read weights."""

    @functools.wraps(target)
    def build(*args: Any, **kwargs: Any) -> Any:
        for key, value in kwargs.items():
            if value is None or value is False or key in _HARMLESS_KWARGS:
                continue
            if _FETCHING_KWARG_RE.search(key.lower()):
                raise UntrustedFactoryError(
                    f"recorded factory {factory!r} was given {key}={quoted(value, 60)}, which "
                    "would make it download or read weights outside the registry; pull fills "
                    "every weight itself, so push without that argument (or pass model=)"
                )
        return target(*args, **kwargs)

    return build


def could_hold_models(module_name: str) -> bool:
    """Whether ``module_name`` could be a package of model builders worth trusting: not the
    standard library, torch itself or builtins (``subprocess:Popen``, ``os:system``)."""
    top = module_name.partition(".")[0]
    return top not in sys.stdlib_module_names and top not in _NEVER_TRUST


def warn_if_unpullable(factory: str, trusted_prefixes: tuple[str, ...]) -> str:
    """``factory`` (being recorded at push), with a warning where the factory rule will refuse
    it at pull: private names, or not under a trusted prefix and (as imported now) not an
    nn.Module subclass. Nothing is imported; a module not imported yet is left to pull."""
    why = fix = ""
    try:
        module_name, attrs = _parse_factory(factory)
        if module_name == "__main__":
            warnings.warn(
                f"factory {factory!r} is recorded from your script (__main__): only a process "
                f"whose __main__ defines {attrs[-1]} can pull it without model=; move "
                f"{attrs[-1]} into a module and push factory='yourmodule:{'.'.join(attrs)}' to "
                "pull it anywhere", UserWarning, stacklevel=caller_level())
            return factory
    except UntrustedFactoryError:
        why, fix = "it is not a 'package.module:callable' of public names", "name a public one"
    else:
        if _is_trusted(module_name, trusted_prefixes) or (
                module_name not in sys.modules and could_hold_models(module_name)):
            return factory
        try:
            _imported_module_class(factory, module_name, attrs, trusted_prefixes)
        except UntrustedFactoryError:
            why = "it is neither under a trusted prefix nor an nn.Module subclass"
            fix = (f"add {module_name!r} to REGISTRY_TRUSTED_FACTORIES where it is pulled, or "
                   "push an nn.Module subclass as factory" if could_hold_models(module_name)
                   else f"{module_name} is not a package of model builders, so push an "
                   "nn.Module subclass as factory, or none and pull with model=")
        except ArchitectureUnknownError:
            pass  # no such attribute here; pull says so where it is pulled
    if why:
        warnings.warn(f"factory {factory!r} is recorded, but pull will refuse to call it: {why} "
                      f"(the factory rule, registry/model/factories.py); {fix}", UserWarning,
                      stacklevel=caller_level())
    return factory


def _is_trusted(module_name: str, trusted_prefixes: tuple[str, ...]) -> bool:
    return any(module_name == p or module_name.startswith(p + ".") for p in trusted_prefixes)


# What push records of a factory: any dotted module and callable (the rule above is pull's).
_RECORDABLE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def factory_string(factory: object) -> str:
    """``"package.module:callable"`` for a factory given as a string or as a callable."""
    if isinstance(factory, str):
        if not _RECORDABLE.fullmatch(factory):
            raise NormalizationError(
                f"invalid factory {factory!r}: use 'package.module:callable', e.g. "
                "'torchvision.models:resnet18'"
            )
        return factory
    if callable(factory):
        module = getattr(factory, "__module__", None)
        qualname = getattr(factory, "__qualname__", None)
        if not module or not qualname or "<" in qualname:
            raise NormalizationError(
                f"factory {factory!r} cannot be recorded: it must be importable by name (a "
                "top-level function or class, not a lambda or a local object)"
            )
        return f"{module}:{qualname}"
    raise NormalizationError(f"factory must be a 'module:callable' string or a callable, "
                             f"got {type(factory).__name__}")
