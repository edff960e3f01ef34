"""Administration: the catalog's schema and recovery (``db``), the object store (``store``)."""

from __future__ import annotations

import click

from ..settings import Settings
from ..store import BucketAdmin, open_store
from ._context import open_versions


@click.group()
def db() -> None:
    """Catalog schema and recovery."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Migrate the catalog (REGISTRY_CATALOG_URL) up to REVISION (default: head)."""
    from ..catalog.db import current_revision, make_engine, upgrade

    engine = make_engine(Settings.from_env().catalog_url)
    upgrade(engine, revision)
    click.echo(f"catalog at revision {current_revision(engine)}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Migrate the catalog down to REVISION ('base' removes every registry table)."""
    from ..catalog.db import current_revision, downgrade, make_engine

    engine = make_engine(Settings.from_env().catalog_url)
    downgrade(engine, revision)
    click.echo(f"catalog at revision {current_revision(engine) or 'base'}")


@db.command("current")
def db_current() -> None:
    """Print the catalog's schema revision and the one this code needs."""
    from ..catalog.db import current_revision, head_revision, make_engine

    engine = make_engine(Settings.from_env().catalog_url)
    click.echo(f"current {current_revision(engine) or 'none'}, head {head_revision()}")


@db.command("rebuild")
@click.pass_context
def db_rebuild(ctx: click.Context) -> None:
    """Rebuild the catalog from the store's manifests (after losing the database)."""
    count = open_versions(ctx).backend.rebuild()
    click.echo(f"rebuilt the catalog: {count} version(s)")


@click.group()
def store() -> None:
    """Object store administration."""


@store.command("init")
def store_init() -> None:
    """Create the bucket named by REGISTRY_STORE_URL (s3://bucket/prefix), if it is missing."""

    settings = Settings.from_env()
    target = open_store(settings.store_url, settings)
    if not isinstance(target, BucketAdmin):
        click.echo(f"store {target.url} is a local directory; it is created on first push")
        return
    created = target.create_bucket()
    click.echo(f"{'created' if created else 'found existing'} bucket for store {target.url}")


COMMANDS = [db, store]
