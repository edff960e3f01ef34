"""``registry webhook``: subscriptions (add, ls, rm, test), their deliveries, and ``deliver``,
which sends what an embedded registry's outbox owes (from a cron job, or ``--follow`` as a
sidecar); a server delivers its own."""

from __future__ import annotations

import contextlib
import logging
import signal
from pathlib import Path
from types import FrameType

import click

from ..backends import LocalBackend
from ..errors import SettingsError
from ..webhooks.records import Delivery
from ..webhooks.worker import DeliveryWorker, deliver_due
from ._context import emit_json, emit_json_lines, open_versions


@click.group()
def webhook() -> None:
    """Webhooks: every event of the log POSTed, signed, to the URLs subscribed."""


@webhook.command("add")
@click.argument("url")
@click.option("--events", required=True,
              help="Comma-separated event kinds (e.g. alias.set,version.created), or '*'.")
@click.option("--models", "models", multiple=True, metavar="PATTERN",
              help="Only models matching this fnmatch pattern (repeatable; default: all).")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read the signing secret from this file (default: generate one).")
@click.pass_context
def add(ctx: click.Context, url: str, events: str, models: tuple[str, ...],
        secret_file: Path | None) -> None:
    """Subscribe URL; prints the webhook's id, and the generated secret once (on stdout)."""
    secret = None
    if secret_file is not None:
        if secret_file.stat().st_size > 4096:
            raise SettingsError(f"--secret-file {secret_file} holds more than 4 KB; a webhook "
                                "secret is 16 to 256 characters")
        secret = secret_file.read_text().strip()
    hook = open_versions(ctx).add_webhook(url, events.split(","), models=list(models) or None,
                                          secret=secret)
    click.echo(f"added webhook {hook.id} -> {hook.url} ({', '.join(hook.events)})", err=True)
    click.echo(hook.id)
    if secret is None:
        click.echo(f"secret: {hook.secret}")
        click.echo("the secret is shown only this once; receivers verify with it", err=True)


@webhook.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List the webhooks."""
    hooks = open_versions(ctx).list_webhooks()
    if as_json:
        emit_json_lines([h.to_dict() for h in hooks])
        return
    for h in hooks:
        state = "enabled" if h.enabled else f"disabled ({h.disabled_reason})"
        models = ",".join(h.models) if h.models else "*"
        click.echo(f"{h.id}  {h.url}  events={','.join(h.events)}  models={models}  {state}")


@webhook.command("rm")
@click.argument("webhook_id", metavar="ID")
@click.pass_context
def rm(ctx: click.Context, webhook_id: str) -> None:
    """Remove webhook ID and the deliveries it was owed."""
    open_versions(ctx).remove_webhook(webhook_id)
    click.echo(f"removed webhook {webhook_id}")


@webhook.command("test")
@click.argument("webhook_id", metavar="ID")
@click.pass_context
def test(ctx: click.Context, webhook_id: str) -> None:
    """Send webhook ID a ping now and print the receiver's status (exit 1 if not 2xx)."""
    status = open_versions(ctx).test_webhook(webhook_id)
    click.echo(f"{webhook_id}: receiver answered {status}")
    if not 200 <= status < 300:
        ctx.exit(1)


@webhook.command("deliveries")
@click.argument("webhook_id", metavar="ID")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with every attempt.")
@click.pass_context
def deliveries(ctx: click.Context, webhook_id: str, limit: int, as_json: bool) -> None:
    """Webhook ID's newest deliveries, newest first, with their attempts."""
    found = open_versions(ctx).webhook_deliveries(webhook_id, limit=limit)
    if as_json:
        emit_json([d.to_dict() for d in found])
        return
    for d in found:
        click.echo(_line(d))


def _line(d: Delivery) -> str:
    last = d.attempts[-1] if d.attempts else None
    answer = "" if last is None else (f" last: {last.status}" if last.status is not None
                                      else f" last: {last.error}")
    return (f"{d.id}  {d.kind:<16} {d.model or '-':<24} {d.state:<9} "
            f"{len(d.attempts)} attempt(s){answer}")


@webhook.command("deliver")
@click.option("--follow", is_flag=True,
              help="Keep delivering as events arrive (a sidecar), until interrupted.")
@click.pass_context
def deliver(ctx: click.Context, follow: bool) -> None:
    """Send what the embedded registry's outbox owes (what is due now; --follow: keep going)."""
    backend = open_versions(ctx).backend
    if not isinstance(backend, LocalBackend):
        raise SettingsError(f"registry server {backend!r} delivers its webhooks itself; "
                            "`registry webhook deliver` runs on an embedded registry")
    hooks = backend.webhooks
    if not follow:
        report = deliver_due(hooks)
        click.echo(f"delivered {report.delivered}, retrying {report.retrying}, failed "
                   f"{report.failed}; {hooks.pending()} pending")
        return
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    worker = DeliveryWorker(hooks)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        worker.stop()

    signal.signal(signal.SIGTERM, stop)
    click.echo("delivering webhooks (Ctrl-C to stop)", err=True)
    with contextlib.suppress(KeyboardInterrupt):
        worker.run()


COMMANDS = [webhook]
