"""Commands for running a registry service: ``serve``, ``token``, ``mlflow sync`` and ``ui``.

Heavy imports (uvicorn, fastapi, mlflow) happen inside the commands.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import click

from ..backends import LocalBackend
from ..errors import SettingsError
from ..http.remote import RemoteBackend
from ..settings import Settings
from ._context import open_versions

# A mirror must fail fast when MLflow is down: versions stay pending and a later sync catches
# up, so MLflow's default minutes of retries would only stall the caller.
_MLFLOW_FAST_FAIL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def _fast_fail_mlflow() -> None:
    for key, value in _MLFLOW_FAST_FAIL.items():
        os.environ.setdefault(key, value)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--auth-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Token file (default: REGISTRY_AUTH_FILE, else $REGISTRY_HOME/auth.json).")
@click.option("--allow-anonymous", is_flag=True,
              help="Without an auth file: serve anonymous reads and refuse writes.")
def serve(host: str, port: int, auth_file: Path | None, allow_anonymous: bool) -> None:
    """Run the registry server (REST API under /api/v1) on the configured catalog and store."""
    import uvicorn

    from server.app import create_app
    from server.auth import AuthPolicy


    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    path = auth_file or settings.auth_path
    # Only the implicit default may be absent: a file someone named must exist.
    named = "--auth-file" if auth_file is not None else (
        "REGISTRY_AUTH_FILE" if settings.auth_file_named else None)
    if named is not None and not path.exists():
        raise SettingsError(f"{named} {path} does not exist; create it with "
                            f"`registry token create NAME --scopes admin --auth-file {path}`")
    policy = AuthPolicy.for_server(host, auth_file=path if path.exists() else None,
                                   allow_anonymous=allow_anonymous)
    if policy.mode == "tokens":
        logging.getLogger("registry.server").info("tokens from %s", path)
    if settings.mlflow_tracking_uri:
        _fast_fail_mlflow()
    app = create_app(settings, auth=policy)
    uvicorn.run(app, host=host, port=port, log_level="info")


@click.group()
def token() -> None:
    """Bearer tokens for the server (stored as hashes in the auth file)."""


@token.command("create")
@click.argument("name")
@click.option("--scopes", default="read", show_default=True,
              help="Comma-separated: read, write, admin (admin implies write implies read).")
@click.option("--models", "models", default=None, metavar="PATTERNS",
              help="Comma-separated fnmatch patterns ('team-a-*,shared'): the token sees and "
                   "acts on matching models only. Default: every model.")
@click.option("--auth-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Token file (default: REGISTRY_AUTH_FILE, else $REGISTRY_HOME/auth.json).")
def token_create(name: str, scopes: str, models: str | None, auth_file: Path | None) -> None:
    """Create token NAME; print it once on stdout (only its hash is stored)."""
    from server.auth import AuthFile, parse_model_patterns, parse_scopes


    path = auth_file or Settings.from_env().auth_path
    patterns = None if models is None else parse_model_patterns(models)
    plain = AuthFile(path).create(name, parse_scopes(scopes), patterns)
    click.echo(plain)
    over = "all models" if patterns is None else "models " + ",".join(patterns)
    click.echo(f"created token {name!r} ({scopes}; {over}) in {path}; it is shown only this "
               "once", err=True)


@token.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per token.")
@click.option("--auth-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Token file (default: REGISTRY_AUTH_FILE, else $REGISTRY_HOME/auth.json).")
def token_ls(as_json: bool, auth_file: Path | None) -> None:
    """List tokens: name, scopes, the models each may see (patterns, or *) and when it was
    made. Hashes are not shown."""
    import json

    from server.auth import AuthFile


    path = auth_file or Settings.from_env().auth_path
    entries = AuthFile(path).entries()
    if as_json:
        for e in entries:
            click.echo(json.dumps({"name": e.name, "scopes": list(e.scopes),
                                   "models": None if e.models is None else list(e.models),
                                   "created_at": e.created_at}))
        return
    rows = [("NAME", "SCOPES", "MODELS", "CREATED")] + [
        (e.name, ",".join(e.scopes), "*" if e.models is None else ",".join(e.models),
         e.created_at) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))
                   + "  " + row[3])


@token.command("revoke")
@click.argument("name")
@click.option("--auth-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Token file (default: REGISTRY_AUTH_FILE, else $REGISTRY_HOME/auth.json).")
def token_revoke(name: str, auth_file: Path | None) -> None:
    """Revoke token NAME (a running server notices the file change)."""
    from server.auth import AuthFile


    path = auth_file or Settings.from_env().auth_path
    AuthFile(path).revoke(name)
    click.echo(f"revoked token {name!r} in {path}")


@click.group()
def mlflow() -> None:
    """Browse the registry in MLflow's Model Registry UI."""


