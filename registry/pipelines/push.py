"""The push pipeline: a model the facade checked the arguments of, to a committed version.

Functions over ``(backend, settings, ...)``, the pair of :mod:`registry.pipelines.pull`: the
facade (:meth:`registry.Registry.push`) checks the arguments into a :class:`Request` and calls
:func:`push`; nothing here reaches back into it. The steps, in order (the README's push table):

1. lineage begun (:mod:`registry.provenance.capture`): what the push was given checked, its
   parents resolved, git, MLflow and libraries captured, before the model is touched;
2. :func:`flatten`: the model handed to the one place that decides its format and turns it
   into plain CPU tensors plus the records that rebuild it (:mod:`registry.formats`: a PEFT
   adapter over its base version, a quantized module, a checkpoint file or folder, a module or
   a state dict). Nothing after it reads the model, except the files of a pushed folder
   (step 3);
3. :func:`attach`: the files that travel with the weights, each staged and hashed, then a
   pushed folder's ``model.sig`` checked (:mod:`registry.signing.push`);
4. the name, when none was given (:mod:`registry.model.architectures`);
5. the shards written into the backend's staging folder, hashed as they are written; those the
   latest version stores with the same bytes are not written again
   (:mod:`registry.caching.unchanged`);
6. the manifest draft (:class:`registry.manifest.Draft`), its lineage finished (the latest
   version is a parent when its shards are reused);
7. signed and committed (:mod:`registry.signing.service`): the backend reserves the number,
   uploads what the store lacks and commits; with a ``sign_key`` the version is signed, over a
   server with its commit;
8. the :class:`ModelVersion` the caller gets, with its signatures when it was signed.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from .. import attachments
from .. import manifest as mf
from ..backends import Backend
from ..errors import RefError
from ..files import StagedFile
from ..formats import table as formats
from ..formats.base import Bases, NormalizedWeights
from ..io.weights import write_shards
from ..manifest import ModelVersion
from ..model import architectures
from ..model.factories import factory_string, warn_if_unpullable
from ..provenance import capture
from ..refs import (
    Ref,
    parse,
    parse_push_target,
    push_name_and_tags,
    validate_aliases,
    validate_push_key,
    validate_tags,
)
from ..settings import Settings, parse_size
from ..signing import push as signed_source
from ..signing import service as signing
from ..versions import model_version, newest_first, with_signatures

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Request:
    """What :meth:`registry.Registry.push` was asked, its arguments checked."""

    name: str | None
    claim: int | None  # "name:vN": the number asked for
    tags: dict[str, str]
    aliases: list[str]
    shard_size: int
    architecture: dict[str, Any] = field(default_factory=dict)  # a factory given by the caller
    factory_given: bool = False
    precision: str | None = None
    keep_in_fp32: list[str] = field(default_factory=list)
    files: Mapping[str, PathLike] | None = None
    base: Ref | None = None  # the base version of an adapter, when named
    sign_key: PathLike | None = None
    push_key: str | None = None
    parents: Sequence[str | Ref] | None = None
    datasets: Sequence[Mapping[str, str]] | None = None
    run: Mapping[str, str] | None = None


def request(settings: Settings, name: str | Mapping[str, str] | None, *,
            tags: Mapping[str, str] | None, aliases: Iterable[str], factory: str | Any,
            factory_kwargs: Mapping[str, Any] | None, precision: str | None,
            keep_in_fp32: Iterable[str], shard_size: int | str | None,
            files: Mapping[str, PathLike] | None, base: str | Ref | None,
            sign_key: PathLike | None, idempotency_key: str | None,
            parents: Sequence[str | Ref] | None, datasets: Sequence[Mapping[str, str]] | None,
            run: Mapping[str, str] | None) -> Request:
    """The arguments of :meth:`registry.Registry.push`, checked (a :class:`RefError` naming
    the first bad one) before anything is read or written."""
    name, tags = push_name_and_tags(name, tags)  # the design card's push(model, tags)
    target, claim = parse_push_target(name) if name is not None else (None, None)
    alias_list = validate_aliases(aliases)
    tag_map = cast(dict[str, str], validate_tags(tags))
    push_key = None if idempotency_key is None else validate_push_key(idempotency_key)
    architecture: dict[str, Any] = {}
    if factory is not None:
        architecture["factory"] = warn_if_unpullable(factory_string(factory),
                                                     settings.trusted_factories)
        architecture["factory_kwargs"] = _json_object(factory_kwargs, "factory_kwargs")
    elif factory_kwargs:
        raise RefError("factory_kwargs given without factory; pass factory='module:callable'")
    if precision is not None and (not isinstance(precision, str) or not precision):
        raise RefError(f"invalid precision {precision!r}: use a label such as 'amp-fp16'")
    prefixes = [keep_in_fp32] if isinstance(keep_in_fp32, str) else list(keep_in_fp32)
    target_size = (settings.shard_size if shard_size is None
                   else parse_size(shard_size, "shard_size", minimum=1))
    return Request(target, claim, tag_map, alias_list, target_size, architecture,
                   factory is not None, precision, prefixes, files,
                   parse(base) if base else None, sign_key, push_key, parents, datasets, run)


def push(backend: Backend, settings: Settings, model: object, request: Request) -> ModelVersion:
    """Store ``model`` as a new version, step by step (the module's docstring)."""
    trail = capture.begin_push(settings, backend.resolve, request.parents, request.datasets,
                               request.run)
    flat = flatten(backend, model, request)
    collected, named, architecture, staged = attach(model, request, flat,
                                                    backend.staging_dir())
    try:
        # A pushed folder's model.sig, checked before the shards are written.
        if (fact := signed_source.check_source(model, collected, settings)) is not None:
            flat.source["signed_files"] = fact
        name = request.name or (architectures.default_name(request.tags, architecture)
                                if flat.name is None else request.tags.get("name") or flat.name)
        # The latest version's shards found on this machine are compared, not written again.
        shards = write_shards(flat.tensors, request.shard_size, backend.staging_dir(),
                              known=backend.known_shards(name))
        staged = shards + staged
        files = [s.file for s in shards]
        draft = mf.Draft(
            name=name, created_at=datetime.now(timezone.utc).isoformat(), shards=files,
            tensors=flat.specs, tied_aliases=len(flat.tied), extras=flat.extras,
            architecture=architecture, source=trail.source(
                flat.source, name, files, flat.sections.get("adapter", {}).get("base")),
            module_metadata=flat.module_metadata, key_order=flat.key_order, tags=request.tags,
            sections=flat.sections, attachments=named)
        with signing.commit_signer(backend.signatures, request.sign_key):
            result = backend.push(name, request.claim, staged, draft.for_version, request.tags,
                                  request.aliases, idempotency_key=request.push_key)
        signing.sign_committed(backend.signatures, result.record, request.sign_key,
                               backend.resolve)
    finally:
        for s in staged:
            s.path.unlink(missing_ok=True)
    made = model_version(result.record, push=result.report())
    return with_signatures(backend, made) if request.sign_key is not None else made


def flatten(backend: Backend, model: object, request: Request) -> NormalizedWeights:
    """The one call that decides what ``model`` is and flattens it (:mod:`registry.formats`):
    a PEFT model to its adapter over the base version found, anything else to clean tensors."""
    return formats.flatten(
        model,  # type: ignore[arg-type]
        precision=request.precision, keep_in_fp32=request.keep_in_fp32,
        record_architecture=not request.factory_given,
        bases=Bases(request.base, backend.resolve, functools.partial(newest_first, backend)))


def attach(model: object, request: Request, flat: NormalizedWeights, staging: Path
           ) -> tuple[dict[str, Path], list[dict[str, Any]], dict[str, Any], list[StagedFile]]:
    """The files that travel with the weights, staged: (the files as collected, the manifest's
    ``attachments``, the architecture to record, the staged files). A pushed folder's
    ``model.sig`` is attached as ``provenance/model.sig``; a ``save_pretrained`` folder's
    ``config.json`` is the architecture unless a factory was given."""
    architecture = request.architecture
    folder = Path(model) if isinstance(model, (str, os.PathLike)) else None
    collected = attachments.collect(model, request.files)
    if folder is not None and folder.is_dir():
        if not request.factory_given:
            architecture = attachments.transformers_architecture(folder) or {}
        staged = attachments.stage(attachments.as_provenance(collected), staging)
    else:
        staged = attachments.stage(collected, staging)
    return (collected, attachments.manifest_entries(staged),
            {**flat.architecture, **architecture}, staged)


def _json_object(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RefError(f"{what} must be a dict, got {type(value).__name__}")
    try:
        return dict(json.loads(json.dumps(dict(value), allow_nan=False)))
    except (TypeError, ValueError) as exc:
        raise RefError(f"{what} must be JSON-serializable: {exc}") from None
