"""The `registry` command through real subprocesses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, safe_open

from tests.helpers import MLP, clean_env, run_cli, save_as_if_on, trained_mlp

pytestmark = pytest.mark.slow

MODEL_FIELDS = ["name", "version", "ref", "digest", "tags", "aliases", "metadata"]


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    return clean_env(home)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    model = trained_mlp()
    return save_as_if_on(torch.nn.DataParallel(model).state_dict(), tmp_path / "gpu.pth", "cuda:1")


def test_push_show_ls_pull_tag_alias_rm_gc(env: dict[str, str], checkpoint: Path,
                                           tmp_path: Path) -> None:
    pushed = run_cli("push", "mlp", str(checkpoint), "--tag", "dataset=toy", "--alias",
                     "staging", "--factory", "tests.helpers:MLP", "--factory-kwargs",
                     '{"width": 8}', "--precision", "amp-fp16", env=env, check=True)
    assert pushed.stdout.startswith("pushed mlp:v1 sha256:")

    shown = run_cli("show", "mlp@staging", env=env, check=True).stdout
    for expected in ("ref           mlp:v1", "trained on    cuda:1", "precision     amp-fp16",
                     "wrapping      DataParallel/DistributedDataParallel",
                     "architecture  tests.helpers:MLP(width=8)", "dataset=toy"):
        assert expected in shown, expected

    as_json = json.loads(run_cli("show", "mlp", "--json", env=env, check=True).stdout)
    assert list(as_json) == MODEL_FIELDS
    assert as_json["metadata"]["source"]["devices"] == ["cuda:1"]

    run_cli("push", "mlp", str(checkpoint), env=env, check=True)
    listing = json.loads(run_cli("ls", "mlp", "--json", env=env, check=True).stdout)
    assert [v["ref"] for v in listing] == ["mlp:v1", "mlp:v2"]
    # one compact object per version (tests/integration/test_cli_without_torch.py has the rest)
    assert all("metadata" not in v and v["source"]["devices"] == ["cuda:1"] for v in listing)
    assert "mlp:v2" in run_cli("ls", env=env, check=True).stdout

    out = tmp_path / "out.safetensors"
    run_cli("pull", "mlp:v1", "--dtype", "float16", "-o", str(out), env=env, check=True)
    weights = load_file(out)
    expected = trained_mlp().state_dict()
    assert sorted(weights) == sorted(expected)
    assert weights["fc1.weight"].dtype == torch.float16
    assert torch.equal(weights["bn.num_batches_tracked"], expected["bn.num_batches_tracked"])
    with safe_open(str(out), framework="pt") as fh:  # the bytes follow the model's key order
        assert list(fh.offset_keys()) == list(expected)
        assert json.loads(fh.metadata()["registry.module_metadata"])["bn"] == {"version": 2}

    assert "mlp@production -> mlp:v2" in run_cli("alias", "mlp", "production", "2", env=env,
                                                 check=True).stdout
    tagged = run_cli("tag", "mlp:v2", "owner=vision", "stage=2", env=env, check=True).stdout
    assert "owner=vision" in tagged
    assert "stage" not in run_cli("tag", "mlp:v2", "--rm", "stage", env=env, check=True).stdout
    run_cli("alias", "mlp", "production", "--delete", env=env, check=True)
    assert run_cli("rm", "mlp:v1", env=env).returncode == 4  # @staging points there
    run_cli("rm", "--force", "mlp:v1", env=env, check=True)
    run_cli("rm", "mlp:v2", env=env, check=True)
    assert "deleted 1 blob(s)" in run_cli("gc", env=env, check=True).stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["show", "Bad Name"], 2, "invalid model name 'Bad Name'"),
        (["show", "ghost"], 3, "model 'ghost' not found"),
        (["show", "m:v0"], 2, "invalid version 'v0'"),
        (["alias", "m", "latest", "1"], 2, "alias 'latest' is reserved"),
        (["rm", "m"], 2, "explicit version"),
        (["push", "m", "/nonexistent/file.pt"], 5, "does not exist"),
    ],
)
def test_errors_are_one_line_with_exit_codes(env: dict[str, str], args: list[str], code: int,
                                             message: str) -> None:
    result = run_cli(*args, env=env)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")


def test_a_warning_is_one_clean_line(env: dict[str, str], checkpoint: Path) -> None:
    pushed = run_cli("push", "mlp", str(checkpoint), "--factory", "subprocess:Popen", env=env,
                     check=True)
    assert pushed.stdout.startswith("pushed mlp:v1 sha256:")
    assert pushed.stderr.count("\n") == 1, pushed.stderr
    assert pushed.stderr.startswith("warning: factory 'subprocess:Popen' is recorded, but pull "
                                    "will refuse to call it"), pushed.stderr
    assert "UserWarning" not in pushed.stderr and ".py:" not in pushed.stderr


def test_pull_to_a_missing_gpu_and_unsafe_pickles(env: dict[str, str], checkpoint: Path,
                                                 tmp_path: Path) -> None:
    run_cli("push", "mlp", str(checkpoint), env=env, check=True)
    missing = f"cuda:{torch.cuda.device_count()}"  # cuda:0 where there is no GPU
    result = run_cli("pull", "mlp", "--device", missing, "-o", str(tmp_path / "x.safetensors"),
                     env=env)
    assert result.returncode == 7
    assert re.search(r"available: (cuda:\d+, )*cpu", result.stderr), result.stderr
    assert "Traceback" not in result.stderr
    whole = tmp_path / "whole.pt"
    torch.save(MLP(), whole)
    refused = run_cli("push", "mlp", str(whole), env=env)
    assert refused.returncode == 5 and "not executed" in refused.stderr


def test_bad_settings_name_the_variable(env: dict[str, str]) -> None:
    result = run_cli("ls", env={**env, "REGISTRY_STORE_URL": "ftp://x"})
    assert result.returncode == 2
    assert "REGISTRY_STORE_URL='ftp://x'" in result.stderr
    result = run_cli("ls", env={**env, "REGISTRY_AUTO_MIGRATE": "maybe"})
    assert "REGISTRY_AUTO_MIGRATE='maybe' is not a boolean" in result.stderr


def test_usage_errors(env: dict[str, str]) -> None:
    result = run_cli("push", "m", env=env)
    assert result.returncode == 2 and "Missing argument" in result.stderr
    result = run_cli("push", "m", "x.pt", "--tag", "novalue", env=env)
    assert result.returncode == 2 and "is not KEY=VALUE" in result.stderr


def test_db_upgrade_and_rebuild(env: dict[str, str], tmp_path: Path, checkpoint: Path) -> None:
    catalog = tmp_path / "managed.db"
    managed = {**env, "REGISTRY_CATALOG_URL": f"sqlite:///{catalog}",
               "REGISTRY_AUTO_MIGRATE": "0"}
    result = run_cli("ls", env=managed)
    assert result.returncode == 10 and "run `registry db upgrade`" in result.stderr
    assert "at revision" in run_cli("db", "upgrade", env=managed, check=True).stdout
    run_cli("push", "mlp", str(checkpoint), env=managed, check=True)
    run_cli("db", "downgrade", "base", env=managed, check=True)
    run_cli("db", "upgrade", env=managed, check=True)
    assert run_cli("ls", "--json", env=managed, check=True).stdout.strip() == "[]"
    assert "1 version(s)" in run_cli("db", "rebuild", env=managed, check=True).stdout
    assert json.loads(run_cli("show", "mlp", "--json", env=managed, check=True).stdout)[
        "version"] == 1


def test_push_again_with_its_idempotency_key_answers_the_same_version(
        env: dict[str, str], checkpoint: Path) -> None:
    first = run_cli("push", "mlp", str(checkpoint), "--idempotency-key", "job-7/try", env=env)
    assert first.returncode != 0 and "job-7/try" in first.stderr  # a '/' is not in the grammar
    first = run_cli("push", "mlp", str(checkpoint), "--idempotency-key", "job-7", env=env,
                    check=True)
    again = run_cli("push", "mlp", str(checkpoint), "--idempotency-key", "job-7", env=env,
                    check=True)
    assert first.stdout.splitlines()[0] == again.stdout.splitlines()[0]
    assert again.stdout.startswith("pushed mlp:v1 sha256:")
    listing = json.loads(run_cli("ls", "mlp", "--json", env=env, check=True).stdout)
    assert [v["ref"] for v in listing] == ["mlp:v1"]
