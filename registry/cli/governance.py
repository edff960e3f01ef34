"""Governance commands: the event log (``history``, ``audit``), the trash (``restore``),
holds (``hold``, ``release``) and retention policies (``retention``)."""

from __future__ import annotations

import json
from datetime import datetime

import click

from ..events import Event
from ..governance import Trashed
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


def trash_table(trashed: list[Trashed]) -> str:
    """``registry ls --trash``: one line per deleted version still restorable."""
    rows = [("VERSION", "DIGEST", "DELETED", "RESTORABLE UNTIL", "HOW")]
    rows += [(t.ref, t.digest[:19], t.deleted_at[:19].replace("T", " "),
              t.restorable_until[:19].replace("T", " "), "expired" if t.expired else "deleted")
             for t in trashed]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


@click.command()
@click.argument("ref", metavar="NAME:vN")
@click.pass_context
def restore(ctx: click.Context, ref: str) -> None:
    """Bring deleted version NAME:vN back from the trash (within REGISTRY_TRASH_DAYS of its
    deletion; `registry ls --trash` lists them). Its aliases are not restored."""
    mv = open_versions(ctx).restore_version(ref)
    click.echo(f"restored {mv.ref}")


@click.command()
@click.argument("ref", metavar="NAME:vN")
@click.option("--reason", required=True, help="Why (a case, an audit): shown to whoever is "
              "refused.")
@click.pass_context
def hold(ctx: click.Context, ref: str, reason: str) -> None:
    """Hold a version: nobody may delete, trash or expire it until `registry release`."""
    mv = open_versions(ctx).hold(ref, reason)
    click.echo(f"held {mv.ref}: {reason}")


@click.command()
@click.argument("ref", metavar="NAME:vN")
@click.pass_context
def release(ctx: click.Context, ref: str) -> None:
    """Lift the hold on a version (through a server: admin scope)."""
    mv = open_versions(ctx).release(ref)
    click.echo(f"released {mv.ref}")


@click.command()
@click.argument("name")
@click.option("--keep-last", type=click.IntRange(min=1), help="Keep at least the N newest.")
@click.option("--max-age", help="Expire versions older than this (90d, 12w, 36h).")
@click.option("--clear", is_flag=True, help="Drop the policy.")
@click.pass_context
def retention(ctx: click.Context, name: str, keep_last: int | None, max_age: str | None,
              clear: bool) -> None:
    """Set NAME's retention policy, applied by `registry gc`: a version that is not among the
    --keep-last newest and older than --max-age goes to the trash (a version.expired event),
    never one an alias points at, a held one or an adapter's base. Without options: show it."""
    reg = open_versions(ctx)
    if clear:
        if keep_last is not None or max_age is not None:
            raise click.UsageError("--clear takes no --keep-last or --max-age")
        reg.set_retention(name)
        click.echo(f"{name}: no retention policy")
        return
    if keep_last is not None or max_age is not None:
        reg.set_retention(name, keep_last=keep_last, max_age=max_age)
    policy = reg.governance(name).retention
    if policy is None:
        click.echo(f"{name}: no retention policy")
        return
    parts = ([f"keep the last {policy.keep_last}"] if policy.keep_last else []) + (
        [f"expire after {policy.max_age.total_seconds() / 86400:g} days"]
        if policy.max_age else [])
    click.echo(f"{name}: {', '.join(parts)}")


COMMANDS = [history, audit, restore, hold, release, retention]