@mlflow.command("sync")
@click.option("--full", is_flag=True,
              help="Re-mirror every version and remove MLflow versions the catalog lacks.")
@click.pass_context
def mlflow_sync(ctx: click.Context, full: bool) -> None:
    """Mirror new, changed and deleted versions into MLflow (MLFLOW_TRACKING_URI, else
    $REGISTRY_HOME/mlflow.db), and put back what was edited in MLflow's UI. Safe to run any
    number of times."""
    report = _sync(ctx, full=full)
    repaired = report.get("repaired", {})  # a server older than the repair sends none
    click.echo(f"mlflow {report['tracking_uri']}: mirrored {len(report['mirrored'])}, removed "
               f"{len(report['removed'])}, unchanged {report['unchanged']}, repaired "
               f"{len(repaired)}")
    for what, changes in repaired.items():
        click.echo(f"repaired {what}: {', '.join(changes)} (edited in MLflow)")


def _sync(ctx: click.Context, *, full: bool) -> dict[str, Any]:
    _fast_fail_mlflow()
    backend = open_versions(ctx).backend
    if isinstance(backend, RemoteBackend):
        return backend.mlflow_sync(full=full)
    from ..mirror.mirror_mlflow import sync, tracking_uri_for

    reg = open_versions(ctx)
    # Not a server: the embedded (local) backend.
    return sync(cast(LocalBackend, backend), tracking_uri_for(reg.settings), full=full).to_dict()


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535))
@click.pass_context
def ui(ctx: click.Context, host: str, port: int) -> None:
    """Sync the embedded registry into $REGISTRY_HOME/mlflow.db, then serve the MLflow UI on it."""
    from ..mirror.mirror_mlflow import tracking_uri_for
    reg = open_versions(ctx)
    if isinstance(reg.backend, RemoteBackend):
        raise SettingsError("`registry ui` browses the embedded registry; for a server, open "
                            "the MLflow UI of the server's MLFLOW_TRACKING_URI")
    uri = tracking_uri_for(reg.settings)
    if not uri.startswith("sqlite:"):
        raise SettingsError(f"MLFLOW_TRACKING_URI={uri!r} is a server already: open its UI "
                            "directly, or unset it to browse $REGISTRY_HOME/mlflow.db")
    report = _sync(ctx, full=False)
    click.echo(f"synced {len(report['mirrored'])} version(s); MLflow UI on "
               f"http://{host}:{port}/#/models (Ctrl-C to stop)", err=True)
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
               "--host", host, "--port", str(port), "--workers", "1"]
    sys.exit(run_process_group(command))


def run_process_group(command: list[str], *, stop_timeout_s: float = 10.0) -> int:
    """Run ``command`` in a process group of its own and return its exit status; SIGTERM,
    SIGINT or SIGHUP to us ends the whole group (``mlflow server`` starts uvicorn and worker
    children that would otherwise outlive us under ``docker stop`` or a supervisor)."""
    proc = subprocess.Popen(command, start_new_session=True)
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        while True:
            try:
                code = proc.wait(timeout=stop_timeout_s if received else None)
                break
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    finally:
        # Whatever the leader did, its children go with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + received[0] if received else code


COMMANDS = [serve, token, mlflow, ui]
