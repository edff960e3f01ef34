"""MLflow's Model Registry, operated through its client: what a sync does to one registered model.

Create a version under the registry's own number (placeholders fill gaps, then go), find the
version mirroring a registry ref, remove it, put back tags, descriptions and aliases edited in
MLflow's UI, and recreate a registered model that lost or renumbered versions (MLflow never reuses
a deleted number). Each operation takes the client and what a version should look like
(``mlflow_view.VersionView``); which versions to touch, and when, is ``mirror_mlflow.py``'s
business. :func:`mapped_errors` turns MLflow and connection failures into
``MlflowUnavailableError``, once.

``mlflow`` is imported only inside these functions (it takes seconds to import).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ..catalog.records import VersionRecord
from ..errors import MlflowUnavailableError, RegistryError
from ..settings import redact_url
from .mlflow_view import MODEL_TAGS, VersionView, model_description

log = logging.getLogger(__name__)

MAX_PLACEHOLDERS = 10_000


def mirror_version(client: Any, record: VersionRecord, source: str, tags: dict[str, str],
                   description: str) -> None:
    """Make MLflow show ``record`` as ``source``, ``tags`` and ``description``, under its own
    number, with its aliases (the registered model is created when missing)."""
    name = record.name
    _ensure_registered_model(client, name)
    existing = _find_version(client, name, record.version)
    if existing is None:
        existing = create_aligned(client, name, record.version, source, tags, description)
        if existing is None:
            return  # its number is taken: the repair after the loop recreates the model
    else:
        _put_back(client, existing, tags, description)
    ours = set(record.aliases)
    for alias in set(existing.aliases or []) - ours:
        client.delete_registered_model_alias(name, alias)
    for alias in ours:
        client.set_registered_model_alias(name, alias, existing.version)


def create_aligned(client: Any, name: str, version: int, source: str, tags: dict[str, str],
                   description: str) -> Any:
    """Create the MLflow version numbered ``version`` (placeholders fill gaps, then go); None
    when MLflow has used that number already."""
    for _ in range(MAX_PLACEHOLDERS):
        created = _create(client, name, source, tags, description)
        number = int(created.version)
        if number > version:
            # MLflow never reuses a number (this one was deleted there): a version mirrored
            # under another number would break "same numbers", so none is left behind.
            client.delete_model_version(name, created.version)
            return None
        if number == version:
            return created
        client.delete_model_version(name, created.version)  # a placeholder for a gap
    raise MlflowUnavailableError(f"could not align MLflow versions of {name} with v{version}")


def _create(client: Any, name: str, source: str, tags: dict[str, str], description: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.create_model_version(name, source=source, run_id=None, tags=tags,
                                           description=description)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "INVALID_PARAMETER_VALUE":
            raise
        # A tracking server refuses local-path sources without a run; keep the store URI in the
        # registry.blob_uri tag and name the version by its registry ref instead.
        ref = tags["registry.ref"].replace(":", "/")
        return client.create_model_version(name, source=f"registry:/{ref}", run_id=None,
                                           tags=tags, description=description)


def _find_version(client: Any, name: str, version: int) -> Any:
    """The MLflow version mirroring ``name:v<version>`` (by its registry.ref tag), or None."""
    from mlflow.exceptions import MlflowException

    ref = f"{name}:v{version}"
    try:
        candidate = client.get_model_version(name, str(version))
        if candidate.tags.get("registry.ref") == ref:
            return candidate
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
    for candidate in client.search_model_versions(f"name='{name}'"):
        if candidate.tags.get("registry.ref") == ref:
            # Search results leave aliases out; fetch the version itself to see them.
            return client.get_model_version(name, candidate.version)
    return None


def remove_version(client: Any, name: str, version: int) -> None:
    """Delete the MLflow version mirroring ``name:v<version>``, if there is one."""
    found = _find_version(client, name, version)
    if found is not None:
        client.delete_model_version(name, found.version)


def remove_strays(client: Any, name: str, live: set[int]) -> list[str]:
    """MLflow versions that claim a registry ref the catalog no longer has."""
    removed = []
    for candidate in client.search_model_versions(f"name='{name}'"):
        ref = candidate.tags.get("registry.ref", "")
        number = ref.rpartition(":v")[2]
        if ref.startswith(f"{name}:v") and number.isdigit() and int(number) not in live:
            client.delete_model_version(name, candidate.version)
            removed.append(ref)
    return removed


def _put_back(client: Any, shown: Any, tags: dict[str, str], description: str) -> list[str]:
    """Make MLflow version ``shown`` carry exactly ``tags`` and ``description``; what changed."""
    changed = []
    if any(shown.tags.get(k) != v for k, v in tags.items()) or set(shown.tags) - set(tags):
        for key, value in tags.items():
            if shown.tags.get(key) != value:
                client.set_model_version_tag(shown.name, shown.version, key, value)
        for key in set(shown.tags) - set(tags):
            client.delete_model_version_tag(shown.name, shown.version, key)
        changed.append("tags")
    if (shown.description or "") != description:
        client.update_model_version(shown.name, shown.version, description=description)
        changed.append("description")
    return changed


def repair(client: Any, name: str, records: dict[int, VersionRecord],
           views: Mapping[int, VersionView]) -> dict[str, list[str]]:
    """Put back what was edited in MLflow's UI for the live versions of ``name``: a version
    missing or under another number (the registered model is recreated, since MLflow cannot
    reuse a number), tags, descriptions, aliases, the registered model's own description.
    ``views`` holds what each of ``records`` should look like (``mlflow_view.view``)."""
    shown: dict[int, list[Any]] = {}
    for candidate in client.search_model_versions(f"name='{name}'"):
        ref = candidate.tags.get("registry.ref", "")
        number = ref.rpartition(":v")[2]
        if ref.startswith(f"{name}:v") and number.isdigit():
            shown.setdefault(int(number), []).append(candidate)
    lost = [v for v in sorted(records) if [int(m.version) for m in shown.get(v, [])] != [v]]
    if lost:
        _recreate_model(client, name, records, views)
        return {f"{name}:v{v}": ["restored"] for v in lost}
    repaired: dict[str, list[str]] = {}
    for version in sorted(records):
        view = views[version]
        if changed := _put_back(client, shown[version][0], view.tags, view.description):
            repaired[f"{name}:v{version}"] = changed
    model = client.get_registered_model(name)
    wanted = {alias: v for v, r in records.items() for alias in r.aliases}
    present = {alias: int(v) for alias, v in (model.aliases or {}).items()}
    for alias in sorted(set(present) - set(wanted)):
        client.delete_registered_model_alias(name, alias)
        repaired.setdefault(f"{name}@{alias}", []).append("alias removed")
    for alias, version in sorted(wanted.items()):
        if present.get(alias) != version:
            client.set_registered_model_alias(name, alias, str(version))
            repaired.setdefault(f"{name}:v{version}", []).append(f"alias {alias}")
    if (model.description or "") != model_description(name) \
            or any((model.tags or {}).get(k) != v for k, v in MODEL_TAGS.items()):
        client.update_registered_model(name, description=model_description(name))
        for key, value in MODEL_TAGS.items():
            client.set_registered_model_tag(name, key, value)
        repaired[name] = ["model description"]
    return repaired


def _recreate_model(client: Any, name: str, records: dict[int, VersionRecord],
                    views: Mapping[int, VersionView]) -> None:
    """Delete the registered model and mirror every live version again, in number order, so
    each gets its own number back (placeholders fill the gaps)."""
    from mlflow.exceptions import MlflowException

    log.warning("MLflow lost or renumbered versions of %s: recreating its registered model", name)
    try:
        client.delete_registered_model(name)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
    for version, record in sorted(records.items()):
        mirror_version(client, record, *views[version])


def _ensure_registered_model(client: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
        try:
            client.create_registered_model(name, tags=dict(MODEL_TAGS),
                                           description=model_description(name))
        except MlflowException as again:  # created concurrently by another mirror
            if getattr(again, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise


# -- plumbing -----------------------------------------------------------------------------------

def open_client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` whose tracking and model registry are both ``tracking_uri``."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


@contextlib.contextmanager
def mapped_errors(uri: str) -> Iterator[None]:
    """Turn MLflow and connection failures into MlflowUnavailableError, once, here."""
    try:
        yield
    except RegistryError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise MlflowUnavailableError(
            f"mirroring to MLflow at {redact_url(uri)} failed ({first}); versions stay "
            "pending: run `registry mlflow sync` once MLflow is reachable"
        ) from None
