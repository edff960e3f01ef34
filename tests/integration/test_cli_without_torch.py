"""The catalog commands answer at once: ls, show, alias, tag, rm, gc, token, db, store and the
governance commands (history, audit, hold, release, retention, ls --trash) never import torch
(which costs seconds), and `ls --json` stays short."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import registry
from tests.helpers import clean_env

pytestmark = pytest.mark.slow

COMMANDS = [
    ["ls"],
    ["ls", "--json"],
    ["ls", "mlp"],
    ["ls", "mlp", "--json"],
    ["show", "mlp:v1"],
    ["show", "mlp:v1", "--json"],
    ["lineage", "mlp:v2"],
    ["lineage", "mlp:v1", "--json"],
    ["bom", "mlp:v1"],
    ["bom", "mlp:v2", "--format", "spdx"],
    ["card", "mlp:v1"],
    ["alias", "mlp", "production", "1"],
    ["alias", "mlp", "production", "--delete"],
    ["tag", "mlp:v1", "owner=vision", "--rm", "dataset"],
    ["alias", "mlp@production", "1", "--protect"],
    ["alias", "mlp@production", "--unprotect"],
    ["hold", "mlp:v1", "--reason", "audit"],
    ["release", "mlp:v1"],
    ["retention", "mlp", "--keep-last", "5"],
    ["history", "mlp"],
    ["history", "mlp@production", "--json"],
    ["audit", "--json"],
    ["rm", "mlp:v2"],
    ["ls", "--trash"],
    ["gc"],
    ["token", "create", "ci", "--scopes", "read"],
    ["token", "revoke", "ci"],
    ["db", "current"],
    ["db", "upgrade"],
    ["db", "rebuild"],
    ["store", "init"],
    ["webhook", "ls"],
    ["webhook", "deliver"],
    ["--help"],
]

# One fresh interpreter runs the commands in order, as the console script would, and records
# after each one whether torch has been imported.
RUNNER = textwrap.dedent("""
    import contextlib, io, json, sys
    from registry.cli import main

    results = []
    for argv in json.loads(sys.argv[1]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code
        results.append({"argv": argv, "code": code, "torch": "torch" in sys.modules,
                        "output": out.getvalue()})
    print(json.dumps(results))
""")


@pytest.fixture
def populated(home: Path) -> Path:
    reg = registry.Registry(home=home)
    try:
        for width in (8, 8):
            model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.ReLU(),
                                        torch.nn.Linear(width, 2))
            reg.push(model, "mlp", tags={"dataset": "toy"}, factory="torch.nn:Sequential")
        reg.export("mlp:v1", format="pt2", input_shapes=[(1, 4)],
                   model=torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                             torch.nn.Linear(8, 2)))
    finally:
        reg.close()
    return home


def test_catalog_commands_never_import_torch(populated: Path) -> None:
    env = clean_env(populated)
    env.pop("PYTHONSTARTUP", None)
    done = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(COMMANDS)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert [r["argv"] for r in results] == COMMANDS
    for result in results:
        assert result["code"] == 0, result
        assert not result["torch"], f"registry {' '.join(result['argv'])} imported torch"
    by_command = {" ".join(r["argv"]): r["output"] for r in results}
    # The commands did their work (they did not merely fail early without torch).
    assert "exports:" in by_command["show mlp:v1"] and "pt2" in by_command["show mlp:v1"]
    assert "mlp@production -> mlp:v1" in by_command["alias mlp production 1"]
    assert "owner=vision" in by_command["tag mlp:v1 owner=vision --rm dataset"]
    assert by_command["rm mlp:v2"].strip() == "deleted mlp:v2"
    assert "rebuilt the catalog: 1 version(s)" in by_command["db rebuild"]


def test_ls_json_is_one_compact_object_per_version(populated: Path) -> None:
    reg = registry.Registry(home=populated)
    try:
        expected = reg.list_versions("mlp")
    finally:
        reg.close()
    env = clean_env(populated)
    done = subprocess.run([sys.executable, "-m", "registry.cli", "ls", "mlp", "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(expected) == 2  # one line per version, not every tensor
    listing = json.loads(done.stdout)
    for item, mv in zip(listing, expected, strict=True):
        assert list(item) == ["ref", "digest", "size", "created", "aliases", "tags", "source"]
        assert (item["ref"], item["digest"], item["tags"]) == (mv.ref, mv.digest, mv.tags)
        assert item["size"] == mv.metadata["source"]["size_bytes"] > 0
        assert item["created"] == mv.metadata["created_at"]
        assert item["source"]["architecture"] == "torch.nn:Sequential()"
        assert item["source"]["devices"] == ["cpu"]
        assert item["source"]["parameters"] == 58
    # show --json is where the whole manifest is: every tensor with its shape.
    shown = subprocess.run([sys.executable, "-m", "registry.cli", "show", "mlp:v1", "--json"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    whole = json.loads(shown.stdout)
    assert whole["metadata"]["tensors"]["0.weight"] == {"dtype": "float32", "shape": [8, 4]}
    assert whole["exports"][0]["format"] == "pt2"
