"""Commands on what a version is made of: lineage, bom, card, diff (registry/provenance)."""

from __future__ import annotations

import click

from ..provenance.lineage import Lineage
from ._context import emit_json, open_versions


@click.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Print the lineage as JSON.")
@click.pass_context
def lineage(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Where REF came from (commit, run, datasets, libraries, parents) and which versions name
    it as a parent."""
    found = open_versions(ctx).lineage(ref)
    if as_json:
        emit_json(found.to_dict())
        return
    click.echo(lineage_text(found))


def lineage_text(found: Lineage) -> str:
    lines = [f"{found.ref}  {found.digest}"]
    if found.git:
        dirty = " (dirty)" if found.git.get("dirty") else ""
        remote = f"  {found.git['remote']}" if found.git.get("remote") else ""
        lines.append(f"git        {found.git['commit']}{dirty}{remote}")
    if found.mlflow:
        lines.append(f"mlflow     run {found.mlflow.get('run_id')} (experiment "
                     f"{found.mlflow.get('experiment_id')}) at {found.mlflow.get('tracking_uri')}")
    if found.run:
        lines.append("run        " + "  ".join(f"{k} {v}" for k, v in sorted(found.run.items())))
    for d in found.datasets:
        digest = f"  {d['digest']}" if d.get("digest") else ""
        lines.append(f"dataset    {d['name']}  {d['uri']}{digest}")
    if found.libraries:
        lines.append("libraries  " + ", ".join(f"{k} {v}" for k, v in
                                              sorted(found.libraries.items())))
    for p in found.parents:
        lines.append(f"parent     {p.ref}  {p.digest}  ({p.relation})")
    for c in found.children:
        lines.append(f"child      {c.ref}  {c.digest}  ({c.relation})")
    if len(lines) == 1:
        lines.append("no lineage recorded (pushed before lineage, or with REGISTRY_LINEAGE=0)")
    return "\n".join(lines)


COMMANDS = [lineage]
