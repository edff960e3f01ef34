"""The ``registry`` command: each subcommand is one call of the Registry facade.

A RegistryError prints one line on stderr and exits with the error's exit code; no traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

from .errors import RegistryError


class KeyValue(click.ParamType):
    """``key=value`` pairs for --tag and ``registry tag``."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, str]:
        key, sep, val = str(value).partition("=")
        if not sep or not key:
            self.fail(f"{value!r} is not KEY=VALUE (e.g. dataset=imagenet)", param, ctx)
        return key, val


class JsonObject(click.ParamType):
    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> dict[str, Any]:
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            self.fail(f"{value!r} is not valid JSON ({exc})", param, ctx)
        if not isinstance(parsed, dict):
            self.fail(f"{value!r} must be a JSON object such as '{{\"num_classes\": 10}}'",
                      param, ctx)
        return parsed


def _registry(ctx: click.Context) -> Any:
    if ctx.obj is None:
        from .client import Registry

        ctx.obj = Registry()
    return ctx.obj


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="registry")
def cli() -> None:
    """A model registry for PyTorch: push any checkpoint, pull it on any device."""


from . import cli_server  # noqa: E402,F401  (registers serve, token, mlflow and ui on cli)


@cli.command()
@click.argument("name")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--tag", "tags", type=KeyValue(), multiple=True, help="Tag as KEY=VALUE.")
@click.option("--alias", "aliases", multiple=True, help="Alias to point at the new version.")
@click.option("--factory", help="MODULE:CALLABLE that builds the model, for pull.")
@click.option("--factory-kwargs", type=JsonObject(), help="JSON keyword arguments of --factory.")
@click.option("--precision", help="Declared training precision, e.g. amp-fp16.")
@click.option("--keep-in-fp32", "keep_in_fp32", multiple=True,
              help="Module prefix whose weights always load as float32.")
@click.pass_context
def push(ctx: click.Context, name: str, path: str, tags: tuple[tuple[str, str], ...],
         aliases: tuple[str, ...], factory: str | None, factory_kwargs: dict[str, Any] | None,
         precision: str | None, keep_in_fp32: tuple[str, ...]) -> None:
    """Push the checkpoint at PATH as a new version of NAME (or NAME:vN to claim N)."""
    mv = _registry(ctx).push(path, name, tags=dict(tags), aliases=aliases, factory=factory,
                             factory_kwargs=factory_kwargs, precision=precision,
                             keep_in_fp32=keep_in_fp32)
    click.echo(f"pushed {mv.ref} {mv.digest}")


@cli.command()
@click.argument("ref")
@click.option("--device", default="cpu", show_default=True, help="auto, cpu, cuda, cuda:N, mps.")
@click.option("--dtype", default="auto", show_default=True,
              help="auto, float32, float16, bfloat16, float64.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the weights (.safetensors).")
@click.pass_context
def pull(ctx: click.Context, ref: str, device: str, dtype: str, output: str) -> None:
    """Write the weights of REF to a safetensors file, cast as --device/--dtype would load them."""
    import torch
    from safetensors.torch import save_file

    reg = _registry(ctx)
    mv = reg.show(ref)
    state = reg.pull_state_dict(mv.ref, device=device, dtype=dtype)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            # safetensors refuses shared storage: tied aliases are written as their own copies.
            ptr = value.untyped_storage().data_ptr() if value.numel() else -1
            tensors[key] = value.clone() if ptr in seen else value
            seen.add(ptr)
    extras = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
    metadata = {"format": "pt", "registry.ref": mv.ref, "registry.digest": mv.digest}
    if extras:
        metadata["registry.extras"] = json.dumps(extras)
    save_file({k: t.cpu() for k, t in tensors.items()}, output, metadata=metadata)
    click.echo(f"wrote {mv.ref} to {output}")


@cli.command("ls")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print ModelVersion fields as JSON.")
@click.pass_context
def ls(ctx: click.Context, name: str | None, as_json: bool) -> None:
    """List models, or the versions of NAME."""
    from .display import versions_table

    reg = _registry(ctx)
    if name is None:
        latest = [reg.show(model) for model in reg.list_models()]
        if as_json:
            _emit_json([mv.to_dict() for mv in latest])
        elif latest:
            click.echo(versions_table(latest).replace("VERSION", "LATEST ", 1))
        return
    versions = reg.list_versions(name)
    if as_json:
        _emit_json([mv.to_dict() for mv in versions])
    else:
        click.echo(versions_table(versions))


