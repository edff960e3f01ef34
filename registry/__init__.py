"""registry: a model registry for PyTorch with a device-aware, content-addressed artifact store.

    import registry
    mv = registry.push(model, "resnet18", tags={"dataset": "imagenet"})
    model = registry.pull("resnet18:v1", device="auto")

Module-level functions run on a default :class:`Registry` built from the environment when they
are called (``REGISTRY_HOME``, ``REGISTRY_CATALOG_URL``, ``REGISTRY_STORE_URL``). This module only
re-exports: the verbs live in ``_api.py``, the facade in ``client.py``.
"""


from ._api import (
    default_registry,
    delete_alias,
    delete_version,
    export,
    gc,
    list_exports,
    list_models,
    list_versions,
    pull,
    pull_export,
    pull_files,
    pull_state_dict,
    push,
    save_pretrained,
    set_alias,
    set_tags,
    show,
)
from .client import Registry
from .errors import (
    ArchitectureUnknownError,
    CatalogUnavailableError,
    CheckpointError,
    DeviceUnavailableError,
    DigestMismatchError,
    DtypeError,
    ExportError,
    ForbiddenError,
    ManifestError,
    MissingBlobError,
    MlflowUnavailableError,
    NormalizationError,
    NotFoundError,
    RefError,
    RegistryError,
    SchemaOutOfDateError,
    ServerUnavailableError,
    SettingsError,
    StateDictMismatchError,
    StoreUnavailableError,
    UnauthorizedError,
    UnexpectedUploadError,
    UnsafeCheckpointError,
    UntrustedFactoryError,
    VersionExistsError,
)
from .exports import Artifact
from .gc import GcReport
from .manifest import ModelVersion
from .refs import Ref
from .refs import parse as parse_ref
from .settings import Settings

__version__ = "0.1.0"

__all__ = [
    "ArchitectureUnknownError",
    "Artifact",
    "CatalogUnavailableError",
    "CheckpointError",
    "DeviceUnavailableError",
    "DigestMismatchError",
    "DtypeError",
    "ExportError",
    "ForbiddenError",
    "GcReport",
    "ManifestError",
    "MissingBlobError",
    "MlflowUnavailableError",
    "ModelVersion",
    "NormalizationError",
    "NotFoundError",
    "Ref",
    "RefError",
    "Registry",
    "RegistryError",
    "SchemaOutOfDateError",
    "ServerUnavailableError",
    "Settings",
    "SettingsError",
    "StateDictMismatchError",
    "StoreUnavailableError",
    "UnauthorizedError",
    "UnexpectedUploadError",
    "UnsafeCheckpointError",
    "UntrustedFactoryError",
    "VersionExistsError",
    "default_registry",
    "delete_alias",
    "delete_version",
    "export",
    "gc",
    "list_exports",
    "list_models",
    "list_versions",
    "parse_ref",
    "pull",
    "pull_export",
    "pull_files",
    "pull_state_dict",
    "push",
    "save_pretrained",
    "set_alias",
    "set_tags",
    "show",
]
