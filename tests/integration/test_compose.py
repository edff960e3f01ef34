"""docker-compose.yml agrees with the code: no Docker engine runs here, so the file is parsed,
interpolated with .env.example exactly as `docker compose` would, and its services, ports,
variables and dependencies are checked against the settings the registry really reads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import click
import pytest

from registry.settings import Settings
from registry.store.s3 import S3Store

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"postgres", "minio", "minio-init", "mlflow", "registry"}
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error} and $$ rules."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.groups()
        present = name in env
        empty = not env.get(name)
        if op in (":-", "-"):
            use_default = empty if op == ":-" else not present
            return arg if use_default else env[name]
        if op in (":?", "?"):
            if empty if op == ":?" else not present:
                raise KeyError(f"{name} is required: {arg}")
            return env[name]
        if not present:
            raise KeyError(f"{name} is used without a default and .env.example does not set it")
        return env[name]

    return _VAR.sub(replace, value)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    import yaml

    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def example_env() -> dict[str, str]:
    return _env_file(ROOT / ".env.example")


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any], example_env: dict[str, str]) -> dict[str, Any]:
    return _interpolate(raw, example_env)  # type: ignore[no-any-return]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port."""
    ports = {}
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        ports[int(parts[-1])] = int(parts[-2])
    return ports


def _host_addresses(service: dict[str, Any]) -> dict[int, str]:
    """container port -> the host address it is published on ("" for every interface)."""
    addresses = {}
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        addresses[int(parts[-1])] = parts[-3] if len(parts) == 3 else ""
    return addresses


def _command(service: dict[str, Any]) -> str:
    command = service.get("command", "")
    return command if isinstance(command, str) else " ".join(command)


# -- structure ----------------------------------------------------------------------------

def test_services_healthchecks_and_restart_policies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == SERVICES
    for name, service in services.items():
        if name == "minio-init":
            assert service["restart"] == "no"  # a one-shot job
            assert "healthcheck" not in service
            continue
        assert service["healthcheck"]["test"], name
        assert service["restart"] == "unless-stopped", name


def test_every_dependency_waits_for_the_right_condition(compose: dict[str, Any]) -> None:
    services = compose["services"]
    expected = {
        "minio-init": {"minio": "service_healthy"},
        "mlflow": {"postgres": "service_healthy",
                   "minio-init": "service_completed_successfully"},
        "registry": {"postgres": "service_healthy",
                     "minio-init": "service_completed_successfully",
                     "mlflow": "service_healthy"},
    }
    for name, service in services.items():
        deps = {dep: spec["condition"] for dep, spec in service.get("depends_on", {}).items()}
        assert deps == expected.get(name, {}), name
        for dep, condition in deps.items():
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep}'s healthcheck"


def test_named_volumes_are_declared_and_bind_mounts_exist(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    used = set()
    for service in compose["services"].values():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).is_file(), source
            else:
                used.add(source)
    assert used == declared == {"postgres-data", "minio-data", "registry-home"}


def test_required_variables_are_all_in_env_example(raw: dict[str, Any],
                                                   example_env: dict[str, str]) -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    used = {m.group(1) for m in _VAR.finditer(text) if m.group(1)}
    assert used <= set(example_env), sorted(used - set(example_env))
    # and nothing in .env.example goes unused
    assert set(example_env) <= used, sorted(set(example_env) - used)


def test_no_secret_is_written_into_the_compose_file(raw: dict[str, Any]) -> None:
    for name, service in raw["services"].items():
        for key, value in _env(service).items():
            if any(word in key for word in ("PASSWORD", "SECRET")):
                assert value.startswith("${") and ":?" in value, f"{name}.{key}"


# -- the registry service against the code --------------------------------------------------

def test_registry_variables_are_the_ones_the_code_reads(compose: dict[str, Any]) -> None:
    env = _env(compose["services"]["registry"])
    sources = "\n".join(p.read_text() for d in ("registry", "server")
                        for p in (ROOT / d).rglob("*.py"))
    for key in env:
        if key.startswith(("REGISTRY_", "MLFLOW_")):
            assert f'"{key}"' in sources, f"{key} is set in compose but no code reads it"
    assert {"REGISTRY_CATALOG_URL", "REGISTRY_STORE_URL", "REGISTRY_S3_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "REGISTRY_AUTH_FILE",
            "MLFLOW_TRACKING_URI"} <= set(env)


