"""Every error a user can cause, as one tree rooted at :class:`RegistryError`.

    RegistryError
    ├── RefError (ValueError)                  malformed name, ref, alias or version
    ├── SettingsError (ValueError)             a bad environment variable or option
    ├── NotFoundError (LookupError)            unknown model, version, alias or digest
    │   ├── BaseNotFoundError                  an adapter whose base version is not stored
    │   └── HubNotFoundError                   a repo, revision or file the Hub door lacks
    ├── VersionExistsError                     an explicit version claim that is taken or retired
    ├── VersionAliasedError                    deleting a version an alias points at, unforced
    ├── CheckpointError (ValueError)           a file that cannot be read as weights
    │   ├── UnsafeCheckpointError              a pickle that weights_only loading refuses
    │   └── ManifestError                      a manifest that fails its schema or its files
    ├── NormalizationError (ValueError)        state that cannot be stored faithfully
    ├── ArchitectureUnknownError               pull() with no factory and no model=
    ├── UntrustedFactoryError                  a recorded factory outside the trusted prefixes
    ├── StateDictMismatchError                 stored keys/shapes do not fit the module
    ├── DeviceUnavailableError                 a named device that does not exist or cannot hold it
    │   └── SchemeDeviceError                  a quantization scheme with no kernels on the device
    ├── QuantizationError (ValueError)         an unknown scheme, or tensors that disagree with it
    ├── AdapterError (ValueError)              an adapter that does not fit its base
    ├── ReferencedVersionError                 deleting a base that adapters still name
    ├── DtypeError (ValueError)                a dtype that is unknown or cannot run on the device
    ├── DigestMismatchError                    bytes whose sha256 is not the one recorded
    ├── SignatureError                         a signature that does not verify, or none trusted
    ├── ExportError                            an export the exporter cannot do or that differs
    ├── StoreUnavailableError (ConnectionError)
    ├── CatalogUnavailableError (ConnectionError)
    ├── ServerUnavailableError (ConnectionError)  a registry server that does not answer
    ├── MlflowUnavailableError (ConnectionError)
    ├── SchemaOutOfDateError                   a catalog behind the code's migrations
    ├── UnauthorizedError (PermissionError)    a missing, wrong or revoked token (HTTP 401)
    ├── ForbiddenError (PermissionError)       a token without the needed scope (HTTP 403)
    ├── OciUnavailableError (ConnectionError)  an OCI registry unreachable or failing (5xx)
    │   └── InsecureTransportError             plain HTTP (or a redirect) to a non-loopback host
    ├── OciArtifactError (ManifestError)       an OCI artifact that is not a model we can use
    ├── WebhookSignatureError                  a webhook delivery whose signature or time is wrong
    ├── WebhookTargetError (SettingsError)     a webhook URL refused (scheme, private address)
    ├── AliasProtectedError (PermissionError)  moving or deleting a protected alias (HTTP 403)
    ├── VersionHeldError                       deleting or expiring a held version (HTTP 409)
    └── StoreError (OSError)                   an I/O failure on the registry's own files
        └── DiskFullError                      no space left where a push or pull writes

Each class has a stable ``code`` so a server can send it and a client raise the same class.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from typing import Any


class RegistryError(Exception):
    """Root of every error the registry raises on purpose."""

    code = "registry_error"
    exit_code = 1


class RefError(RegistryError, ValueError):
    """A name, ref, alias or version that does not parse."""

    code = "invalid_ref"
    exit_code = 2


class SettingsError(RegistryError, ValueError):
    """A configuration value (environment variable or option) that does not parse."""

    code = "invalid_settings"
    exit_code = 2


class NotFoundError(RegistryError, LookupError):
    """A model, version, alias or digest that does not exist."""

    code = "not_found"
    exit_code = 3


class MissingBlobError(NotFoundError):
    """A blob a version needs vanished from the store while the version was committed (a gc
    that chose it before the push began); the push is undone and may simply be repeated."""

    code = "blob_missing"

    def __init__(self, message: str, *, files: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.files = list(files)  # the VersionFiles that vanished


class HubNotFoundError(NotFoundError):
    """What the Hub door (``/hf``) does not have, with the Hub's ``X-Error-Code`` for it:
    ``RepoNotFound`` (no such model, or one the caller may not see), ``RevisionNotFound``,
    ``EntryNotFound`` (a file the version does not list)."""

    code = "hub_not_found"

    def __init__(self, message: str, *, hub_code: str = "RepoNotFound",
                 commit: str | None = None) -> None:
        super().__init__(message)
        self.hub_code = hub_code
        self.commit = commit


class VersionExistsError(RegistryError):
    """An explicit version claim for a number that is taken or was retired."""

    code = "version_exists"
    exit_code = 4


class PushKeyConflictError(VersionExistsError):
    """A push's idempotency key reused for another push (other files, another claimed version,
    or a version deleted since): the key names one push only."""

    code = "push_key_conflict"


class VersionAliasedError(RegistryError):
    """Deleting a version that aliases point at without ``force=True``: every consumer of the
    alias would get NotFoundError. The message names the aliases and the fix."""

    code = "version_aliased"
    exit_code = 4

    def __init__(self, message: str, *, aliases: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.aliases = list(aliases)


class UnexpectedUploadError(RegistryError):
    """An upload that no push in progress asked for, or larger than the push declared."""

    code = "unexpected_upload"


class CheckpointError(RegistryError, ValueError):
    """A checkpoint file that cannot be read as weights."""

    code = "invalid_checkpoint"
    exit_code = 5


class UnsafeCheckpointError(CheckpointError):
    """A pickle that ``weights_only`` loading refuses; it was never executed."""

    code = "unsafe_checkpoint"


class NormalizationError(RegistryError, ValueError):
    """Model state that cannot be stored faithfully (sparse, quantized, meta, objects)."""

    code = "normalization_failed"
    exit_code = 5


class ArchitectureUnknownError(RegistryError):
    """``pull`` has no recorded factory and no ``model=`` to build the module from."""

    code = "architecture_unknown"
    exit_code = 6


class UntrustedFactoryError(RegistryError):
    """A recorded factory that is neither an nn.Module subclass nor in a trusted module."""

    code = "untrusted_factory"
    exit_code = 6


class StateDictMismatchError(RegistryError):
    """Stored weights whose keys or shapes do not fit the module they are loaded into."""

    code = "state_dict_mismatch"
    exit_code = 6


class DeviceUnavailableError(RegistryError):
    """A requested device that does not exist here or cannot hold the model."""

    code = "device_unavailable"
    exit_code = 7


class SchemeDeviceError(DeviceUnavailableError):
    """A quantized version pulled onto a device that has no kernels for its scheme."""

    code = "scheme_device"


class QuantizationError(RegistryError, ValueError):
    """A quantization scheme this registry does not know, or packed tensors that disagree with
    the scheme's record."""

    code = "quantization_invalid"
    exit_code = 6


