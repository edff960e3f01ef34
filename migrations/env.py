"""Alembic environment: reads the same Settings as the registry, or the engine it is handed."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from registry.catalog.db import VERSION_TABLE, make_engine
from registry.catalog.models import Base

config = context.config
target_metadata = Base.metadata


def _engine() -> Engine:
    engine = config.attributes.get("engine")
    if engine is not None:
        return engine
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from registry.settings import Settings

        url = Settings.from_env().catalog_url
    return make_engine(url)


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = _engine()
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=VERSION_TABLE,
            # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
            render_as_batch=connection.dialect.name == "sqlite",
            transactional_ddl=True,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
