"""Engines, the one place database errors become registry errors, and schema migrations."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, ProgrammingError

from ..errors import CatalogUnavailableError, SchemaOutOfDateError, SettingsError
from ..settings import redact_url as redact

VERSION_TABLE = "registry_alembic_version"
SQLITE_BUSY_TIMEOUT_MS = 60_000
PG_CONNECT_TIMEOUT_S = 10
# Execution option of a connection whose transactions only read (Catalog.resolve's fast path).
READ_ONLY = "registry_read_only"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and write-locking transactions."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SettingsError(f"catalog URL {redact(url)!r} is not a SQLAlchemy URL") from None
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine)
        return engine
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        # libpq waits forever for a host that drops packets; fail with a typed error instead.
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    try:
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    except (ArgumentError, ImportError) as exc:
        raise SettingsError(f"catalog URL {redact(url)!r} cannot be used: {exc}") from None


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Any) -> None:
        # Take the write lock up front: two processes that both read then write would otherwise
        # deadlock on the upgrade from a read lock, and one of them would fail. A transaction
        # that only reads (READ_ONLY) takes a snapshot instead, so it never waits for a writer.
        read_only = connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


@contextlib.contextmanager
def mapped_errors(url: str) -> Iterator[None]:
    """Translate database driver errors into typed registry errors, once, at the boundary."""
    try:
        yield
    except OperationalError as exc:
        text = str(exc.orig) if exc.orig is not None else str(exc)
        if "no such table" in text:
            raise _schema_missing(url) from None
        raise CatalogUnavailableError(
            f"catalog {redact(url)} is unavailable: {text.splitlines()[0]}; check that the "
            "database is running and REGISTRY_CATALOG_URL is right"
        ) from None
    except ProgrammingError as exc:
        text = str(exc.orig) if exc.orig is not None else str(exc)
        if "does not exist" in text and ("relation" in text or "table" in text):
            raise _schema_missing(url) from None
        raise
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise CatalogUnavailableError(
                f"lost the connection to catalog {redact(url)}; retry, and check the database"
            ) from None
        raise


def _schema_missing(url: str) -> SchemaOutOfDateError:
    return SchemaOutOfDateError(
        f"catalog {redact(url)} has no registry tables; run `registry db upgrade`"
    )


# -- migrations -------------------------------------------------------------------------------

def _script_location() -> str:
    return str(resources.files("registry._migrations"))


def alembic_config(engine: Engine) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(_script_location())
    head = script.get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with mapped_errors(str(engine.url)), engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """Serialize first-use migrations of one SQLite file across processes."""
    database = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    lock_path = Path(database + ".migrate-lock")
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    with mapped_errors(str(engine.url)), _migration_lock(engine):
        command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    with mapped_errors(str(engine.url)), _migration_lock(engine):
        command.downgrade(alembic_config(engine), revision)


def ensure_schema(engine: Engine, *, auto_migrate: bool) -> None:
    """Check the catalog is at the code's revision; migrate it first when allowed."""
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return
    if auto_migrate and (current is None or _is_ancestor(current, head)):
        upgrade(engine)
        return
    url = redact(str(engine.url))
    if current is None:
        raise SchemaOutOfDateError(
            f"catalog {url} has no registry schema yet; run `registry db upgrade`"
        )
    if not _is_ancestor(current, head):
        raise SchemaOutOfDateError(
            f"catalog {url} is at revision {current}, which this registry does not know (it "
            f"expects {head}); upgrade the registry package"
        )
    raise SchemaOutOfDateError(
        f"catalog {url} is at revision {current} but this registry needs {head}; run "
        "`registry db upgrade`"
    )


def _is_ancestor(revision: str, head: str) -> bool:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(_script_location())
    try:
        return any(s.revision == revision for s in script.walk_revisions("base", head))
    except Exception:  # an unknown revision id makes alembic raise its own CommandError
        return False
