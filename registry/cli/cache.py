"""``registry prefetch`` and ``registry cache ls|prune``: the local verified cache, filled
without building a model (an init container's job) and bounded beside running pulls. None of
them imports torch."""

from __future__ import annotations

from datetime import datetime, timezone

import click

from ..display import human_bytes
from ..io.parallel import DOWNLOAD_CONCURRENCY
from ._context import emit_json, open_versions


@click.command()
@click.argument("refs", nargs=-1, required=True)
@click.option("--jobs", "-j", type=click.IntRange(1, 64), default=DOWNLOAD_CONCURRENCY,
              show_default=True, help="Blobs fetched at once.")
@click.option("--no-files", is_flag=True, help="Only the weights, not the attached files.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
@click.pass_context
def prefetch(ctx: click.Context, refs: tuple[str, ...], jobs: int, no_files: bool,
             as_json: bool) -> None:
    """Fetch and verify every blob of each REF into the local cache, without building the model.

    Run it in an init container or a DaemonSet: the pulls that follow read the cache. Processes
    prefetching or pulling the same version at once download each blob once."""
    versions = open_versions(ctx)
    reports = [versions.prefetch(ref, files=not no_files, jobs=jobs) for ref in refs]
    if as_json:
        emit_json([{"ref": r.ref, "digest": r.digest, "files": r.files, "bytes": r.bytes,
                    "fetched": r.fetched, "fetched_bytes": r.fetched_bytes,
                    "already_cached": r.already_cached} for r in reports])
        return
    for r in reports:
        held = f"{r.files} file(s), {human_bytes(r.bytes)}"
        if r.already_cached:
            click.echo(f"{r.ref}: already in the cache ({held}); nothing fetched")
        else:
            click.echo(f"{r.ref}: fetched {r.fetched} of {held} "
                       f"({human_bytes(r.fetched_bytes)}); verified in the cache")


@click.group()
def cache() -> None:
    """The local verified cache (REGISTRY_CACHE_DIR): what it holds, and bounding it."""


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
@click.pass_context
def cache_ls(ctx: click.Context, as_json: bool) -> None:
    """The versions the cache holds blobs of, and the bytes it holds."""
    found = open_versions(ctx).cache_list()
    if as_json:
        emit_json(found.to_dict())
        return
    for v in found.versions:
        state = "complete" if v.complete else f"{v.held_files} of {v.files} files"
        click.echo(f"{v.ref:<40} {human_bytes(v.held_bytes):>10}  {state:<16} "
                   f"last used {v.last_used:%Y-%m-%d %H:%M:%S}Z")
    for r in found.hub_revisions:  # the Hub door's derived revisions (registry serve)
        used = datetime.fromtimestamp(r.last_used, timezone.utc)
        click.echo(f"{r.origin or r.commit:<40} {human_bytes(r.bytes):>10}  "
                   f"{'hub ' + r.commit[:12]:<16} last used {used:%Y-%m-%d %H:%M:%S}Z")
    click.echo(f"{found.root}: {human_bytes(found.total_bytes)} in {found.blobs} blob(s) "
               f"({found.unlisted_blobs} in no listed version, "
               f"{human_bytes(found.unlisted_bytes)}), {found.signature_memos} signature "
               f"memo(s) ({human_bytes(found.signature_bytes)}), "
               f"{len(found.hub_revisions)} derived Hub revision(s) "
               f"({human_bytes(found.hub_bytes)}), "
               f"{human_bytes(found.temporary_bytes)} of downloads in progress or left")


@cache.command("prune")
@click.option("--keep", multiple=True, metavar="REF", help="Never remove this version's blobs.")
@click.option("--max-size", metavar="SIZE",
              help="Remove the least recently used until the cache holds at most SIZE.")
@click.option("--older-than", metavar="AGE", help="Remove what was not used for AGE (e.g. 7d).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def cache_prune(ctx: click.Context, keep: tuple[str, ...], max_size: str | None,
                older_than: str | None, as_json: bool) -> None:
    """Remove cached blobs, derived Hub revisions and signature memos (all but --keep, without
    --max-size and --older-than). A blob a pull or a download is using now, or a revision being
    derived now, is skipped, never removed."""
    report = open_versions(ctx).prune_cache(keep=keep, max_size=max_size,
                                            older_than=older_than)
    if as_json:
        emit_json(report.to_dict())
        return
    click.echo(f"removed {len(report.removed)} blob(s), freed {human_bytes(report.freed_bytes)}"
               f"; kept {report.kept} of --keep; {len(report.busy)} in use by a pull, skipped; "
               f"removed {len(report.hub_revisions)} derived Hub revision(s) "
               f"({len(report.hub_busy)} being derived, skipped), "
               f"{report.signature_memos} signature memo(s) and "
               f"{report.temporary_files} temporary file(s); "
               f"{human_bytes(report.remaining_bytes)} left")


COMMANDS = [prefetch, cache]