class AdapterError(RegistryError, ValueError):
    """An adapter whose config is not one we load, or whose targets its base lacks."""

    code = "adapter_invalid"
    exit_code = 6


class BaseNotFoundError(NotFoundError):
    """An adapter whose base version is not in the registry."""

    code = "adapter_base_missing"


class ReferencedVersionError(RegistryError):
    """A version that other versions (adapters over it) still name."""

    code = "version_referenced"
    exit_code = 4


class DtypeError(RegistryError, ValueError):
    """A dtype that is unknown or that the target device cannot run."""

    code = "invalid_dtype"
    exit_code = 7


class DigestMismatchError(RegistryError):
    """Bytes whose sha256 differs from the digest recorded for them; they are never loaded."""

    code = "digest_mismatch"
    exit_code = 8


class SignatureError(RegistryError):
    """A signature of a version that does not verify (a forged or damaged bundle, files it does
    not cover), or a version refused by the verification policy (unsigned, or signed only by
    keys nobody trusts); nothing of it was loaded."""

    code = "signature_invalid"
    exit_code = 13


class ExportError(RegistryError):
    """An export (ONNX, pt2, TorchScript) that the exporter cannot do, whose artifact does not
    compute what the module computes within the tolerance, or whose extra is not installed."""

    code = "export_failed"
    exit_code = 12


class ManifestError(CheckpointError):
    """A manifest (from a store, a catalog row, a server or a request) that fails its schema,
    or whose files do not hold what it lists; it is never used."""

    code = "invalid_manifest"


class StoreUnavailableError(RegistryError, ConnectionError):
    """The object store cannot be reached or refuses the request."""

    code = "store_unavailable"
    exit_code = 9


class CatalogUnavailableError(RegistryError, ConnectionError):
    """The catalog database cannot be reached."""

    code = "catalog_unavailable"
    exit_code = 9


