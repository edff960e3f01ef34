"""registry: a model registry for PyTorch with a device-aware, content-addressed artifact store.

    import registry
    mv = registry.push(model, "resnet18", tags={"dataset": "imagenet"})
    model = registry.pull("resnet18:v1", device="auto")

Module-level functions run on a default :class:`Registry` built from the environment when they
are called (``REGISTRY_HOME``, ``REGISTRY_CATALOG_URL``, ``REGISTRY_STORE_URL``). This module only
re-exports: the verbs live in ``_api.py``, the facade in ``client.py``. Those need torch and
load on first use, so the catalog commands of the CLI answer without importing it.
"""

import importlib
import typing

from .errors import (
    AdapterError,
    AliasProtectedError,
    ArchitectureUnknownError,
    BaseNotFoundError,
    CatalogUnavailableError,
    CheckpointError,
    DeviceUnavailableError,
    DigestMismatchError,
    DiskFullError,
    DtypeError,
    ExportError,
    ForbiddenError,
    HubNotFoundError,
    InsecureTransportError,
    ManifestError,
    MissingBlobError,
    MlflowUnavailableError,
    NormalizationError,
    NotFoundError,
    OciArtifactError,
    OciUnavailableError,
    PushKeyConflictError,
    QuantizationError,
    ReferencedVersionError,
    RefError,
    RegistryError,
    SchemaOutOfDateError,
    SchemeDeviceError,
    ServerUnavailableError,
    SettingsError,
    SignatureError,
    StateDictMismatchError,
    StoreError,
    StoreUnavailableError,
    UnauthorizedError,
    UnexpectedUploadError,
    UnsafeCheckpointError,
    UntrustedFactoryError,
    VersionAliasedError,
    VersionExistsError,
    VersionHeldError,
    WebhookSignatureError,
    WebhookTargetError,
)
from .events import Event
from .gc import GcReport
from .governance import ModelGovernance, Trashed
from .manifest import ModelVersion
from .oci.results import OciPush
from .refs import Ref
from .refs import parse as parse_ref
from .settings import Settings
from .signing import Signature
from .webhooks import Webhook

# Loading the submodules `registry.gc` (for GcReport), `registry.events` (for Event) and
# `registry.governance` bound their names here; `gc`, `events` and `governance` are the verbs.
globals().pop("gc")
globals().pop("events")
globals().pop("governance")

if typing.TYPE_CHECKING:
    from ._api import (
        add_webhook,
        bom,
        cache_list,
        card,
        default_registry,
        delete_alias,
        delete_version,
        diff,
        events,
        export,
        gc,
        governance,
        history,
        hold,
        import_oci,
        lineage,
        list_adapters,
        list_exports,
        list_models,
        list_trash,
        list_versions,
        list_webhooks,
        materialize_uri,
        prefetch,
        protect_alias,
        prune_cache,
        pull,
        pull_export,
        pull_files,
        pull_state_dict,
        push,
        push_oci,
        release,
        remove_webhook,
        restore_version,
        save_pretrained,
        set_alias,
        set_retention,
        set_tags,
        show,
        sign,
        test_webhook,
        unprotect_alias,
        verify,
        webhook_deliveries,
    )
    from .caching.prefetching import PrefetchReport
    from .client import Registry
    from .exports import Artifact
    from .provenance.diff import VersionDiff
    from .provenance.lineage import Lineage

# The names that need torch, loaded on first use (PEP 562): `import registry` alone, and with it
# every `registry.cli` command that only reads or edits the catalog (ls, show, alias, tag, rm,
# gc, token, db, store), never imports torch, which costs seconds.
_LAZY = {
    **{name: "._api" for name in (
        "add_webhook", "bom", "cache_list", "card", "default_registry", "delete_alias",
        "delete_version", "diff", "events", "export", "gc", "governance", "history", "hold",
        "import_oci", "lineage", "list_adapters", "list_exports", "list_models", "list_trash",
        "list_versions", "list_webhooks", "materialize_uri", "prefetch", "protect_alias",
        "prune_cache", "pull", "pull_export", "pull_files", "pull_state_dict", "push", "push_oci",
        "release", "remove_webhook", "restore_version", "save_pretrained", "set_alias",
        "set_retention", "set_tags", "show", "sign", "test_webhook", "unprotect_alias", "verify",
        "webhook_deliveries")},
    "Registry": ".client",
    "Artifact": ".exports",
    "Lineage": ".provenance.lineage",
    "PrefetchReport": ".caching.prefetching",
    "VersionDiff": ".provenance.diff",
}


def __getattr__(name: str) -> typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"

__all__ = [
    "AdapterError",
    "AliasProtectedError",
    "ArchitectureUnknownError",
    "Artifact",
    "BaseNotFoundError",
    "CatalogUnavailableError",
    "CheckpointError",
    "DeviceUnavailableError",
    "DigestMismatchError",
    "DiskFullError",
    "DtypeError",
    "Event",
    "ExportError",
    "ForbiddenError",
    "GcReport",
    "HubNotFoundError",
    "InsecureTransportError",
    "Lineage",
    "ManifestError",
    "MissingBlobError",
    "MlflowUnavailableError",
    "ModelGovernance",
    "ModelVersion",
    "NormalizationError",
    "NotFoundError",
    "OciArtifactError",
    "OciPush",
    "OciUnavailableError",
    "PrefetchReport",
    "PushKeyConflictError",
    "QuantizationError",
    "Ref",
    "RefError",
    "ReferencedVersionError",
    "Registry",
    "RegistryError",
    "SchemaOutOfDateError",
    "SchemeDeviceError",
    "ServerUnavailableError",
    "Settings",
    "SettingsError",
    "Signature",
    "SignatureError",
    "StateDictMismatchError",
    "StoreError",
    "StoreUnavailableError",
    "Trashed",
    "UnauthorizedError",
    "UnexpectedUploadError",
    "UnsafeCheckpointError",
    "UntrustedFactoryError",
    "VersionAliasedError",
    "VersionDiff",
    "VersionExistsError",
    "VersionHeldError",
    "Webhook",
    "WebhookSignatureError",
    "WebhookTargetError",
    "add_webhook",
    "bom",
    "cache_list",
    "card",
    "default_registry",
    "delete_alias",
    "delete_version",
    "diff",
    "events",
    "export",
    "gc",
    "governance",
    "history",
    "hold",
    "import_oci",
    "lineage",
    "list_adapters",
    "list_exports",
    "list_models",
    "list_trash",
    "list_versions",
    "list_webhooks",
    "materialize_uri",
    "parse_ref",
    "prefetch",
    "protect_alias",
    "prune_cache",
    "pull",
    "pull_export",
    "pull_files",
    "pull_state_dict",
    "push",
    "push_oci",
    "release",
    "remove_webhook",
    "restore_version",
    "save_pretrained",
    "set_alias",
    "set_retention",
    "set_tags",
    "show",
    "sign",
    "test_webhook",
    "unprotect_alias",
    "verify",
    "webhook_deliveries",
]
