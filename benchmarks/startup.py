"""What a process pays before any weight moves (rows 8 and 9): importing the registry against
importing torch, and resolving a ref in a catalog of 10,000 versions on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import services
from .helpers import ROOT, Bench, Case, duration, interleaved, probe, subprocess_seconds
from .report import Row

CATALOG_VERSIONS = 10_000

# -- row 8: import time -------------------------------------------------------------------------

HEAVY = ("mlflow", "boto3", "botocore", "sqlalchemy", "alembic", "fastapi")


def import_time(b: Bench) -> list[Row]:
    t = interleaved({
        "torch": Case(lambda: subprocess_seconds("import torch")),
        "registry": Case(lambda: subprocess_seconds("import registry")),
    }, runs=max(b.runs, 7))
    base, reg = t["torch"].median, t["registry"].median
    code = (f"import sys, json, registry; print(json.dumps([m for m in {HEAVY!r} "
            "if m in sys.modules]))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                                       capture_output=True, text=True, check=True).stdout)
    row = Row(8, '`python -c "import registry"`', '`python -c "import torch"`',
              "<= +0.3 s; mlflow, boto3, sqlalchemy, fastapi not imported")
    row.measured = f"registry {duration(reg)}, torch {duration(base)}; heavy imports: " + (
        ", ".join(loaded) if loaded else "none")
    row.ratio = f"{reg - base:+.3f} s"
    row.ok = reg - base <= 0.3 and not loaded
    row.notes.append(f"Checked modules: {', '.join(HEAVY)}.")
    if not row.ok:
        row.notes.append("Run `python -X importtime -c 'import registry'` to see what loads.")
    return [row]


# -- row 9: resolve with 10,000 versions -----------------------------------------------------------

def catalog_resolve(b: Bench) -> list[Row]:
    row = Row(9, f"resolve a ref with {CATALOG_VERSIONS:,} versions in the catalog "
                 "(`Registry.show`)", "SQLite; PostgreSQL", "median <= 5 ms")
    template = b.reg.show(b.ref).metadata
    results: dict[str, dict[str, float]] = {}
    sqlite_url = f"sqlite:///{b.scratch('catalog.db')}"
    b.scratch("catalog.db").unlink(missing_ok=True)
    _seeded(sqlite_url, template)
    results["SQLite"] = _resolve_times(b, sqlite_url)
    warm = _resolve_times(b, sqlite_url, queried=False)
    for suffix in ("", "-wal", "-shm", ".migrate-lock"):
        Path(str(b.scratch("catalog.db")) + suffix).unlink(missing_ok=True)
    try:
        with services.postgres_database() as pg_url:
            _seeded(pg_url, template)
            results["PostgreSQL"] = _resolve_times(b, pg_url)
    except RuntimeError as exc:
        row.notes.append(f"PostgreSQL not measured: {exc}.")
    worst = {db: max(times.values()) for db, times in results.items()}
    row.measured = "; ".join(f"{db} {v * 1000:.2f} ms" for db, v in worst.items())
    row.ratio = " / ".join(f"{v * 1000:.2f} ms" for v in worst.values())
    row.ok = all(v <= 0.005 for v in worst.values()) and "PostgreSQL" in results
    detail = "; ".join(
        f"{db}: " + ", ".join(f"`{ref}` {v * 1000:.2f}" for ref, v in times.items())
        for db, times in results.items())
    sqlite_digest = results.get("SQLite", {}).get("catalog-bench@sha256:…", 0.0)
    if sqlite_digest > 0.005:
        row.notes.append(
            f"On SQLite the digest form `name@sha256:…` takes {sqlite_digest * 1000:.1f} ms: for "
            "`WHERE model_id=? AND digest=? AND state='ready' ORDER BY version DESC LIMIT 1` "
            "SQLite (which has no statistics unless someone runs ANALYZE) walks the "
            "(model_id, version) unique index backwards through all versions rather than use "
            "`ix_registry_versions_digest`. Fix (a migration): an index on "
            "(model_id, digest, version), which serves both the filter and the order and "
            "brings the query to ~0.01 ms here; running `ANALYZE` (or `PRAGMA optimize`) "
            "once also makes SQLite choose the digest index.")
    pg = results.get("PostgreSQL", {})
    if pg and max(pg.values()) > 0.005:
        row.notes.append(
            "On PostgreSQL each `show` is 7-8 round trips (pool pre-ping, BEGIN, 4-5 "
            "SELECTs: model, any-live-version check, alias, version row, aliases; COMMIT), "
            "each with SQLAlchemy ORM overhead; resolving in one statement (version row joined "
            "to its model, aliases aggregated) and skipping the separate liveness check when "
            "the row is found would cut it to ~3 round trips.")
    row.notes.append(
        f"One model with {CATALOG_VERSIONS:,} versions (rows inserted in bulk through the "
        "catalog's models, each with a full manifest), 3 aliases; PostgreSQL analyzed after "
        "the insert as autovacuum would. Worst of the per-ref medians is shown; per ref, "
        "median ms over 200 calls on one warm Registry in a fresh interpreter, refs taken "
        f"round-robin, every call running the catalog's queries: {detail}. On SQLite a ref "
        "resolved again while nothing was committed skips the queries "
        "(registry/catalog/warm.py): " + ", ".join(
            f"`{ref}` {v * 1000:.3f}" for ref, v in warm.items()) + " ms.")
    return [row]


def _resolve_times(b: Bench, url: str, *, queried: bool = True) -> dict[str, float]:
    """Per ref, the median seconds of a resolve on the seeded catalog at ``url``: one that runs
    the catalog's queries, or (``queried=False``) one that may skip them."""
    digest = f"sha256:{hashlib.sha256(b'1234').hexdigest()}"
    refs = ["catalog-bench", "catalog-bench:v5000", "catalog-bench@champion",
            f"catalog-bench@{digest}"]
    # In a fresh interpreter that has imported only the registry, as a CLI or server process
    # would: this benchmark's own process carries MLflow, moto's client and a large heap.
    medians = probe("resolve", home=str(b.work / "catalog-home"), catalog=url,
                            refs=refs, calls=200, queried=queried)
    return {(ref if "@sha256" not in ref else "catalog-bench@sha256:…"): medians[ref]
            for ref in refs}


