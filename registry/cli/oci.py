"""``registry oci push|pull``: a version to and from an OCI registry (a ModelPack artifact)."""

from __future__ import annotations

import click

from ._context import KeyValue, emit_json, open_registry


@click.group()
def oci() -> None:
    """Push versions to, and import them from, OCI registries (oci://HOST[:PORT]/REPO:TAG)."""


@oci.command("push")
@click.argument("ref")
@click.argument("target")
@click.option("--plain-http", is_flag=True,
              help="Allow plain HTTP to TARGET's host (loopback hosts never need it).")
@click.option("--json", "as_json", is_flag=True, help="Print what was pushed as JSON.")
@click.pass_context
def push(ctx: click.Context, ref: str, target: str, plain_http: bool, as_json: bool) -> None:
    """Push version REF to TARGET (oci://HOST[:PORT]/REPO[:TAG], tag default v<N>)."""
    done = open_registry(ctx).push_oci(ref, target, plain_http=plain_http)
    if as_json:
        emit_json(done.to_dict())
        return
    kept = done.layers - done.uploaded - done.mounted
    click.echo(f"{done.ref}@{done.digest}: {done.layers} layers, {done.uploaded} uploaded "
               f"({done.bytes_uploaded} bytes), {done.mounted} mounted, {kept} already there")


@oci.command("pull")
@click.argument("source")
@click.argument("name", required=False)
@click.option("--plain-http", is_flag=True, help="Allow plain HTTP to SOURCE's host.")
@click.option("--tag", "tags", type=KeyValue(), multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--alias", "aliases", multiple=True, help="Alias to set (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the new version as JSON.")
@click.pass_context
def pull(ctx: click.Context, source: str, name: str | None, plain_http: bool,
         tags: tuple[tuple[str, str], ...], aliases: tuple[str, ...], as_json: bool) -> None:
    """Import the artifact SOURCE (oci://...:TAG or @sha256:...) as a new version of NAME."""
    mv = open_registry(ctx).import_oci(source, name, plain_http=plain_http, tags=dict(tags),
                                       aliases=aliases)
    if as_json:
        emit_json(mv.to_dict())
        return
    click.echo(f"{mv.ref} {mv.digest}")


COMMANDS = [oci]
