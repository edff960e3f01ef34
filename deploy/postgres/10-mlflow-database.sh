#!/bin/sh
# Runs once, when the postgres volume is first initialised: MLflow gets its own database in the
# same server (its tables have generic names such as `tags`, and it uses the default
# `alembic_version` table, so it must not share the registry's database).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -c "CREATE DATABASE \"${MLFLOW_DB:-mlflow}\" OWNER \"$POSTGRES_USER\""
