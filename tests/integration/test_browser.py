"""End to end: push with a CUDA-trained checkpoint, sync, open the model's MLflow UI page in
headless Chromium and find the version and its training device rendered on the page."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import registry
from tests.conftest import require_service
from tests.helpers import clean_env, run_cli, save_as_if_on, trained_mlp
from tests.integration.serving import Service, start_mlflow_server, stop_group

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    require_service("headless Chromium", "no chromium on PATH (apt-get install chromium)")
    raise AssertionError("unreachable")


def _page_text(browser: str, url: str, profile: Path) -> str:
    result = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                             "--virtual-time-budget=15000", "--dump-dom", url],
                            capture_output=True, text=True, timeout=120)
    body = re.sub(r"<script.*?</script>|<style.*?</style>", " ", result.stdout, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


@pytest.fixture
def mlflow_ui(tmp_path: Path) -> Iterator[tuple[Path, Service]]:
    home = tmp_path / "home"
    # A checkpoint written on "cuda:3", as a 4-GPU training node would have written it.
    checkpoint = save_as_if_on(trained_mlp().state_dict(), tmp_path / "trained.pt", "cuda:3")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(checkpoint, weights_only=True)  # the real failure the registry removes
    reg = registry.Registry(home=home)
    reg.push(str(checkpoint), "browsed-model", aliases=["champion"])
    reg.close()
    run_cli("mlflow", "sync", env=clean_env(home), check=True)
    service = start_mlflow_server(home / "mlflow.db", tmp_path)
    yield home, service
    stop_group(service)


def test_mlflow_model_page_shows_version_and_training_device(
        mlflow_ui: tuple[Path, Service], tmp_path: Path) -> None:
    browser = _chromium()
    _home, service = mlflow_ui
    text = ""
    for attempt in range(3):  # the single-page app may need a second load on a cold server
        text = _page_text(browser, f"{service.url}/#/models/browsed-model",
                          tmp_path / f"profile-{attempt}")
        if "registry.devices" in text:
            break
    assert "browsed-model" in text
    assert "Version 1" in text, text[:2000]
    assert re.search(r"registry\.devices\s*:\s*cuda:3", text), text[:3000]
    assert "champion" in text
