"""Configuration: one frozen object built from the environment when it is needed, never at import.

| variable                    | default                               |
|-----------------------------|---------------------------------------|
| REGISTRY_HOME               | ~/.registry                           |
| REGISTRY_CATALOG_URL        | sqlite:///$REGISTRY_HOME/registry.db  |
| REGISTRY_STORE_URL          | file://$REGISTRY_HOME/objects         |
| REGISTRY_CACHE_DIR          | $REGISTRY_HOME/cache                  |
| REGISTRY_TRUSTED_FACTORIES  | torchvision.models,timm               |
| REGISTRY_AUTO_MIGRATE       | true for SQLite catalogs, else false  |
| REGISTRY_S3_ENDPOINT_URL    | AWS_ENDPOINT_URL_S3, else AWS's own   |
| REGISTRY_URI, REGISTRY_TOKEN| unset: the embedded registry          |
| REGISTRY_AUTH_FILE          | $REGISTRY_HOME/auth.json              |
| REGISTRY_SHARD_SIZE         | 1GiB                                  |
| REGISTRY_GC_GRACE           | 6h                                    |
| REGISTRY_TRASH_DAYS         | 7 (a deleted version stays restorable)|
| MLFLOW_TRACKING_URI         | unset (sync: $REGISTRY_HOME/mlflow.db)|
| AWS_MAX_ATTEMPTS            | 4 (the S3 store's retry bound)        |
| REGISTRY_PREFAULT_THREADS   | 2 (threads mapping a pull's pages)    |
| REGISTRY_S3_PART_SIZE       | 16MiB (S3 ranged GET / upload part)   |
| REGISTRY_S3_CONCURRENCY     | 8 (S3 parts in flight per object)     |
| REGISTRY_OCI_AUTH           | unset: ~/.docker/config.json, else none|
| REGISTRY_OCI_CA_BUNDLE      | unset: the system's CAs               |
| DOCKER_CONFIG               | ~/.docker (its config.json: OCI auth) |
| REGISTRY_VERIFY             | if-signed (off, if-signed, require)   |
| REGISTRY_TRUSTED_KEYS       | unset (PEM public keys, ':'-separated)|
| REGISTRY_TRUSTED_CERTS      | unset (PEM CA certificates, ':'-sep.) |
| REGISTRY_REQUIRE_SIGNED     | false (server: commits must be signed)|
| REGISTRY_STORE_RETRY_SECONDS| 5s (S3 operations retried this long)  |
| REGISTRY_PUSH_LEASE         | 15m (a silent push's reservation)     |
| REGISTRY_LINEAGE            | true (false turns every capture off)  |
| REGISTRY_LINEAGE_GIT        | true (commit, dirty flag, remote URL) |
| REGISTRY_LINEAGE_MLFLOW     | true (the active run, if imported)    |
| REGISTRY_LINEAGE_LIBRARIES  | true (torch, transformers... versions)|
| REGISTRY_LINEAGE_PARENTS    | true (reused version, adapter base)   |
| REGISTRY_WEBHOOK_RETRY_HOURS| 24 (a webhook delivery retried so long)|
| REGISTRY_WEBHOOK_ALLOW_PRIVATE| false (webhooks to private addresses)|
| REGISTRY_WEBHOOK_KEY        | unset: $REGISTRY_HOME/webhook.key     |

``REGISTRY_OCI_AUTH`` holds OCI registry credentials as a JSON object keyed by ``HOST[:PORT]``,
each entry either ``{"username": U, "password": P}``, ``{"auth": base64("U:P")}`` (the entry of
a docker config file, copied as is) or ``{"token": T}`` (a bearer token sent as is), e.g.
``{"ghcr.io": {"username": "me", "password": "ghp_..."}}``.

Every environment variable the registry reads is read here, and only here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Literal, cast

from .errors import SettingsError
from .http.credentials import OciCredential, bearer_token, parse_oci_auth

VerifyMode = Literal["off", "if-signed", "require"]
VERIFY_MODES: tuple[str, ...] = ("off", "if-signed", "require")

DEFAULT_TRUSTED_FACTORIES = ("torchvision.models", "timm")
DEFAULT_SHARD_SIZE = 2**30
DEFAULT_GC_GRACE = timedelta(hours=6)
DEFAULT_TRASH_DAYS = 7
MAX_TRASH_DAYS = 36500
# How long an S3 operation is tried again, with backoff, while the endpoint does not answer:
# a blip of a second or two is invisible to callers, a dead endpoint fails within seconds.
DEFAULT_STORE_RETRY = timedelta(seconds=5)
# A push renews its reservation with each upload; one silent this long died (catalog/leases.py).
DEFAULT_PUSH_LEASE = timedelta(minutes=15)
# Two threads mapping pages kept a cold 806 MB pull 13% ahead of one here (virtio disk).
DEFAULT_PREFAULT_THREADS = 2
# S3 transfers: parts of 16 MiB, 8 in flight per object (s3transfer buffers a few parts per
# transfer). S3 refuses upload parts under 5 MiB (but the last), so no smaller part is taken.
DEFAULT_S3_PART_SIZE = 16 * 2**20
MIN_S3_PART_SIZE = 5 * 2**20
DEFAULT_S3_CONCURRENCY = 8
MAX_S3_CONCURRENCY = 128
# OCI tar layers (registry/oci/unpack.py): a layer may expand to this many times its size
# (model weights barely compress; text does 5-10x; a gzip bomb of zeros 1000x), and never past
# the absolute cap.
DEFAULT_OCI_MAX_EXPANSION = 100
DEFAULT_OCI_MAX_UNPACKED = 256 * 2**30
# An OCI blob download must finish within the grace plus its size at this rate: a registry
# trickling a byte every few seconds (under every per-read timeout) cannot hold a pull forever.
DEFAULT_OCI_MIN_RATE = 64 * 2**10
DEFAULT_OCI_BLOB_GRACE = timedelta(seconds=60)
_MODULE_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_CATALOG_SCHEME_RE = re.compile(r"[a-z][a-z0-9]*(\+[a-z0-9_]+)?://.*", re.S)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Settings:
    """Where the registry keeps its catalog, objects and cache, and what it trusts."""

    home: Path
    catalog_url: str
    store_url: str
    cache_dir: Path
    trusted_factories: tuple[str, ...] = DEFAULT_TRUSTED_FACTORIES
    auto_migrate: bool = True
    s3_endpoint_url: str | None = None
    uri: str | None = None
    token: str | None = None
    auth_file: Path | None = None
    # Whether someone named the auth file (REGISTRY_AUTH_FILE): a named file must exist.
    auth_file_named: bool = False
    mlflow_tracking_uri: str | None = None
    shard_size: int = DEFAULT_SHARD_SIZE
    s3_max_attempts: int | None = None
    # gc never deletes what is younger than this, and drops reservations older than it.
    gc_grace: timedelta = DEFAULT_GC_GRACE
    # How long a deleted version stays in the trash, restorable, before gc purges it.
    trash_days: float = DEFAULT_TRASH_DAYS
    # Threads mapping the pages of a pull's memory-mapped tensors (registry/io/prefault.py);
    # 0: none.
    prefault_threads: int = DEFAULT_PREFAULT_THREADS
    # Part size and parts in flight of one S3 transfer (uploads and ranged GETs alike).
    s3_part_size: int = DEFAULT_S3_PART_SIZE
    s3_concurrency: int = DEFAULT_S3_CONCURRENCY
    # OCI registries (registry/oci): credentials by host, and a CA bundle for their TLS.
    oci_auth: tuple[OciCredential, ...] | None = None
    oci_ca_bundle: Path | None = None
    # What a tar layer may expand to, and the slowest an OCI blob download may be.
    oci_max_expansion: int = DEFAULT_OCI_MAX_EXPANSION
    oci_max_unpacked: int = DEFAULT_OCI_MAX_UNPACKED
    oci_min_rate: int = DEFAULT_OCI_MIN_RATE
    oci_blob_grace: timedelta = DEFAULT_OCI_BLOB_GRACE
    # The docker config file read for OCI credentials when REGISTRY_OCI_AUTH is unset.
    docker_config: Path | None = None
    # Signatures (registry/signing): what a pull demands, and whom it trusts.
    verify: VerifyMode = "if-signed"
    trusted_keys: tuple[Path, ...] = ()
    trusted_certs: tuple[Path, ...] = ()
    # Server: a commit must carry a signature by a trusted key or certificate.
    require_signed: bool = False
    # Window over which S3 operations are retried (registry/store/s3.py).
    store_retry: timedelta = DEFAULT_STORE_RETRY
    # How long a push's reservation outlives its last sign of life (registry/catalog/leases.py).
    push_lease: timedelta = DEFAULT_PUSH_LEASE
    # What a push records of its lineage by itself (registry/provenance/lineage.py).
    lineage_git: bool = True
    lineage_mlflow: bool = True
    lineage_libraries: bool = True
    lineage_parents: bool = True
    # Webhooks (registry/webhooks): how long a delivery is retried, whether private addresses
    # may be called, and the key sealing their secrets (else the key file in the home).
    webhook_retry: timedelta = timedelta(hours=24)
    webhook_allow_private: bool = False
    webhook_key: str | None = field(default=None, repr=False)

    @property
    def auth_path(self) -> Path:
        """The server's token file: REGISTRY_AUTH_FILE, else ``$REGISTRY_HOME/auth.json``."""
        return self.auth_file if self.auth_file is not None else self.home / "auth.json"

    @property
    def mlflow_uri(self) -> str:
        """Where MLflow mirroring goes: MLFLOW_TRACKING_URI, else a SQLite database of its own
        in the registry home (MLflow's tables must not share the catalog's database)."""
        if self.mlflow_tracking_uri:
            return self.mlflow_tracking_uri
        return f"sqlite:///{self.home / 'mlflow.db'}"

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        catalog: str | None = None,
        store: str | None = None,
    ) -> Settings:
        """Read the environment now; explicit arguments win over variables."""
        env = os.environ if environ is None else environ
        home_path = _path(home, "home") if home is not None else _home_from(env)
        catalog_url = catalog if catalog is not None else env.get("REGISTRY_CATALOG_URL") or None
        catalog_var = "catalog" if catalog is not None else "REGISTRY_CATALOG_URL"
        if catalog_url is None:
            catalog_url = f"sqlite:///{home_path / 'registry.db'}"
        elif not _CATALOG_SCHEME_RE.fullmatch(catalog_url):
            raise SettingsError(
                f"{catalog_var}={redact_url(catalog_url)!r} is not a SQLAlchemy URL; use e.g. "
                "'sqlite:////path/registry.db' or 'postgresql+psycopg://user@host/db'"
            )
        store_url = store if store is not None else env.get("REGISTRY_STORE_URL") or None
        store_var = "store" if store is not None else "REGISTRY_STORE_URL"
        if store_url is None:
            store_url = (home_path / "objects").as_uri()
        elif not (store_url.startswith("file://") or store_url.startswith("s3://")):
            raise SettingsError(
                f"{store_var}={store_url!r} is not supported; use 'file:///absolute/path' or "
                "'s3://bucket/prefix'"
            )
        cache_raw = env.get("REGISTRY_CACHE_DIR")
        cache_dir = _path(cache_raw, "REGISTRY_CACHE_DIR") if cache_raw else home_path / "cache"
        auto_default = catalog_url.startswith("sqlite")
        auth_raw = env.get("REGISTRY_AUTH_FILE") or None
        shard_raw = env.get("REGISTRY_SHARD_SIZE") or None
        grace_raw = env.get("REGISTRY_GC_GRACE") or None
        trash_raw = env.get("REGISTRY_TRASH_DAYS") or None
        attempts_raw = env.get("AWS_MAX_ATTEMPTS") or None
        prefault_raw = env.get("REGISTRY_PREFAULT_THREADS") or None
        part_raw = env.get("REGISTRY_S3_PART_SIZE") or None
        concurrency_raw = env.get("REGISTRY_S3_CONCURRENCY") or None
        oci_auth_raw = env.get("REGISTRY_OCI_AUTH") or None
        ca_raw = env.get("REGISTRY_OCI_CA_BUNDLE") or None
        retry_raw = env.get("REGISTRY_STORE_RETRY_SECONDS") or None
        lease_raw = env.get("REGISTRY_PUSH_LEASE") or None
        lineage = _bool(env.get("REGISTRY_LINEAGE"), "REGISTRY_LINEAGE", True)
        hooks_raw = env.get("REGISTRY_WEBHOOK_RETRY_HOURS") or None
        return cls(
            home=home_path,
            catalog_url=catalog_url,
            store_url=store_url,
            cache_dir=cache_dir,
            trusted_factories=_prefixes(env.get("REGISTRY_TRUSTED_FACTORIES")),
            auto_migrate=_bool(env.get("REGISTRY_AUTO_MIGRATE"), "REGISTRY_AUTO_MIGRATE",
                               auto_default),
            s3_endpoint_url=env.get("REGISTRY_S3_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL_S3")
            or None,
            uri=env.get("REGISTRY_URI") or None,
            token=bearer_token(env.get("REGISTRY_TOKEN") or None, "REGISTRY_TOKEN"),
            auth_file=Path(auth_raw).expanduser().absolute() if auth_raw else None,
            auth_file_named=auth_raw is not None,
            mlflow_tracking_uri=env.get("MLFLOW_TRACKING_URI") or None,
            shard_size=parse_size(shard_raw, "REGISTRY_SHARD_SIZE", minimum=1)
            if shard_raw else DEFAULT_SHARD_SIZE,
            gc_grace=parse_duration(grace_raw, "REGISTRY_GC_GRACE")
            if grace_raw else DEFAULT_GC_GRACE,
            trash_days=_days(trash_raw, "REGISTRY_TRASH_DAYS")
            if trash_raw else DEFAULT_TRASH_DAYS,
            s3_max_attempts=_positive_int(attempts_raw, "AWS_MAX_ATTEMPTS")
            if attempts_raw else None,
            prefault_threads=_count(prefault_raw, "REGISTRY_PREFAULT_THREADS")
            if prefault_raw else DEFAULT_PREFAULT_THREADS,
            s3_part_size=parse_size(part_raw, "REGISTRY_S3_PART_SIZE", minimum=MIN_S3_PART_SIZE)
            if part_raw else DEFAULT_S3_PART_SIZE,
            s3_concurrency=_bounded_int(concurrency_raw, "REGISTRY_S3_CONCURRENCY",
                                        MAX_S3_CONCURRENCY)
            if concurrency_raw else DEFAULT_S3_CONCURRENCY,
            oci_auth=parse_oci_auth(oci_auth_raw, "REGISTRY_OCI_AUTH")
            if oci_auth_raw else None,
            oci_ca_bundle=_ca_bundle(ca_raw) if ca_raw else None,
            oci_max_expansion=_bounded_int(env["REGISTRY_OCI_MAX_EXPANSION"],
                                           "REGISTRY_OCI_MAX_EXPANSION", 10**6)
            if env.get("REGISTRY_OCI_MAX_EXPANSION") else DEFAULT_OCI_MAX_EXPANSION,
            oci_max_unpacked=parse_size(env["REGISTRY_OCI_MAX_UNPACKED"],
                                        "REGISTRY_OCI_MAX_UNPACKED", minimum=1)
            if env.get("REGISTRY_OCI_MAX_UNPACKED") else DEFAULT_OCI_MAX_UNPACKED,
            oci_min_rate=parse_size(env["REGISTRY_OCI_MIN_RATE"], "REGISTRY_OCI_MIN_RATE",
                                    minimum=1)
            if env.get("REGISTRY_OCI_MIN_RATE") else DEFAULT_OCI_MIN_RATE,
            oci_blob_grace=parse_duration(env["REGISTRY_OCI_BLOB_GRACE"],
                                          "REGISTRY_OCI_BLOB_GRACE")
            if env.get("REGISTRY_OCI_BLOB_GRACE") else DEFAULT_OCI_BLOB_GRACE,
            docker_config=Path(env.get("DOCKER_CONFIG") or Path.home() / ".docker").expanduser()
            / "config.json",
            verify=_verify_mode(env.get("REGISTRY_VERIFY")),
            trusted_keys=_pem_files(env.get("REGISTRY_TRUSTED_KEYS"), "REGISTRY_TRUSTED_KEYS"),
            trusted_certs=_pem_files(env.get("REGISTRY_TRUSTED_CERTS"),
                                     "REGISTRY_TRUSTED_CERTS"),
            require_signed=_bool(env.get("REGISTRY_REQUIRE_SIGNED"), "REGISTRY_REQUIRE_SIGNED",
                                 False),
            store_retry=parse_duration(retry_raw, "REGISTRY_STORE_RETRY_SECONDS")
            if retry_raw else DEFAULT_STORE_RETRY,
            push_lease=parse_duration(lease_raw, "REGISTRY_PUSH_LEASE")
            if lease_raw else DEFAULT_PUSH_LEASE,
            **{f"lineage_{part}": _bool(env.get(f"REGISTRY_LINEAGE_{part.upper()}"),
                                        f"REGISTRY_LINEAGE_{part.upper()}", True) and lineage
               for part in ("git", "mlflow", "libraries", "parents")},
            webhook_retry=parse_duration(f"{hooks_raw.strip()}h", "REGISTRY_WEBHOOK_RETRY_HOURS")
            if hooks_raw else timedelta(hours=24),
            webhook_allow_private=_bool(env.get("REGISTRY_WEBHOOK_ALLOW_PRIVATE"),
                                        "REGISTRY_WEBHOOK_ALLOW_PRIVATE", False),
            webhook_key=env.get("REGISTRY_WEBHOOK_KEY") or None,
        )

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def _home_from(env: Mapping[str, str]) -> Path:
    raw = env.get("REGISTRY_HOME")
    if raw:
        return _path(raw, "REGISTRY_HOME")
    return Path.home() / ".registry"


