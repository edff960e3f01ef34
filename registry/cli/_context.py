"""What every command module shares: parameter types, the registry a command runs on, JSON out.

Command modules import this one and never the root group (``registry/cli/__init__.py``), so the
package has no import cycle.
"""

from __future__ import annotations

import json
from typing import Any

import click

from ..versions import Versions


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


def open_versions(ctx: click.Context) -> Versions:
    """The registry this invocation reads and edits versions of, without torch (built on first
    use, from the environment): what ls, show, alias, tag, rm, gc and db run on."""
    if ctx.obj is None:
        ctx.obj = Versions()
    return ctx.obj


def open_registry(ctx: click.Context) -> Any:
    """The Registry this invocation pushes, pulls or exports with (built on first use, from the
    environment); it imports torch."""
    if ctx.obj is None or type(ctx.obj) is Versions:
        from ..client import Registry

        ctx.obj = Registry()
    return ctx.obj


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def emit_json_lines(items: list[Any]) -> None:
    """A JSON list with one compact object per line: short, and still readable with grep."""
    click.echo("[" + ",\n ".join(json.dumps(item) for item in items) + "]")
