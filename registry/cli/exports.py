"""``registry export``: an ONNX, pt2 or TorchScript artifact of a version, verified and stored."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from ..display import human_bytes
from ..errors import SettingsError
from ._context import emit_json, open_registry


class Shape(click.ParamType):
    """``1x3x224x224`` for --input-shape."""

    name = "SHAPE"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, ...]:
        from ..exports.common import parse_shape

        if isinstance(value, tuple):
            return value
        try:
            return parse_shape(str(value))
        except SettingsError as exc:
            self.fail(str(exc), param, ctx)


class Axis(click.ParamType):
    """``INPUT:DIM`` for --dynamic-axis (``0:1``: dim 1 of input 0 may vary)."""

    name = "INPUT:DIM"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        first, sep, second = str(value).partition(":")
        if not sep or not first.isdigit() or not second.isdigit():
            self.fail(f"{value!r} is not INPUT:DIM (e.g. 0:1 for a varying sequence length)",
                      param, ctx)
        return int(first), int(second)


@click.command()
@click.argument("ref")
@click.option("--format", "fmt", type=click.Choice(["onnx", "pt2", "torchscript"]),
              default="onnx", show_default=True, help="Artifact format.")
@click.option("--input-shape", "shapes", type=Shape(), multiple=True, required=True,
              help="Shape of one forward() input, e.g. 1x3x224x224 (repeat for each input).")
@click.option("--dynamic-batch", is_flag=True, help="Let dim 0 of every input vary.")
@click.option("--dynamic-axis", "axes", type=Axis(), multiple=True,
              help="INPUT:DIM that may vary besides the batch dim (repeatable).")
@click.option("--opset", type=int, help="ONNX opset (default: the exporter's).")
@click.option("--device", default="cpu", show_default=True, help="Device to export on.")
@click.option("--dtype", default="auto", show_default=True, help="auto, float32, float16, ...")
@click.option("--tolerance", type=float, help="Largest accepted |artifact - module| difference.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Copy the artifact here.")
@click.option("--json", "as_json", is_flag=True, help="Print the Artifact fields as JSON.")
@click.pass_context
def export(ctx: click.Context, ref: str, fmt: str, shapes: tuple[tuple[int, ...], ...],
           dynamic_batch: bool, axes: tuple[tuple[int, int], ...], opset: int | None,
           device: str, dtype: str, tolerance: float | None, output: str | None,
           as_json: bool) -> None:
    """Export REF to --format, verify it against the PyTorch module, store it with the
    version; the same options again return the stored artifact."""
    from ..exports.service import copy_to

    dynamic = [[d for i, d in axes if i == n] for n in range(len(shapes))] if axes else None
    art = open_registry(ctx).export(ref, format=fmt, input_shapes=list(shapes),
                                    dynamic_batch=dynamic_batch, dynamic_axes=dynamic,
                                    opset=opset, device=device, dtype=dtype, tolerance=tolerance)
    if output is not None:
        art = dataclasses.replace(art, path=copy_to(art, Path(output)))
    if as_json:
        emit_json(art.to_dict())
        return
    how = "stored export" if art.cached else "exported and verified"
    click.echo(f"{how}: {art.ref} {art.format} {art.digest[:19]} {human_bytes(art.size)} "
               f"max_abs_diff={art.max_abs_diff:.3g} -> {art.path}")


def exports_table(exports: list[Any]) -> str:
    """The exports of a version, one line each, for ``registry show``."""
    lines = ["exports:"]
    for a in exports:
        shapes = ", ".join("x".join(str(d) for d in i["shape"]) for i in a.params["inputs"])
        dynamic = " dynamic-batch" if a.params.get("dynamic_batch") else ""
        lines.append(f"  {a.format:<11} {shapes}{dynamic}  {a.params.get('device')}/"
                     f"{a.params.get('compute_dtype', a.params.get('dtype'))}  "
                     f"{human_bytes(a.size)}  max_abs_diff={a.max_abs_diff:.3g}  "
                     f"{a.digest[:19]}")
    return "\n".join(lines)


COMMANDS = [export]
