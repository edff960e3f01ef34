"""Commands on what a version is made of: lineage, bom, card, diff (registry/provenance)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..display import human_bytes
from ..io import safewrite
from ..provenance.lineage import Lineage
from ._context import emit_json, open_registry, open_versions

if TYPE_CHECKING:  # diff needs torch; the other commands here never load it
    from ..provenance.diff import VersionDiff


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


@click.command()
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="Print the whole diff as JSON.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many changed tensors to list (largest relative change first).")
@click.pass_context
def diff(ctx: click.Context, a: str, b: str, as_json: bool, top: int) -> None:
    """What changed from version A to version B: tensors added, removed, reshaped; per changed
    tensor the relative L2 norm of the change, the largest absolute difference and the fraction
    of elements changed; per module the same rolled up. Shards both hold are not read."""
    found = open_registry(ctx).diff(a, b)
    if as_json:
        emit_json(found.to_dict())
        return
    click.echo(diff_text(found, top))


def diff_text(found: VersionDiff, top: int) -> str:
    lines = [f"{found.a} -> {found.b} ({found.mode}): {len(found.changed)} changed, "
             f"{found.unchanged} unchanged, {len(found.added)} added, {len(found.removed)} "
             f"removed; {human_bytes(found.bytes_shared)} shared by digest (not read), "
             f"{human_bytes(found.bytes_read)} read"]
    lines += [f"added    {k}" for k in found.added[:top]]
    lines += [f"removed  {k}" for k in found.removed[:top]]
    for c in found.reshaped[:top]:
        lines.append(f"reshaped {c.key}  {c.dtype[0]} {c.shape[0]} -> {c.dtype[1]} {c.shape[1]}")
    if found.changed:
        lines.append(f"{'tensor':<40} {'rel. L2':>10} {'max |diff|':>11} {'changed':>8}")
        for c in found.top(top):
            if c.relative_l2 is None:
                continue
            lines.append(f"{c.key:<40} {_num(c.relative_l2):>10} {_num(c.max_abs):>11} "
                         f"{c.fraction_changed or 0:>8.1%}")
    if found.modules:
        lines.append(f"{'module':<40} {'rel. L2':>10} {'max |diff|':>11} {'tensors':>8}")
        for m in sorted(found.modules, key=lambda m: m.relative_l2, reverse=True)[:top]:
            lines.append(f"{m.module or '(root)':<40} {_num(m.relative_l2):>10} "
                         f"{_num(m.max_abs):>11} {m.changed:>3}/{m.tensors:<4}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


@click.command()
@click.argument("ref")
@click.option("--format", "fmt", type=click.Choice(["cyclonedx", "spdx"]), default="cyclonedx",
              show_default=True, help="BOM format: CycloneDX 1.6 JSON or SPDX 3.0.1 JSON-LD.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the BOM to this file instead of printing it.")
@click.pass_context
def bom(ctx: click.Context, ref: str, fmt: str, output: str | None) -> None:
    """The AI-BOM of REF: CycloneDX 1.6 JSON with the version as a machine-learning-model,
    every file's SHA-256, its parents and datasets; or SPDX 3.0.1 JSON-LD (AI and Dataset
    profiles) with --format spdx."""
    document = open_versions(ctx).bom(ref, fmt)  # type: ignore[arg-type]
    text = json.dumps(document, indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    safewrite.write_bytes(Path(output), text.encode())
    kind = (f"{document['bomFormat']} {document['specVersion']}" if fmt == "cyclonedx"
            else f"SPDX {document['@graph'][0]['specVersion']}")
    click.echo(f"wrote {output} ({kind})")


@click.command()
@click.argument("ref")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the card to this file instead of printing it.")
@click.pass_context
def card(ctx: click.Context, ref: str, output: str | None) -> None:
    """The Hugging Face style model card of REF (Markdown with YAML front matter)."""
    text = open_versions(ctx).card(ref)
    if output is None:
        click.echo(text, nl=False)
        return
    safewrite.write_bytes(Path(output), text.encode())
    click.echo(f"wrote {output}")


COMMANDS = [lineage, diff, bom, card]
