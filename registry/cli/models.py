"""Commands on models and versions: push, pull, ls, show, alias, tag, rm, gc."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ..display import human_bytes, push_summary, version_summary, version_table, versions_table
from ..io import safewrite
from ..provenance.lineage import given_run, parse_dataset
from ._context import (
    JsonObject,
    KeyValue,
    emit_json,
    emit_json_lines,
    open_registry,
    open_versions,
)
from .exports import exports_table
from .governance import trash_table
from .signing import signatures_table


@click.command()
@click.argument("name")
@click.argument("path", type=click.Path())
@click.option("--tag", "tags", type=KeyValue(), multiple=True, help="Tag as KEY=VALUE.")
@click.option("--alias", "aliases", multiple=True, help="Alias to point at the new version.")
@click.option("--factory", help="MODULE:CALLABLE that builds the model, for pull.")
@click.option("--factory-kwargs", type=JsonObject(), help="JSON keyword arguments of --factory.")
@click.option("--precision", help="Declared training precision, e.g. amp-fp16.")
@click.option("--keep-in-fp32", "keep_in_fp32", multiple=True,
              help="Module prefix whose weights always load as float32.")
@click.option("--shard-size", help="Target shard size, e.g. 512MiB (default REGISTRY_SHARD_SIZE).")
@click.option("--file", "files", type=KeyValue(), multiple=True,
              help="Attach a file as NAME=PATH (e.g. tokenizer.json=./tok/tokenizer.json).")
@click.option("--sign-key", type=click.Path(exists=True, dir_okay=False),
              help="Sign the new version with this EC private key (PEM).")
@click.option("--idempotency-key", help="Retry-safe key: the same push again with the same key "
              "answers the version it made instead of making a duplicate.")
@click.option("--parent", "parents", multiple=True, metavar="REF",
              help="A version this one was derived from (recorded by digest in its lineage).")
@click.option("--dataset", "datasets", multiple=True, metavar="NAME=URI[@DIGEST]",
              help="A dataset it was trained on, e.g. imagenet=s3://data/imagenet@sha256:...")
@click.option("--run", "run", metavar="URI", help="The training run, e.g. runs:/<run id>.")
@click.pass_context
def push(ctx: click.Context, name: str, path: str, tags: tuple[tuple[str, str], ...],
         aliases: tuple[str, ...], factory: str | None, factory_kwargs: dict[str, Any] | None,
         precision: str | None, keep_in_fp32: tuple[str, ...], shard_size: str | None,
         files: tuple[tuple[str, str], ...], sign_key: str | None,
         idempotency_key: str | None, parents: tuple[str, ...], datasets: tuple[str, ...],
         run: str | None) -> None:
    """Push the checkpoint at PATH (a file, or a directory of shards with their index) as a new
    version of NAME (or NAME:vN to claim N). The other files of a directory (config, tokenizer,
    model card) are attached to the version, and a transformers config.json is recorded."""
    mv = open_registry(ctx).push(path, name, tags=dict(tags), aliases=aliases, factory=factory,
                                 factory_kwargs=factory_kwargs, precision=precision,
                                 keep_in_fp32=keep_in_fp32, shard_size=shard_size,
                                 files=dict(files) or None, sign_key=sign_key,
                                 idempotency_key=idempotency_key, parents=list(parents),
                                 datasets=[parse_dataset(d) for d in datasets],
                                 run=given_run(run))
    click.echo(f"pushed {mv.ref} {mv.digest}" + (" (signed)" if sign_key else ""))
    click.echo(push_summary(mv.metadata["push"]))


@click.command()
@click.argument("ref")
@click.option("--device", default="cpu", show_default=True, help="auto, cpu, cuda, cuda:N, mps.")
@click.option("--dtype", default="auto", show_default=True,
              help="auto, float32, float16, bfloat16, float64.")
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Where to write: a .safetensors file, or a folder with --files/--format hf.")
@click.option("--format", "fmt", type=click.Choice(["safetensors", "hf"]), default="safetensors",
              show_default=True,
              help="hf: a folder transformers' from_pretrained loads (config, weights, files).")
@click.option("--files", "files_only", is_flag=True,
              help="Write only the files attached to REF (tokenizer, config...) into the folder.")
@click.option("--merge", is_flag=True,
              help="An adapter version: write its base's weights with the adapter merged in "
                   "(with --format hf, the base's from_pretrained folder so merged; without "
                   "--merge, an adapter version's file holds the adapter's tensors).")
@click.pass_context
def pull(ctx: click.Context, ref: str, device: str, dtype: str, output: str, fmt: str,
         files_only: bool, merge: bool) -> None:
    """Write the weights of REF to a safetensors file, cast as --device/--dtype would load them;
    or, with --format hf, a from_pretrained folder; or, with --files, its attached files.

    The tensors follow each other in the pushed state dict's order (``offset_keys()``), which
    the file's metadata also records, with each module's version, for a push of it."""
    if files_only and fmt == "hf":
        raise click.UsageError("--format hf already writes the attached files; pass one")
    if merge and files_only:
        raise click.UsageError("--merge writes weights and --files the attached files: pass "
                               "one (--format hf --merge writes both, the weights merged)")
    if not (fmt == "hf" or files_only) and os.path.isdir(output):
        raise click.UsageError(f"-o {output} is a folder: pass a .safetensors file to write, or "
                               "--format hf / --files to write into a folder")
    reg = open_registry(ctx)
    if ref.startswith("oci://"):
        # An OCI artifact is not in the catalog: it is named by its oci:// ref, fixed to the
        # manifest its tag names now, so that show and the pull below read the same one.
        from ..oci.door import pinned

        ref = pinned(ref, reg.settings)
    if fmt == "hf" or files_only:
        mv = reg.show(ref)
        source = _source(ref, mv.ref)
        if fmt == "hf":
            where = reg.save_pretrained(source, output, dtype, merge=merge)
            what = "merged into its base " if merge else ""
            click.echo(f"wrote {source} {what}as a from_pretrained folder to {where}")
        else:
            where = reg.pull_files(source, output)
            count = len(mv.metadata.get("attachments", []))
            click.echo(f"wrote {count} file(s) of {source} to {where}")
        return
    from pathlib import Path

    import torch

    from ..io.checkpoints import KEY_ORDER_FIELD, MODULE_METADATA_FIELD
    from ..io.weights import write_safetensors

    mv = reg.show(ref)
    source = _source(ref, mv.ref)
    if merge:
        if "adapter" not in mv.metadata:
            raise click.UsageError(f"--merge merges an adapter version into its base; {source} "
                                   "is not an adapter version: pull it without --merge")
        state = reg.pull(source, device=device, dtype=dtype, merge=True).state_dict()
    else:
        state = reg.pull_state_dict(source, device=device, dtype=dtype)
    tensors = {k: v.cpu().contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}
    extras = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
    metadata = {"registry.ref": source, "registry.digest": mv.digest,
                KEY_ORDER_FIELD: json.dumps(list(tensors))}
    if merge:  # not the version's bytes: its base's, with the adapter merged in
        base = mv.metadata["adapter"]["base"]
        metadata["registry.merged_into"] = f"{base['name']}:v{base.get('version')}"
    if getattr(state, "_metadata", None):
        metadata[MODULE_METADATA_FIELD] = json.dumps(state._metadata)
    if extras:
        metadata["registry.extras"] = json.dumps(extras)
    target = Path(output)
    with safewrite.replacing(safewrite.folder(target.parent) / target.name) as fh:
        write_safetensors(tensors, fh, metadata=metadata, order=list(tensors))
    click.echo(f"wrote {source} to {output}")


@click.command("ls")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list, one compact object per version (show --json: all of it).")
@click.option("--trash", is_flag=True,
              help="List deleted versions still restorable (of NAME, or of every model).")
@click.pass_context
def ls(ctx: click.Context, name: str | None, as_json: bool, trash: bool) -> None:
    """List models, or the versions of NAME; --trash lists deleted versions instead."""
    reg = open_versions(ctx)
    if trash:
        trashed = reg.list_trash(name)
        if as_json:
            emit_json_lines([t.to_dict() for t in trashed])
        elif trashed:
            click.echo(trash_table(trashed))
        return
    if name is None:
        latest = [reg.show(model) for model in reg.list_models()]
        if as_json:
            emit_json_lines([version_summary(mv) for mv in latest])
        elif latest:
            click.echo(versions_table(latest).replace("VERSION", "LATEST ", 1))
        return
    versions = reg.list_versions(name)
    over = reg.list_adapters(name)  # adapter versions over any version of NAME (issue 35)
    if as_json:
        emit_json_lines([version_summary(mv) for mv in versions])
    else:
        click.echo(versions_table(versions))
        if over:
            click.echo("\nadapters:\n" + versions_table(over))


def _source(ref: str, shown: str) -> str:
    """What a command reads after ``show``: an ``oci://`` ref as given, pinned to a digest by
    the caller (the version it holds is not in this catalog, though a local version may carry
    the same name), else the version ``show`` resolved (a bare name or an alias fixed to one
    number for the whole command)."""
    return ref if ref.startswith("oci://") else shown


@click.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True,
              help="Print the ModelVersion with its whole manifest as JSON.")
@click.pass_context
def show(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Show a version: identity, tags, and where and how it was trained."""
    if ref.startswith("oci://"):  # an artifact: the OCI door, not the catalog (torch)
        mv = open_registry(ctx).show(ref)
        exports = []
    else:
        reg = open_versions(ctx)
        mv = reg.show(ref)
        exports = reg.list_exports(mv.ref)
    if as_json:
        # ModelVersion fields, plus "exports" when the version has any.
        emit_json({**mv.to_dict(), **({"exports": [a.to_dict() for a in exports]}
                                      if exports else {})})
    else:
        click.echo(version_table(mv))
        if mv.metadata.get("signatures"):
            click.echo(signatures_table(mv.metadata["signatures"]))
        if exports:
            click.echo(exports_table(exports))


