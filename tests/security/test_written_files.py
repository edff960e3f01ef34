"""Files the registry writes outside its home go into folders others may write too (a shared or
temporary folder): a link planted at the target or at a temporary name must be replaced, never
followed, and a linked sub-folder must be refused before anything is made through it. The
sentinel around every test (``outside.py``) proves ``victim`` and ``outside/`` stay untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import registry
from registry.errors import NormalizationError, RegistryError
from registry.exports.service import copy_to
from tests.helpers import MLP, clean_env, run_cli, trained_mlp


def _plant(at: Path, target: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)
    return at


def _victim(work: Path) -> Path:
    return work.parent / "victim"


def test_save_pretrained_with_a_cast_never_writes_through_a_planted_link(
        reg: registry.Registry, work: Path) -> None:
    """It wrote each cast shard to the fixed name ``DEST/.registry-model.safetensors``."""
    transformers = pytest.importorskip("transformers")
    model: Any = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16))
    model.save_pretrained(work / "src")
    mv = reg.push(work / "src", "gpt2")
    dest = work / "dest"
    _plant(dest / ".registry-model.safetensors", _victim(work))
    _plant(dest / "model.safetensors", _victim(work))
    out = reg.save_pretrained(mv.ref, dest, dtype="float16")
    assert not (out / "model.safetensors").is_symlink()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out)
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}
    assert not [p for p in dest.iterdir() if p.name.startswith(".registry-")
                and not p.is_symlink()], "a temporary file was left behind"


def test_export_output_never_writes_through_a_planted_link(reg: registry.Registry,
                                                           work: Path) -> None:
    """`registry export -o DIR/out.pt` copied through the fixed name ``DIR/.out.pt.tmp``."""
    reg.push(trained_mlp(), "m", factory=MLP)
    art = reg.export("m", format="torchscript", input_shapes=[(2, 8)])
    _plant(work / ".out.pt.tmp", _victim(work))
    _plant(work / "out.pt", _victim(work))
    written = copy_to(art, work / "out.pt")
    assert not written.is_symlink()
    assert written.read_bytes() == Path(art.path or "").read_bytes()


def test_pull_to_a_file_replaces_a_planted_link(reg: registry.Registry, home: Path,
                                                work: Path) -> None:
    """`registry pull REF -o FILE` opened FILE for writing, following a link planted there."""
    reg.push(trained_mlp(), "m")
    target = _plant(work / "w.safetensors", _victim(work))
    result = run_cli("pull", "m", "-o", str(target), env=clean_env(home))
    assert result.returncode == 0, result.stderr
    assert not target.is_symlink() and target.stat().st_size > 100


def test_pull_files_refuses_a_linked_folder_before_making_anything(
        reg: registry.Registry, work: Path) -> None:
    """``mkdir(parents=True)`` ran before the check, making ``outside/sub`` through the link."""
    (work / "labels.json").write_text("[]")
    reg.push(trained_mlp(), "m", files={"meta/sub/labels.json": work / "labels.json"})
    dest = work / "dest"
    _plant(dest / "meta", work.parent / "outside")
    with pytest.raises(NormalizationError, match="meta.*outside"):
        reg.pull_files("m", dest)


def test_pull_files_through_a_link_inside_the_destination_still_works(
        reg: registry.Registry, work: Path) -> None:
    (work / "labels.json").write_text("[]")
    reg.push(trained_mlp(), "m", files={"meta/labels.json": work / "labels.json"})
    dest = work / "dest"
    (dest / "real").mkdir(parents=True)
    (dest / "meta").symlink_to("real")
    reg.pull_files("m", dest)
    assert (dest / "real" / "labels.json").read_text() == "[]"


def test_pull_files_of_a_file_and_a_folder_of_the_same_name_is_typed(
        reg: registry.Registry, work: Path) -> None:
    (work / "a.txt").write_text("a")
    reg.push(trained_mlp(), "m", files={"x": work / "a.txt", "x/y": work / "a.txt"})
    with pytest.raises(NormalizationError, match="'x'.*folder"):
        reg.pull_files("m", work / "dest")
    assert not (work / "dest" / "x").exists(), "a file was written before the refusal"


def test_pull_files_onto_a_folder_at_a_files_name_is_typed(reg: registry.Registry,
                                                          work: Path) -> None:
    (work / "a.txt").write_text("a")
    reg.push(trained_mlp(), "m", files={"labels.json": work / "a.txt"})
    (work / "dest" / "labels.json").mkdir(parents=True)
    with pytest.raises(RegistryError, match="labels.json.*folder"):
        reg.pull_files("m", work / "dest")
    assert (work / "dest" / "labels.json").is_dir()
