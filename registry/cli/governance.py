"""Commands on the event log: ``history`` (one model) and ``audit`` (every model)."""

from __future__ import annotations

import json
from datetime import datetime

import click

from ..events import Event
from ..refs import validate_alias, validate_name
from ..versions import parse_since
from ._context import emit_json_lines, open_versions

# How many events `audit` asks for at a time: it streams, so memory stays flat.
_AUDIT_PAGE = 1000


def events_table(events: list[Event]) -> str:
    """One line per event: id, time, actor, kind, and what changed."""
    rows = [("ID", "AT", "ACTOR", "KIND", "WHAT")]
    for e in events:
        rows.append((str(e.id), e.at[:19].replace("T", " "), e.actor, e.kind, _what(e)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
                     + "  " + r[4] for r in rows).rstrip()


def _what(e: Event) -> str:
    target = f"{e.name}@{e.alias}" if e.alias else e.name
    if e.kind == "alias.set":
        before = f"v{e.previous}" if e.previous is not None else "(none)"
        return f"{target}: {before} -> v{e.version}"
    if e.kind == "alias.deleted":
        return f"{target} (was v{e.previous})" if e.previous is not None else target
    where = f"{target}:v{e.version}" if e.version is not None and not e.alias else target
    if e.kind == "tags.set":
        changed = [f"{k}={v}" for k, v in e.details.get("set", {}).items()]
        changed += [f"-{k}" for k in e.details.get("removed", [])]
        return f"{where} {' '.join(changed)}".rstrip()
    reason = e.details.get("reason")
    return f"{where} ({reason})" if isinstance(reason, str) and reason else where


@click.command()
@click.argument("ref", metavar="NAME[@ALIAS]")
@click.option("--since", help="Only events at or after this ISO-8601 time (UTC if no offset).")
@click.option("--limit", type=click.IntRange(min=1), help="Only the newest N events.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list, one compact event per line.")
@click.pass_context
def history(ctx: click.Context, ref: str, since: str | None, limit: int | None,
            as_json: bool) -> None:
    """What happened to model NAME (or only to NAME@ALIAS), oldest first: who pushed, moved,
    tagged, deleted what and when. Deleted versions keep their history."""
    name, _, alias = ref.partition("@")
    events = open_versions(ctx).history(validate_name(name),
                                        validate_alias(alias) if alias else None,
                                        since=parse_since(since), limit=limit)
    if as_json:
        emit_json_lines([e.to_dict() for e in events])
    elif events:
        click.echo(events_table(events))


@click.command()
@click.option("--since", help="Only events at or after this ISO-8601 time (UTC if no offset).")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON lines: one event object per line.")
@click.pass_context
def audit(ctx: click.Context, since: str | None, as_json: bool) -> None:
    """Every model's events, oldest first: the audit log (through a server: admin scope)."""
    after = parse_since(since)
    reg = open_versions(ctx)
    cursor: int | None = None
    first = True
    while True:
        page = reg.events(since_id=cursor, limit=_AUDIT_PAGE)
        shown = [e for e in page if after is None or datetime.fromisoformat(e.at) >= after]
        if as_json:
            for e in shown:
                click.echo(json.dumps(e.to_dict(), sort_keys=True))
        elif shown:
            table = events_table(shown)
            click.echo(table if first else table.split("\n", 1)[1])
            first = False
        if len(page) < _AUDIT_PAGE:
            return
        cursor = page[-1].id


COMMANDS = [history, audit]
