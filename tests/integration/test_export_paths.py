"""Exports and factories as a user meets them (issue #30): an artifact is written where ``out``
says, with its format's extension, atomically; ``Artifact.path`` always carries the extension;
a factory that pull will refuse is warned about at push, and pull's refusal does not suggest
trusting a module that holds no models."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from registry import Registry, UntrustedFactoryError
from tests.helpers import MLP, trained_mlp

SHAPES = [(2, 8)]


@pytest.fixture
def pushed(reg: Registry) -> Registry:
    reg.push(trained_mlp(), "mlp", factory=MLP)
    return reg


@pytest.mark.parametrize(("fmt", "ext"), [("onnx", ".onnx"), ("pt2", ".pt2"),
                                          ("torchscript", ".pt")])
def test_artifact_path_carries_the_format_extension(pushed: Registry, fmt: str, ext: str) -> None:
    art = pushed.export("mlp", format=fmt, input_shapes=SHAPES)
    assert art.path is not None and art.path.suffix == ext
    assert art.path.stat().st_size == art.size
    again = pushed.export("mlp", format=fmt, input_shapes=SHAPES)  # found stored
    assert again.cached and again.path == art.path
    if fmt == "pt2":
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch.export.load warns on a path without .pt2
            loaded = torch.export.load(art.path).module()
        x = torch.randn(2, 8)
        torch.testing.assert_close(loaded(x), pushed.pull("mlp", device="cpu")(x))


def test_out_writes_the_artifact_there(pushed: Registry, tmp_path: Path) -> None:
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    art = pushed.export("mlp", input_shapes=SHAPES, out=tmp_path / "r18.onnx")
    assert art.path == tmp_path / "r18.onnx" and art.path.stat().st_size == art.size
    import onnxruntime as ort

    session = ort.InferenceSession(str(art.path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1] == 8
    # Without an extension the format's is added; a directory gets <name>-v<N>.<ext>.
    bare = pushed.export("mlp", input_shapes=SHAPES, out=str(tmp_path / "bare"))
    assert bare.path == tmp_path / "bare.onnx" and bare.cached
    (tmp_path / "dir").mkdir()
    inside = pushed.pull_export("mlp", format="torchscript", input_shapes=SHAPES,
                                out=tmp_path / "dir")
    assert inside == tmp_path / "dir" / "mlp-v1.pt"
    assert inside.read_bytes() == pushed.export("mlp", format="torchscript",
                                                input_shapes=SHAPES).path.read_bytes()  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.onnx", "dir", "r18.onnx"], \
        "no temporary file is left beside the artifacts"


def test_out_is_written_through_a_temporary_file_of_its_own(
        pushed: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real = tempfile.mkstemp

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        fd, name = real(*args, **kwargs)
        made.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    target = tmp_path / "m.onnx"
    target.write_bytes(b"an older file")
    art = pushed.export("mlp", input_shapes=SHAPES, out=target)
    assert art.path == target and target.stat().st_size == art.size
    beside = [n for n in made if Path(n).parent == tmp_path]
    assert len(beside) == 1 and beside[0] != str(target) and not os.path.exists(beside[0])


@pytest.mark.parametrize(("factory", "why"), [
    ("subprocess:Popen", "subprocess is not a package of model builders"),
    ("tests.helpers:make_mlp", "add 'tests.helpers' to REGISTRY_TRUSTED_FACTORIES"),
])
def test_a_factory_pull_will_refuse_is_warned_about_at_push(reg: Registry, factory: str,
                                                            why: str) -> None:
    import subprocess  # noqa: F401  (imported, and still refused: not an nn.Module)

    with pytest.warns(UserWarning, match=f"factory '{factory}' is recorded, but pull will "
                                         f"refuse to call it.*{why}"):
        reg.push(trained_mlp(), "m", factory=factory)


@pytest.mark.parametrize("factory", [MLP, "torchvision.models:resnet18", "timm:create_model"])
def test_a_factory_pull_admits_is_not_warned_about(reg: Registry, factory: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg.push(trained_mlp(), "m", factory=factory)


def test_pull_refusal_suggests_trust_only_for_model_packages(reg: Registry) -> None:
    with pytest.warns(UserWarning):
        reg.push(trained_mlp(), "popen", factory="subprocess:Popen")
    with pytest.raises(UntrustedFactoryError) as info:
        reg.pull("popen", device="cpu")
    assert "REGISTRY_TRUSTED_FACTORIES" not in str(info.value)
    assert "not a package of model builders" in str(info.value)
    with pytest.warns(UserWarning):
        reg.push(trained_mlp(), "fn", factory="tests.helpers:make_mlp")
    with pytest.raises(UntrustedFactoryError, match="REGISTRY_TRUSTED_FACTORIES if you trust"):
        reg.pull("fn", device="cpu")