def _path(raw: str | os.PathLike[str], variable: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if path.exists() and not path.is_dir():
        raise SettingsError(f"{variable}={str(raw)!r} exists and is not a directory")
    return path


def _prefixes(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return DEFAULT_TRUSTED_FACTORIES
    items = tuple(part.strip() for part in raw.split(",") if part.strip())
    for item in items:
        if not _MODULE_PREFIX_RE.fullmatch(item):
            raise SettingsError(
                f"REGISTRY_TRUSTED_FACTORIES has {item!r}, which is not a Python module path; "
                "use comma-separated prefixes such as 'torchvision.models,mypkg.models'"
            )
    return items


def _verify_mode(raw: str | None) -> VerifyMode:
    if raw is None or raw.strip() == "":
        return "if-signed"
    value = raw.strip().lower()
    if value not in VERIFY_MODES:
        raise SettingsError(f"REGISTRY_VERIFY={raw[:60]!r} is not one of {', '.join(VERIFY_MODES)}"
                            "; use 'require' to refuse unsigned versions, 'off' to skip checks")
    return cast(VerifyMode, value)


def _pem_files(raw: str | None, variable: str) -> tuple[Path, ...]:
    """Existing files named by a ``os.pathsep``-separated list (``:`` on POSIX)."""
    if raw is None or raw.strip() == "":
        return ()
    out = []
    for part in raw.split(os.pathsep):
        if not part.strip():
            continue
        path = Path(part.strip()).expanduser()
        if not path.is_file():
            raise SettingsError(f"{variable} names {part.strip()[:200]!r}, which is not a file; "
                                f"list PEM files separated by {os.pathsep!r}")
        out.append(path.absolute())
    return tuple(out)


def _bool(raw: str | None, variable: str, default: bool) -> bool:
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{variable}={raw!r} is not a boolean; use 1/0, true/false, yes/no")


_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", re.I)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])?", re.I)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size(value: int | str, what: str, *, minimum: int = 0) -> int:
    """``"512MiB"``, ``"1GB"``, ``"1.5GiB"`` or an int -> bytes; :class:`SettingsError` names
    ``what`` (the variable or option) when the value is not a size."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE_RE.fullmatch(value)) and len(value) < 40:
        size = int(float(m.group(1)) * _UNITS[(m.group(2) or "B").lower()])
    else:
        raise SettingsError(f"{what}={str(value)[:40]!r} is not a size; use bytes or a value "
                            "such as '512MiB' or '1GiB'")
    if size < minimum:
        raise SettingsError(f"{what}={value!r} is below the minimum of {minimum} bytes")
    return size


def parse_duration(value: str | int | float | timedelta, what: str) -> timedelta:
    """``"6h"``, ``"30m"``, ``"90s"``, ``"2d"``, ``"0"`` or seconds -> a timedelta;
    :class:`SettingsError` names ``what`` when the value is not a duration."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.fullmatch(value.strip())) \
            and len(value) < 40:
        seconds = float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]
    else:
        raise SettingsError(f"{what}={str(value)[:40]!r} is not a duration; use a value such "
                            "as '6h', '30m', '90s' or '0'")
    if not 0 <= seconds < 10**9:
        raise SettingsError(f"{what}={value!r} must be between 0 seconds and 30 years")
    return timedelta(seconds=seconds)


