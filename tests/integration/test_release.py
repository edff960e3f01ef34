"""The release as a user installs it: the sdist and the wheel built from a copy of the checkout,
the wheel installed (not editable) into a fresh venv outside the checkout, and used from there.

Every other test imports the checkout (an editable install), which hides a module the wheel
leaves out; this one imports only what the wheel holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIST_NAME = "torch-registry"
# Not part of the source release: caches, venvs and earlier build outputs of this checkout.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__",
                                    ".demo", ".cache", ".*_cache", "node_modules", ".work")
# Alembic's env.py runs only inside an Alembic command (it reads `context.config` at import);
# `registry db upgrade` below runs it the way it is meant to run.
# A `__main__` module runs the program when imported: it is only located, not imported.
RUNS_ONLY_IN_ALEMBIC = {"registry._migrations.env"}


def _run(command: list[str], *, env: dict[str, str], cwd: Path,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel) built by `python -m build` from a copy of the checkout: the wheel is built
    from the unpacked sdist, so a file the sdist forgets breaks the wheel too."""
    work = tmp_path_factory.mktemp("release")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # No build isolation: the dev extra declares the build backend, so no download is needed.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(work / "dist"),
          str(source)], env=env, cwd=work)
    (sdist,) = (work / "dist").glob("*.tar.gz")
    (wheel,) = (work / "dist").glob("*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def installed(release: tuple[Path, Path],
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh venv holding the wheel, and an environment that keeps the checkout off
    sys.path. The venv sees this interpreter's site-packages (torch and the other dependencies)
    through a plain path line, which does not run the .pth files there, so the editable install
    of the checkout stays out."""
    _, wheel = release
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(purelib) / "_outer_site_packages.pth").write_text("\n".join(outer) + "\n")
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("REGISTRY_")}
    env["REGISTRY_HOME"] = str(venv.parent / "home")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", str(wheel)], env=env, cwd=venv.parent)
    return venv, env


def test_the_sdist_and_the_wheel_carry_every_package_of_the_checkout(
        release: tuple[Path, Path]) -> None:
    sdist, wheel = release
    assert wheel.name.startswith(DIST_NAME.replace("-", "_") + "-")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    with tarfile.open(sdist) as tar:
        in_sdist = {name.partition("/")[2] for name in tar.getnames()}
    for package in ("registry", "server"):
        for init in sorted((ROOT / package).rglob("__init__.py")):
            relative = init.relative_to(ROOT).as_posix()
            assert relative in in_wheel, f"the wheel lacks {relative}"
            assert relative in in_sdist, f"the sdist lacks {relative}"
    for migration in sorted((ROOT / "migrations").rglob("*.py")):
        relative = migration.relative_to(ROOT / "migrations").as_posix()
        assert f"registry/_migrations/{relative}" in in_wheel
    assert "registry/_migrations/script.py.mako" in in_wheel


def test_every_module_of_the_wheel_imports_from_the_installed_copy(
        release: tuple[Path, Path], installed: tuple[Path, dict[str, str]]) -> None:
    _, wheel = release
    venv, env = installed
    modules = sorted(
        name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for name in zipfile.ZipFile(wheel).namelist()
        if name.endswith(".py") and ".dist-info/" not in name)
    modules = [m for m in modules if m not in RUNS_ONLY_IN_ALEMBIC]
    assert "registry.exports" in modules and "server.app" in modules
    script = textwrap.dedent(f"""
        import importlib, importlib.util, os, sys
        venv = {str(venv)!r}
        checkout = os.path.realpath({str(ROOT)!r})
        # (the test venv may live inside the checkout: only the checkout itself must be absent)
        assert checkout not in [os.path.realpath(p or os.getcwd()) for p in sys.path], sys.path
        for name in {modules!r}:
            if name.endswith(".__main__"):
                where = importlib.util.find_spec(name).origin
            else:
                where = getattr(importlib.import_module(name), "__file__", None) or ""
            assert where.startswith(venv), f"{{name}} imported from {{where}}, not {{venv}}"
        print(len({modules!r}), "modules")
    """)
    out = _run([str(venv / "bin" / "python"), "-c", script], env=env, cwd=venv.parent)
    assert out.stdout.strip() == f"{len(modules)} modules"


def test_the_installed_command_pushes_and_the_installed_library_pulls(
        release: tuple[Path, Path], installed: tuple[Path, dict[str, str]]) -> None:
    venv, env = installed
    version = release[1].name.split("-")[1]
    cli = str(venv / "bin" / "registry")
    python = str(venv / "bin" / "python")
    work = venv.parent

    assert "push" in _run([cli, "--help"], env=env, cwd=work).stdout
    # The version is read from the installed distribution's metadata, under its own name.
    assert _run([cli, "--version"], env=env, cwd=work).stdout.split()[-1] == version
    _run([python, "-c", "import torch; torch.manual_seed(0); "
          "torch.save(torch.nn.Linear(4, 3).state_dict(), 'linear.pt')"], env=env, cwd=work)
    pushed = _run([cli, "push", "tiny", "linear.pt", "--tag", "stage=release",
                   "--factory", "torch.nn:Linear",
                   "--factory-kwargs", '{"in_features": 4, "out_features": 3}'],
                  env=env, cwd=work)
    assert pushed.stdout.startswith("pushed tiny:v1 sha256:")
    assert "tiny:v1" in _run([cli, "ls", "tiny"], env=env, cwd=work).stdout
    # The catalog's migrations ship inside the wheel: Alembic runs them from there.
    upgraded = _run([cli, "db", "upgrade"], env=env, cwd=work)
    assert upgraded.stdout.startswith("catalog at revision ")

    script = textwrap.dedent(f"""
        import torch, torch.nn
        import registry
        assert registry.__file__.startswith({str(venv)!r}), registry.__file__
        model = registry.pull("tiny:v1", device="cpu")
        expected = torch.load("linear.pt", weights_only=True)
        assert isinstance(model, torch.nn.Linear)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
        mv = registry.push(model, "tiny", tags={{"stage": "again"}})
        print(mv.ref, registry.show("tiny").tags["stage"])
    """)
    out = _run([python, "-c", script], env=env, cwd=work)
    assert out.stdout.split() == ["tiny:v2", "again"]