def _seeded(url: str, template: dict[str, Any]) -> None:
    from registry.catalog.repository import Catalog

    catalog = Catalog(url, auto_migrate=True)
    try:
        _seed(catalog, template)
        if catalog.engine.dialect.name == "postgresql":
            # What autovacuum does within a minute of a bulk insert; without statistics the
            # planner picks a bitmap AND of the state and model_id indexes for every lookup.
            from sqlalchemy import text

            with catalog.engine.connect() as conn:
                conn.execute(text("ANALYZE"))
                conn.commit()
    finally:
        catalog.close()


def _seed(catalog: Any, template: dict[str, Any]) -> None:
    from datetime import datetime, timezone

    from sqlalchemy import insert
    from sqlalchemy.orm import Session

    from registry.catalog.models import READY, AliasRow, ModelRow, VersionRow

    catalog.count_versions()  # creates the schema (auto-migrate)
    now = datetime.now(timezone.utc)
    with Session(catalog.engine) as s, s.begin():
        model_row = ModelRow(name="catalog-bench", last_version=CATALOG_VERSIONS, created_at=now)
        s.add(model_row)
        s.flush()
        rows = []
        for v in range(1, CATALOG_VERSIONS + 1):
            digest = f"sha256:{hashlib.sha256(str(v).encode()).hexdigest()}"
            manifest = {**template, "name": "catalog-bench", "version": v, "digest": digest}
            rows.append({"model_id": model_row.id, "version": v, "state": READY,
                         "digest": digest, "size_bytes": template["source"]["size_bytes"],
                         "manifest": json.dumps(manifest, sort_keys=True),
                         "tags": json.dumps({"i": str(v)}), "created_at": now})
        s.execute(insert(VersionRow), rows)
        for alias, v in (("champion", 5000), ("staging", 9999), ("old", 1)):
            s.add(AliasRow(model_id=model_row.id, alias=alias, version=v, updated_at=now))