def test_registry_settings_parse_and_point_at_the_services(compose: dict[str, Any]) -> None:
    from sqlalchemy.engine import make_url

    services = compose["services"]
    env = _env(services["registry"])
    settings = Settings.from_env(env)

    catalog = make_url(settings.catalog_url)
    postgres = _env(services["postgres"])
    assert catalog.drivername == "postgresql+psycopg"
    assert (catalog.host, catalog.port) == ("postgres", 5432)
    assert catalog.username == postgres["POSTGRES_USER"]
    assert catalog.password == postgres["POSTGRES_PASSWORD"]
    assert catalog.database == postgres["POSTGRES_DB"]
    assert settings.auto_migrate is False  # so the command must migrate before serving

    store = S3Store.from_url(settings.store_url, endpoint_url=settings.s3_endpoint_url)
    init = _env(services["minio-init"])
    assert store.bucket == init["REGISTRY_BUCKET"]
    assert 'mc mb --ignore-existing "local/${REGISTRY_BUCKET}"' in _command(services["minio-init"])
    endpoint = urlparse(settings.s3_endpoint_url or "")
    minio = services["minio"]
    minio_names = {"minio", *minio["networks"]["default"]["aliases"]}
    assert endpoint.hostname in minio_names and endpoint.port == 9000
    assert _published(minio)[9000] == 9000  # presigned URLs name port 9000 outside too
    minio_env = _env(minio)
    assert env["AWS_ACCESS_KEY_ID"] == minio_env["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]
    assert urlparse(env["MLFLOW_TRACKING_URI"]).netloc == "mlflow:5000"
    assert env["REGISTRY_AUTH_FILE"].startswith(env["REGISTRY_HOME"])
    assert any(m.endswith(f":{env['REGISTRY_HOME']}") for m in services["registry"]["volumes"])


def test_registry_migrates_then_serves_on_its_published_port(compose: dict[str, Any]) -> None:
    from registry.cli import cli

    service = compose["services"]["registry"]
    script = service["command"][-1]
    steps = [shlex.split(step.strip()) for step in script.split("&&")]
    assert steps[0] == ["registry", "db", "upgrade"]
    assert steps[1] == ["exec", "registry", "serve", "--host", "0.0.0.0", "--port", "8080"]
    ctx = click.Context(cli)
    serve = cli.get_command(ctx, "serve")
    assert serve is not None
    assert {"--host", "--port"} <= {opt for p in serve.params for opt in p.opts}
    db = cli.get_command(ctx, "db")
    assert isinstance(db, click.Group) and db.get_command(ctx, "upgrade") is not None
    store = cli.get_command(ctx, "store")
    assert isinstance(store, click.Group) and store.get_command(ctx, "init") is not None
    assert 8080 in _published(service)
    assert "localhost:8080/healthz" in " ".join(service["healthcheck"]["test"])
    from server.app import create_app

    assert "/healthz" in {getattr(route, "path", None) for route in create_app().routes}


def test_dockerfile_builds_the_same_command(compose: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert compose["services"]["registry"]["build"] == "."
    assert "EXPOSE 8080" in dockerfile
    for path in ("pyproject.toml", "setup.py", "registry", "server", "migrations"):
        assert re.search(rf"^COPY .*\b{path}\b", dockerfile, re.M), path
    # The image installs the release wheel, never the source tree (which hid a package the
    # wheel left out): built in one stage, installed from it in the next.
    assert re.search(r"^RUN python -m build --wheel --outdir /dist \.$", dockerfile, re.M)
    assert re.search(r"^COPY --from=wheel /dist ", dockerfile, re.M)
    installs = re.findall(r"^RUN pip install (.*)$", dockerfile, re.M)
    assert any("torch_registry-*.whl" in line for line in installs), installs
    assert not any(re.search(r"(^|\s)[\"']?\.[\[\"' ]|(^|\s)\.$", line) for line in installs)
    assert "registry db upgrade && exec registry serve --host 0.0.0.0 --port 8080" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored  # or the build context is gigabytes


# -- MLflow and PostgreSQL ------------------------------------------------------------------

def test_mlflow_has_its_own_database_and_artifacts_on_minio(compose: dict[str, Any]) -> None:
    services = compose["services"]
    env = _env(services["mlflow"])
    postgres = _env(services["postgres"])
    backend = urlparse(env["MLFLOW_BACKEND_STORE_URI"])
    assert backend.hostname == "postgres" and backend.port == 5432
    database = backend.path.lstrip("/")
    assert database == postgres["MLFLOW_DB"] != postgres["POSTGRES_DB"]
    init = (ROOT / "deploy/postgres/10-mlflow-database.sh").read_text()
    assert "CREATE DATABASE" in init and "MLFLOW_DB" in init
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    artifacts = urlparse(env["MLFLOW_ARTIFACTS_DESTINATION"])
    assert artifacts.scheme == "s3"
    assert artifacts.netloc == _env(services["minio-init"])["MLFLOW_BUCKET"]
    assert 'mc mb --ignore-existing "local/${MLFLOW_BUCKET}"' in _command(services["minio-init"])
    command = _command(services["mlflow"])
    assert "--port 5000" in command and "MLFLOW_BACKEND_STORE_URI" in command
    assert 5000 in _published(services["mlflow"])
    # The UI has no login and can edit the mirror: published on loopback only.
    assert _host_addresses(services["mlflow"]) == {5000: "127.0.0.1"}
    assert "mlflow:*" in env["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