@click.command()
@click.argument("args", nargs=-1, required=True, metavar="NAME@ALIAS [VERSION]")
@click.option("--delete", is_flag=True, help="Remove the alias instead of setting it.")
@click.option("--protect", is_flag=True,
              help="Protect the alias: moving or deleting it then needs --force (embedded) or "
                   "an admin token (server).")
@click.option("--unprotect", is_flag=True, help="Lift the alias's protection.")
@click.option("--force", is_flag=True, help="Move or delete a protected alias.")
@click.pass_context
def alias(ctx: click.Context, args: tuple[str, ...], delete: bool, protect: bool,
          unprotect: bool, force: bool) -> None:
    """Point NAME@ALIAS at VERSION (3 or v3; also NAME ALIAS VERSION); --delete removes the
    alias; --protect / --unprotect guard it."""
    if "@" in args[0]:
        name, _, alias_name = args[0].partition("@")
        rest = args[1:]
    elif len(args) >= 2:
        name, alias_name, rest = args[0], args[1], args[2:]
    else:
        raise click.UsageError("give NAME@ALIAS (or NAME ALIAS), then VERSION")
    if len(rest) > 1:
        raise click.UsageError(f"unexpected extra arguments: {' '.join(rest[1:])}")
    version = rest[0] if rest else None
    reg = open_versions(ctx)
    if protect or unprotect:
        if protect and unprotect or delete:
            raise click.UsageError("pass one of --protect, --unprotect and --delete")
        if version is not None:  # set it first, then protect it
            mv = reg.set_alias(name, alias_name, version, force=force)
            click.echo(f"{name}@{alias_name} -> {mv.ref}")
        if protect:
            reg.protect_alias(name, alias_name)
        else:
            reg.unprotect_alias(name, alias_name)
        click.echo(f"{name}@{alias_name} is {'now' if protect else 'no longer'} protected")
        return
    if delete:
        if version is not None:
            raise click.UsageError("--delete takes no VERSION")
        reg.delete_alias(name, alias_name, force=force)
        click.echo(f"deleted {name}@{alias_name}")
        return
    if version is None:
        raise click.UsageError("missing VERSION (or pass --delete, --protect or --unprotect)")
    mv = reg.set_alias(name, alias_name, version, force=force)
    click.echo(f"{name}@{alias_name} -> {mv.ref}")