def _positive_int(raw: str, variable: str) -> int:
    if raw.strip().isdigit() and int(raw) > 0:
        return int(raw)
    raise SettingsError(f"{variable}={raw[:40]!r} is not a positive integer")


def _bounded_int(raw: str, variable: str, most: int) -> int:
    if raw.strip().isdigit() and 1 <= int(raw) <= most:
        return int(raw)
    raise SettingsError(f"{variable}={raw[:40]!r} is not a whole number from 1 to {most}")


def _days(raw: str, variable: str) -> float:
    try:
        days = float(raw.strip()) if len(raw) < 40 else -1.0
    except ValueError:
        days = -1.0
    if 0 <= days <= MAX_TRASH_DAYS:  # NaN fails both
        return days
    raise SettingsError(f"{variable}={raw[:40]!r} is not a number of days; use e.g. 7, 30, "
                        f"0.5 or 0 (gc purges deleted versions at once), at most {MAX_TRASH_DAYS}")


def _count(raw: str, variable: str) -> int:
    if raw.strip().isdigit() and int(raw) <= 64:
        return int(raw)
    raise SettingsError(f"{variable}={raw[:40]!r} is not a thread count; use 0 (off) to 64")


def _ca_bundle(raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_file():
        raise SettingsError(f"REGISTRY_OCI_CA_BUNDLE={raw!r} is not a file; give the path of a "
                            "PEM file of CA certificates")
    return path.absolute()


def redact_url(url: str) -> str:
    """Hide a password in a URL before it goes into a message."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)