class ServerUnavailableError(RegistryError, ConnectionError):
    """A registry server that cannot be reached (refused, reset, timed out): the server is
    down, not its catalog (which the server reports as :class:`CatalogUnavailableError`)."""

    code = "server_unavailable"
    exit_code = 9


class SchemaOutOfDateError(RegistryError):
    """The catalog's schema is older (or newer) than this code; the message names the fix."""

    code = "schema_out_of_date"
    exit_code = 10


class MlflowUnavailableError(RegistryError, ConnectionError):
    """The MLflow tracking server cannot be reached or refused a mirroring request."""

    code = "mlflow_unavailable"
    exit_code = 9


class UnauthorizedError(RegistryError, PermissionError):
    """A missing, wrong or revoked token (HTTP 401)."""

    code = "unauthorized"
    exit_code = 11


class ForbiddenError(RegistryError, PermissionError):
    """A valid token without the scope the request needs (HTTP 403)."""

    code = "forbidden"
    exit_code = 11


class OciUnavailableError(RegistryError, ConnectionError):
    """An OCI registry that cannot be reached, or that answered an error the client cannot
    act on (a 5xx, an upload session lost halfway); nothing half-written is kept."""

    code = "oci_unavailable"
    exit_code = 9


class InsecureTransportError(OciUnavailableError):
    """Plain HTTP to (or a redirect towards) a host that is not loopback, without asking for
    it; or a redirect that would carry credentials to another host in the clear."""

    code = "insecure_transport"


class OciArtifactError(ManifestError):
    """An OCI manifest or layer that is not a model artifact this registry can use: an index
    or an image instead of a ModelPack artifact, a layer of an unknown type or over the size
    limit, an annotation that would make an unsafe path."""

    code = "invalid_oci_artifact"


class WebhookSignatureError(RegistryError):
    """A webhook delivery a receiver must refuse (``registry.webhooks.verify``): no or a wrong
    ``X-Registry-Signature``, or an ``X-Registry-Timestamp`` outside the tolerance (a replay)."""

    code = "webhook_signature_invalid"
    exit_code = 16


class WebhookTargetError(SettingsError):
    """A webhook URL the registry will not call: not http(s), or a host that resolves to a
    loopback, link-local, private or metadata address (``REGISTRY_WEBHOOK_ALLOW_PRIVATE=1``
    allows those)."""

    code = "webhook_target_refused"


class StoreError(RegistryError, OSError):
    """Reading or writing the registry's own files failed (a read-only folder, an I/O error):
    the message names the path and the operation; nothing half-written is left visible."""

    code = "store_io_failed"
    exit_code = 17


class DiskFullError(StoreError):
    """No space left (ENOSPC, or a quota: EDQUOT) where a push or pull writes: the message
    names the path, the bytes it needed and the bytes free there."""

    code = "disk_full"


class AliasProtectedError(RegistryError, PermissionError):
    """Moving or deleting a protected alias without the right: ``force=True`` in an embedded
    registry, the ``admin`` scope through a server (HTTP 403)."""

    code = "alias_protected"
    exit_code = 14


class VersionHeldError(RegistryError):
    """Deleting, trashing or expiring a version under a hold (``Registry.hold``): nobody may
    until the hold is released (HTTP 409)."""

    code = "version_held"
    exit_code = 15


def _tree(root: type[RegistryError]) -> list[type[RegistryError]]:
    return [root, *(cls for sub in root.__subclasses__() for cls in _tree(sub))]


# Every class above, by its code: a new error class is sendable by the server without a second
# list to keep in step.
ERRORS_BY_CODE: dict[str, type[RegistryError]] = {cls.code: cls for cls in _tree(RegistryError)}


QUOTE_LIMIT = 200


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters.

    A bad value may be a 1 MB tag, an 8 MiB request body or a 5000-digit number: a message names
    it but never echoes it whole (and ``repr`` of such an int would itself raise ValueError).
    """
    shortener = reprlib.Repr()
    shortener.maxstring = shortener.maxother = shortener.maxlong = limit
    shortener.maxlevel, shortener.maxdict, shortener.maxlist = 2, 6, 6
    try:
        text = shortener.repr(value)
    except ValueError:  # an int past Python's digit limit
        text = f"<int of {value.bit_length()} bits>" if isinstance(value, int) \
            else f"<{type(value).__name__}>"
    if len(text) > limit + 20:
        text = f"{text[:limit]}…"
    return text
