"""What a new user meets first: the README's first screen, the install lines of the manual
(docs/), and the demo they point at."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch

from tests.helpers import clean_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# The first screen: everything above the feature list.
FIRST_SCREEN = README[:README.index("## Features")]
DEVELOPMENT = (ROOT / "docs" / "development.md").read_text()
PAGES = {path.relative_to(ROOT): path.read_text()
         for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}


def _quick_start() -> str:
    section = FIRST_SCREEN[FIRST_SCREEN.index("## Quick start"):]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return str(code)


def test_the_first_screen_has_the_two_commands_the_cli_and_one_install_line() -> None:
    assert re.search(r"^make demo\b", FIRST_SCREEN, re.M)
    assert re.search(r"^make test\b", FIRST_SCREEN, re.M)
    assert ".venv/bin/registry" in FIRST_SCREEN and "source .venv/bin/activate" in FIRST_SCREEN
    installs = re.findall(r"^pip install .*$", FIRST_SCREEN, re.M)
    assert installs == ["pip install 'torch-registry[all]'   # everything this README uses; "
                        "the import name is `registry`"]
    # CI's own needs live in the manual's Development page, not on the first screen.
    for ci_only in ("CI=true", "Chromium", "npm", "test-oldest-torch"):
        assert ci_only not in FIRST_SCREEN, ci_only
        assert ci_only in DEVELOPMENT, ci_only
    # Every `pip install` the README and the manual show names this distribution, never the
    # unrelated `registry` project of the package index.
    for page, text in PAGES.items():
        for line in re.findall(r"pip install[^`\n]*", text):
            assert "'registry[" not in line and " registry" not in line, (page, line)


def test_the_quick_start_is_the_design_cards_calls_in_five_lines() -> None:
    lines = [line for line in _quick_start().splitlines() if line.strip()]
    assert len(lines) <= 5
    assert lines[0] == "import registry, torchvision"
    assert any(line.startswith("registry.push(model, tags={") for line in lines)
    assert any(line.startswith('model = registry.pull("resnet18:v1", device="auto")')
               for line in lines)
    assert "factory" not in _quick_start() and "name=" not in _quick_start()


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _quick_start()], env=clean_env(tmp_path / "home"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_the_demo_labels_the_error_it_shows_on_purpose_as_expected(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")],
                          env=clean_env(tmp_path / "demo"), cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    if torch.cuda.is_available():
        assert "torch.load: loaded (this machine has a GPU)" in done.stdout
    else:
        (line,) = [ln for ln in done.stdout.splitlines() if "Attempting to deserialize" in ln]
        assert line.strip().startswith("expected error:"), line
        assert "as expected on a machine without a GPU" in done.stdout
    assert "pulled  tinynet:v1" in done.stdout
    assert "without REGISTRY_HOME yours is ~/.registry" in done.stdout


def test_the_readme_names_the_default_home() -> None:
    assert "`~/.registry`" in FIRST_SCREEN


def test_all_is_everything_the_manual_uses_signing_included() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    (combined,) = [spec for spec in extras["all"] if spec.startswith("torch-registry[")]
    named = set(combined[len("torch-registry["):-1].split(","))
    assert named == set(extras) - {"all", "dev", "bench", "test"}
    assert "signing" in named


def test_the_makefiles_editable_install_prints_nothing(tmp_path: Path) -> None:
    """`make demo`'s install lines: an editable install prints no setuptools notice box."""
    shown = subprocess.run(["make", "-s", "-C", str(ROOT), "--eval",
                            "pip-line: ; @echo '$(call PIP,@PY@)'", "pip-line"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert shown.endswith("@PY@ -m pip"), shown
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".cache", ".demo", "site", "build", "dist", "*.egg-info", "node_modules",
        "__pycache__", ".*_cache", "tests", "benchmarks", "docs", "examples", "deploy"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONWARNINGS")}
    done = subprocess.run(f"{shown.replace('@PY@', str(venv / 'bin' / 'python'))} install "
                          f"--quiet --no-deps -e {source}", shell=True, env=env, cwd=source,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert "Editable installation" not in printed and "*****" not in printed, printed