@click.command()
@click.argument("ref")
@click.argument("pairs", nargs=-1, type=KeyValue())
@click.option("--rm", "removals", multiple=True, help="Tag key to remove.")
@click.pass_context
def tag(ctx: click.Context, ref: str, pairs: tuple[tuple[str, str], ...],
        removals: tuple[str, ...]) -> None:
    """Set KEY=VALUE tags on REF (and remove --rm KEY ones)."""
    if not pairs and not removals:
        raise click.UsageError("give at least one KEY=VALUE or --rm KEY")
    changes: dict[str, str | None] = {**dict(pairs), **{k: None for k in removals}}
    mv = open_versions(ctx).set_tags(ref, changes)
    click.echo(f"{mv.ref} tags: " + (", ".join(f"{k}={v}" for k, v in mv.tags.items()) or "-"))


@click.command()
@click.argument("ref")
@click.option("--force", is_flag=True,
              help="Delete even if aliases (protected ones too) point at the version (they are "
                   "removed with it) or adapters name it as their base.")
@click.pass_context
def rm(ctx: click.Context, ref: str, force: bool) -> None:
    """Delete version REF (name:vN): it goes to the trash, `registry restore` brings it back
    within REGISTRY_TRASH_DAYS, then `registry gc` purges it. Its number is never reused. A
    version that aliases point at, or that adapters name as their base, is kept unless --force;
    a held one always."""
    mv = open_versions(ctx).delete_version(ref, force=force)
    click.echo(f"deleted {mv.ref}" + (f" (and {', '.join('@' + a for a in mv.aliases)})"
                                       if mv.aliases else ""))