@cli.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Print ModelVersion fields as JSON.")
@click.pass_context
def show(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Show a version: identity, tags, and where and how it was trained."""
    from .display import version_table

    mv = _registry(ctx).show(ref)
    if as_json:
        _emit_json(mv.to_dict())
    else:
        click.echo(version_table(mv))


@cli.command()
@click.argument("name")
@click.argument("alias")
@click.argument("version", required=False)
@click.option("--delete", is_flag=True, help="Remove the alias instead of setting it.")
@click.pass_context
def alias(ctx: click.Context, name: str, alias: str, version: str | None, delete: bool) -> None:
    """Point NAME@ALIAS at VERSION (3 or v3); --delete removes the alias."""
    reg = _registry(ctx)
    if delete:
        if version is not None:
            raise click.UsageError("--delete takes no VERSION")
        reg.delete_alias(name, alias)
        click.echo(f"deleted {name}@{alias}")
        return
    if version is None:
        raise click.UsageError("missing VERSION (or pass --delete)")
    mv = reg.set_alias(name, alias, version)
    click.echo(f"{name}@{alias} -> {mv.ref}")


@cli.command()
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
    mv = _registry(ctx).set_tags(ref, changes)
    click.echo(f"{mv.ref} tags: " + (", ".join(f"{k}={v}" for k, v in mv.tags.items()) or "-"))


@cli.command()
@click.argument("ref")
@click.pass_context
def rm(ctx: click.Context, ref: str) -> None:
    """Delete version REF (name:vN). Its number is never reused; `registry gc` frees the bytes."""
    mv = _registry(ctx).delete_version(ref)
    click.echo(f"deleted {mv.ref}")


@cli.command()
@click.pass_context
def gc(ctx: click.Context) -> None:
    """Delete stored blobs that no version references."""
    from .display import human_bytes

    report = _registry(ctx).gc()
    click.echo(f"deleted {len(report.deleted)} blob(s), freed {human_bytes(report.freed_bytes)}, "
               f"kept {report.kept}")


@cli.group()
def db() -> None:
    """Catalog schema and recovery."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Migrate the catalog (REGISTRY_CATALOG_URL) up to REVISION (default: head)."""
    from .catalog.db import current_revision, make_engine, upgrade
    from .settings import Settings

    engine = make_engine(Settings.from_env().catalog_url)
    upgrade(engine, revision)
    click.echo(f"catalog at revision {current_revision(engine)}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Migrate the catalog down to REVISION ('base' removes every registry table)."""
    from .catalog.db import current_revision, downgrade, make_engine
    from .settings import Settings

    engine = make_engine(Settings.from_env().catalog_url)
    downgrade(engine, revision)
    click.echo(f"catalog at revision {current_revision(engine) or 'base'}")


@db.command("current")
def db_current() -> None:
    """Print the catalog's schema revision and the one this code needs."""
    from .catalog.db import current_revision, head_revision, make_engine
    from .settings import Settings

    engine = make_engine(Settings.from_env().catalog_url)
    click.echo(f"current {current_revision(engine) or 'none'}, head {head_revision()}")


@db.command("rebuild")
@click.pass_context
def db_rebuild(ctx: click.Context) -> None:
    """Rebuild the catalog from the store's manifests (after losing the database)."""
    count = _registry(ctx).backend.rebuild()
    click.echo(f"rebuilt the catalog: {count} version(s)")


@cli.group()
def store() -> None:
    """Object store administration."""


@store.command("init")
def store_init() -> None:
    """Create the bucket named by REGISTRY_STORE_URL (s3://bucket/prefix), if it is missing."""
    from .settings import Settings
    from .store import open_store

    settings = Settings.from_env()
    target = open_store(settings.store_url, settings)
    create_bucket = getattr(target, "create_bucket", None)
    if create_bucket is None:
        click.echo(f"store {target.url} is a local directory; it is created on first push")
        return
    created = create_bucket()
    click.echo(f"{'created' if created else 'found existing'} bucket for store {target.url}")


def main(argv: list[str] | None = None) -> NoReturn:
    try:
        cli.main(args=argv, prog_name="registry", standalone_mode=False)
    except RegistryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OSError as exc:
        click.echo(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
