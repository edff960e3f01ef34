"""Lineage captured at push: the git repository of the working directory, the active MLflow
run, library versions (each behind its ``REGISTRY_LINEAGE_*`` setting), and the parents a push
finds by itself (the previous version whose shards it reuses, an adapter's base) beside the ones
it was given. :mod:`.lineage` holds the record's schema and the graph read back."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ..errors import NotFoundError, RefError
from ..files import VersionFile
from ..refs import Ref, parse
from ..settings import Settings
from .lineage import (
    HEX_COMMIT,
    MAX_PARENTS,
    MAX_TEXT,
    MAX_URI,
    given_datasets,
    given_run,
    link,
    record,
    strip_credentials,
)

log = logging.getLogger(__name__)

# Distributions whose versions a push records (import names are never imported for it).
LIBRARIES = {"torch": "torch", "transformers": "transformers", "peft": "peft",
             "torchao": "torchao", "safetensors": "safetensors", "registry": "torch-registry"}
GIT_TIMEOUT_S = 3.0
_GIT_OUTPUT = 4096


@dataclass(frozen=True)
class Captures:
    """Which automatic captures run (the ``REGISTRY_LINEAGE*`` settings)."""

    git: bool = True
    mlflow: bool = True
    libraries: bool = True
    parents: bool = True


def captured(captures: Captures, cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The automatic part of a push's lineage: git, the active MLflow run, library versions."""
    out: dict[str, Any] = {}
    if captures.git and (found := git_facts(cwd)):
        out["git"] = found
    if captures.mlflow and (run := mlflow_run()):
        out["mlflow"] = run
    if captures.libraries and (libs := library_versions()):
        out["libraries"] = libs
    return out


def git_facts(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """Commit, dirty flag and origin URL (credentials stripped) of the git repository holding
    ``cwd`` (default: the working directory); None outside one or without git."""
    commit = _git(["rev-parse", "--verify", "HEAD"], cwd)
    if commit is None or not HEX_COMMIT.fullmatch(commit):
        return None
    # Exit status 1 means tracked files differ from HEAD; untracked files do not count.
    dirty = _git(["diff-index", "--quiet", "HEAD", "--"], cwd, status=True)
    out: dict[str, Any] = {"commit": commit, "dirty": dirty == "1"}
    remote = _git(["config", "--get", "remote.origin.url"], cwd)
    if remote:
        out["remote"] = strip_credentials(remote)[:MAX_URI]
    return out


def _git(args: list[str], cwd: str | os.PathLike[str] | None, *,
         status: bool = False) -> str | None:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(["git", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:  # no git, or it hung
        log.debug("lineage: git %s failed: %s", args[0], exc)
        return None
    if status:
        return str(done.returncode) if done.returncode in (0, 1) else None
    if done.returncode != 0:
        return None
    text = done.stdout[:_GIT_OUTPUT].decode("utf-8", "replace").strip()
    return text.splitlines()[0] if text else None


def mlflow_run() -> dict[str, str] | None:
    """The active MLflow run (run id, experiment id, tracking URI without credentials), read
    only when the caller already imported ``mlflow``: a push never imports it."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return None
    try:
        run = mlflow.active_run()
        if run is None:
            return None
        return {"run_id": str(run.info.run_id)[:MAX_TEXT],
                "experiment_id": str(run.info.experiment_id)[:MAX_TEXT],
                "tracking_uri": strip_credentials(str(mlflow.get_tracking_uri()))[:MAX_URI]}
    except Exception as exc:  # noqa: BLE001 (a broken mlflow must not fail a push)
        log.warning("lineage: the active MLflow run could not be read (%s); not recorded", exc)
        return None


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries a version's bytes depend on, from their
    distribution metadata: nothing is imported."""
    out = {}
    for label, dist in LIBRARIES.items():
        try:
            out[label] = metadata.version(dist)[:MAX_TEXT]
        except metadata.PackageNotFoundError:
            continue
    return out


@dataclass(frozen=True)
class PushLineage:
    """What a push was told and captured before it knows its shards: :meth:`finish` adds the
    previous version it reuses shards of and the adapter's base, and checks the whole."""

    auto: dict[str, Any]
    parents: list[dict[str, Any]]
    datasets: list[dict[str, str]]
    run: dict[str, str] | None
    captures: Captures
    resolve: Callable[[Ref], Any]

    def source(self, source: Mapping[str, Any], name: str, shards: Sequence[VersionFile],
               adapter_base: Mapping[str, Any] | None) -> dict[str, Any]:
        """The manifest's ``source`` section with this push's ``lineage`` in it (none when
        there is nothing to record)."""
        found = self.finish(name, [f.digest for f in shards], adapter_base)
        return {**source, **({"lineage": found} if found else {})}

    def finish(self, name: str, shard_digests: Iterable[str],
               adapter_base: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The ``lineage`` record of a push of ``name`` (None when there is nothing to
        record): the latest version of ``name`` is a parent when the push reuses one of its
        shards."""
        found: list[dict[str, Any]] = []
        if self.captures.parents:
            try:
                previous = self.resolve(Ref(name))
            except NotFoundError:
                previous = None
            if previous is not None and set(shard_digests) & {
                    f["digest"] for f in previous.manifest.get("files", [])}:
                found.append(link(previous, "reused-shards"))
            if adapter_base is not None:
                found.append({**{k: adapter_base[k] for k in ("name", "version", "digest")},
                              "relation": "adapter-base"})
        out = record(self.auto, parents=[*self.parents, *found], datasets=self.datasets,
                     run=self.run)
        return out or None


def begin_push(settings: Settings, resolve: Callable[[Ref], Any],
               parents: Iterable[Any] | None, datasets: Iterable[Mapping[str, Any]] | None,
               run: Mapping[str, Any] | str | None) -> PushLineage:
    """Check what a push was given (parents resolved to digests with ``resolve`` now: one
    that does not resolve raises RefError or NotFoundError before anything is written) and
    capture git, MLflow and library versions as ``settings`` allow."""
    captures = Captures(git=settings.lineage_git, mlflow=settings.lineage_mlflow,
                        libraries=settings.lineage_libraries, parents=settings.lineage_parents)
    if parents is None:
        parents = []
    if isinstance(parents, (str, bytes)):
        parents = [parents]
    given = list(parents)
    if len(given) > MAX_PARENTS:
        raise RefError(f"parents lists {len(given)} versions; a version records at most "
                       f"{MAX_PARENTS}")
    return PushLineage(captured(captures), [link(resolve(parse(p)), "given") for p in given],
                       given_datasets(datasets), given_run(run), captures, resolve)