@click.command()
@click.pass_context
def gc(ctx: click.Context) -> None:
    """Delete stored blobs that no version references, and files crashed pushes left.

    Nothing younger than REGISTRY_GC_GRACE (default 6h) is deleted, so a push running meanwhile
    keeps what it reuses; set REGISTRY_GC_GRACE=0 only when no push or pull is running."""
    report = open_versions(ctx).gc()
    click.echo(f"deleted {len(report.deleted)} blob(s), freed {human_bytes(report.freed_bytes)}, "
               f"kept {report.kept}")
    if report.young:
        click.echo(f"kept {report.young} unreferenced blob(s) younger than REGISTRY_GC_GRACE; "
                   "a later gc frees them")
    if report.unknown:
        click.echo(f"skipped {report.unknown} object(s) under blobs/ that are not blobs (named "
                   "in the log); remove them by hand if nothing else uses them")
    if report.temporary_files or report.stale_pushes:
        click.echo(f"removed {report.temporary_files} temporary file(s) of crashed pushes and "
                   f"downloads ({human_bytes(report.temporary_bytes)}), dropped "
                   f"{report.stale_pushes} stale push reservation(s)")
    if report.expired:
        click.echo(f"moved {len(report.expired)} version(s) past their retention policy to the "
                   f"trash: {', '.join(report.expired[:10])}")
    if report.purged:
        click.echo(f"purged {len(report.purged)} version(s) deleted more than REGISTRY_TRASH_DAYS "
                   f"ago: {', '.join(report.purged[:10])}")
    if report.reconciled or report.orphan_manifests:
        click.echo(f"wrote {len(report.reconciled)} store copies the catalog was owed, removed "
                   f"{len(report.orphan_manifests)} manifest(s) of versions never committed")


@click.command()
@click.argument("uri")
@click.argument("dest", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["hf", "safetensors"]), default="hf",
              show_default=True,
              help="hf: the from_pretrained folder (config, weights, files, model.sig); "
                   "safetensors: the weights alone.")
@click.pass_context
def materialize(ctx: click.Context, uri: str, dest: str, fmt: str) -> None:
    """Write the version URI names (registry://NAME, registry://NAME:vN, registry://NAME@ALIAS)
    into folder DEST, whole or not at all, and list what was written: the entry point of a
    KServe storage initializer. REGISTRY_URI picks a server, else the embedded registry."""
    written = open_registry(ctx).materialize_uri(uri, dest, format=fmt)
    for path in written:
        click.echo(f"{path}\t{human_bytes(path.stat().st_size)}")
    click.echo(f"wrote {len(written)} file(s) of {uri} to {dest}")


COMMANDS = [push, pull, materialize, ls, show, alias, tag, rm, gc]
