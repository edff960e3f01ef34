"""registry: a model registry for PyTorch with a device-aware, content-addressed artifact store.

    import registry
    mv = registry.push(model, "resnet18", tags={"dataset": "imagenet"})
    model = registry.pull("resnet18:v1", device="auto")

Module-level functions run on a default :class:`Registry` built from the environment when they
are called (``REGISTRY_HOME``, ``REGISTRY_CATALOG_URL``, ``REGISTRY_STORE_URL``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from .backends import GcReport
from .client import ModelInput, Registry
from .devices import DeviceRequest, DtypeRequest
from .errors import (
    ArchitectureUnknownError,
    CatalogUnavailableError,
    CheckpointError,
    DeviceUnavailableError,
    DigestMismatchError,
    DtypeError,
    ForbiddenError,
    MlflowUnavailableError,
    NormalizationError,
    NotFoundError,
    RefError,
    RegistryError,
    SchemaOutOfDateError,
    SettingsError,
    StateDictMismatchError,
    StoreUnavailableError,
    UnauthorizedError,
    UnsafeCheckpointError,
    UntrustedFactoryError,
    VersionExistsError,
)
from .manifest import ModelVersion
from .refs import Ref
from .refs import parse as parse_ref
from .settings import Settings

__version__ = "0.1.0"

__all__ = [
    "ArchitectureUnknownError",
    "CatalogUnavailableError",
    "CheckpointError",
    "DeviceUnavailableError",
    "DigestMismatchError",
    "DtypeError",
    "ForbiddenError",
    "GcReport",
    "MlflowUnavailableError",
    "ModelVersion",
    "NormalizationError",
    "NotFoundError",
    "Ref",
    "RefError",
    "Registry",
    "RegistryError",
    "SchemaOutOfDateError",
    "Settings",
    "SettingsError",
    "StateDictMismatchError",
    "StoreUnavailableError",
    "UnauthorizedError",
    "UnsafeCheckpointError",
    "UntrustedFactoryError",
    "VersionExistsError",
    "delete_alias",
    "delete_version",
    "gc",
    "list_models",
    "list_versions",
    "parse_ref",
    "pull",
    "pull_state_dict",
    "push",
    "set_alias",
    "set_tags",
    "show",
]

_defaults: dict[Settings, Registry] = {}
_defaults_lock = threading.Lock()


def default_registry() -> Registry:
    """The registry the environment describes right now (one per distinct configuration)."""
    settings = Settings.from_env()
    with _defaults_lock:
        reg = _defaults.get(settings)
        if reg is None:
            reg = _defaults[settings] = Registry()
        return reg


def push(model: ModelInput, name: str, *, tags: Mapping[str, str] | None = None,
         aliases: Iterable[str] = (), factory: Any = None,
         factory_kwargs: Mapping[str, Any] | None = None, precision: str | None = None,
         keep_in_fp32: Iterable[str] = ()) -> ModelVersion:
    """Store ``model`` as a new version of ``name``; see :meth:`Registry.push`."""
    return default_registry().push(model, name, tags=tags, aliases=aliases, factory=factory,
                                   factory_kwargs=factory_kwargs, precision=precision,
                                   keep_in_fp32=keep_in_fp32)


def pull(ref: str | Ref, *, device: DeviceRequest = "auto", dtype: DtypeRequest = "auto",
         model: Any = None, device_map: Any = None,
         max_memory: Mapping[str, int | str] | None = None) -> nn.Module:
    """Materialize ``ref`` as a module; see :meth:`Registry.pull`."""
    return default_registry().pull(ref, device=device, dtype=dtype, model=model,
                                   device_map=device_map, max_memory=max_memory)


def pull_state_dict(ref: str | Ref, *, device: DeviceRequest = "auto",
                    dtype: DtypeRequest = "auto") -> dict[str, Any]:
    """The weights of ``ref``; see :meth:`Registry.pull_state_dict`."""
    return default_registry().pull_state_dict(ref, device=device, dtype=dtype)


def show(ref: str | Ref) -> ModelVersion:
    return default_registry().show(ref)


def list_models() -> list[str]:
    return default_registry().list_models()


def list_versions(name: str) -> list[ModelVersion]:
    return default_registry().list_versions(name)


def set_alias(name: str, alias: str, version: int | str) -> ModelVersion:
    return default_registry().set_alias(name, alias, version)


def delete_alias(name: str, alias: str) -> None:
    default_registry().delete_alias(name, alias)


def set_tags(ref: str | Ref, tags: Mapping[str, str | None]) -> ModelVersion:
    return default_registry().set_tags(ref, tags)


def delete_version(ref: str | Ref) -> ModelVersion:
    return default_registry().delete_version(ref)


def gc() -> GcReport:
    return default_registry().gc()
