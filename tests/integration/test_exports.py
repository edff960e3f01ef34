"""Exports (registry/exports): ONNX, pt2 and TorchScript artifacts of stored versions, each
verified by its own runtime, stored as blobs, found again without exporting, and kept through
`db rebuild`, deletion, gc, the CLI and a remote server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import registry
from registry import ExportError, Registry, SettingsError
from registry.exports import records, service
from tests.helpers import MLP, clean_env, run_cli, save_as_if_on, trained_mlp

FORMATS = ["onnx", "pt2", "torchscript"]


class SmallEncoder(nn.Module):
    """A transformer encoder over (batch, sequence, 16) inputs of any sequence length."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=32, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class Branchy(nn.Module):
    """Data-dependent control flow: the branch taken depends on the input's values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return -x


def run_artifact(fmt: str, path: Path, *args: torch.Tensor) -> torch.Tensor:
    """Run an artifact with its own runtime, independently of the registry's verification."""
    if fmt == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
        return torch.from_numpy(session.run(None, feed)[0])
    if fmt == "pt2":
        return torch.export.load(path).module()(*args)  # type: ignore[no-any-return]
    return torch.jit.load(str(path))(*args)  # type: ignore[no-any-return]


def no_export(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make any export or module build fail the test; returns the calls seen (none)."""
    calls: list[str] = []

    def refuse(*_a: Any, **_k: Any) -> Any:
        calls.append("export")
        raise AssertionError("an export ran where the stored artifact should have been used")

    monkeypatch.setattr(service, "run", refuse)
    monkeypatch.setattr(Registry, "pull", refuse)
    return calls


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    tv = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    return tv.resnet18(num_classes=10).eval()


@pytest.mark.parametrize("fmt", FORMATS)
def test_resnet18_exports_verify_and_come_back_from_the_store(
        reg: Registry, resnet: nn.Module, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reg.push(resnet, "resnet18", factory="torchvision.models:resnet18",
             factory_kwargs={"num_classes": 10})
    art = reg.export("resnet18:v1", format=fmt, input_shapes=[(1, 3, 32, 32)],
                     dynamic_batch=True)
    assert (art.format, art.ref, art.cached) == (fmt, "resnet18:v1", False)
    assert art.path is not None and art.path.stat().st_size == art.size
    assert art.digest.startswith("sha256:") and art.max_abs_diff <= art.tolerance
    assert art.params["dynamic_batch"] is True and art.versions["torch"] == torch.__version__
    x = torch.randn(3, 3, 32, 32)  # another batch size than the one exported with
    with torch.no_grad():
        got, want = run_artifact(fmt, art.path, x), resnet(x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # The same options again: the stored artifact, with no export and no module built.
    calls = no_export(monkeypatch)
    again = reg.export("resnet18", format=fmt, input_shapes=[(1, 3, 32, 32)],
                       dynamic_batch=True)
    assert again.cached and again.digest == art.digest and calls == []
    assert reg.pull_export("resnet18:v1", format=fmt, input_shapes=[(1, 3, 32, 32)],
                           dynamic_batch=True) == again.path
    assert [a.digest for a in reg.list_exports("resnet18:v1")] == [art.digest]
    if art.max_abs_diff > 0:  # a stricter tolerance than the stored export met is refused
        with pytest.raises(ExportError, match="differs from the module by .*more than"):
            reg.export("resnet18", format=fmt, input_shapes=[(1, 3, 32, 32)],
                       dynamic_batch=True, tolerance=art.max_abs_diff / 2)


def test_transformer_encoder_with_dynamic_sequence_length(reg: Registry) -> None:
    torch.manual_seed(0)
    model = SmallEncoder().eval()
    reg.push(model, "encoder", factory=SmallEncoder)
    for fmt in FORMATS:
        art = reg.export("encoder", format=fmt, input_shapes=[(2, 8, 16)], dynamic_batch=True,
                         dynamic_axes=[[1]])
        assert art.params["inputs"] == [{"shape": [2, 8, 16], "dtype": None,
                                         "dynamic": [0, 1]}]
        assert art.path is not None
        x = torch.randn(3, 13, 16)  # other batch and sequence length
        with torch.no_grad():
            torch.testing.assert_close(run_artifact(fmt, art.path, x), model(x), atol=1e-4,
                                       rtol=1e-4)
    assert sorted(a.format for a in reg.list_exports("encoder:v1")) == sorted(FORMATS)


def test_cuda_fp16_dataparallel_checkpoint_exports_on_the_cpu(reg: Registry,
                                                              tmp_path: Path) -> None:
    model = trained_mlp()
    wrapped = nn.DataParallel(model).half()
    path = save_as_if_on(wrapped.state_dict(), tmp_path / "ckpt.pt", "cuda:0")
    reg.push(path, "dp-fp16", factory="tests.helpers:MLP")
    reference = reg.pull("dp-fp16", device="cpu")
    for fmt in FORMATS:
        art = reg.export("dp-fp16", format=fmt, input_shapes=[(4, 8)], dynamic_batch=True)
        assert art.params["device"] == "cpu" and art.params["compute_dtype"] == "float32"
        assert art.path is not None
        x = torch.randn(5, 8)
        with torch.no_grad():
            torch.testing.assert_close(run_artifact(fmt, art.path, x), reference(x))


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_data_dependent_control_flow_is_a_clear_export_error(reg: Registry, fmt: str) -> None:
    reg.push(Branchy(), "branchy", factory=Branchy)
    with pytest.raises(ExportError) as caught:
        reg.export("branchy", format=fmt, input_shapes=[(2, 4)])
    message = str(caught.value)
    assert message.startswith(f"{fmt} export of branchy:v1 failed")
    assert "test_exports.py" in message or "data-dependent" in message.lower()
    assert "torch.cond" in message and "torchscript" in message
    assert reg.list_exports("branchy") == []


class Constantizing(nn.Module):
    """Reads a value out of its input as a Python float: a trace records it as a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * float(x.abs().max())


def test_an_unfaithful_artifact_is_refused_and_not_stored(reg: Registry) -> None:
    reg.push(Constantizing(), "constantizing", factory=Constantizing)
    with pytest.raises(ExportError, match=r"torchscript artifact of constantizing:v1 differs "
                                          r"from the module by .*it was not stored"):
        reg.export("constantizing", format="torchscript", input_shapes=[(2, 4)])
    assert reg.list_exports("constantizing") == []


def test_bad_options_name_the_value_and_the_fix(reg: Registry) -> None:
    reg.push(trained_mlp(), "mlp", factory=MLP)
    with pytest.raises(SettingsError, match="invalid export format 'tflite'"):
        reg.export("mlp", format="tflite", input_shapes=[(4, 8)])  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="exactly one of them"):
        reg.export("mlp", format="pt2")
    with pytest.raises(SettingsError, match="opset applies to format='onnx' only"):
        reg.export("mlp", format="pt2", input_shapes=[(4, 8)], opset=18)
    with pytest.raises(SettingsError, match=r"invalid input shape \(4, 0\)"):
        reg.export("mlp", format="pt2", input_shapes=[(4, 0)])


def test_exports_survive_db_rebuild_and_go_with_their_version(reg: Registry,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              home: Path) -> None:
    reg.push(trained_mlp(), "mlp", factory=MLP)
    reg.push(trained_mlp(1), "mlp", factory=MLP)
    art = reg.export("mlp:v1", format="onnx", input_shapes=[(4, 8)], opset=18)
    assert art.params["onnx_opset"] == 18 and "onnxruntime" in art.versions
    stored = json.loads((home / "objects" / records.store_key("mlp", 1)).read_bytes())
    assert [r["digest"] for r in stored["exports"]] == [art.digest]
    reg.backend.rebuild()
    calls = no_export(monkeypatch)
    again = reg.export("mlp:v1", format="onnx", input_shapes=[(4, 8)], opset=18)
    assert again.cached and again.digest == art.digest and calls == []
    monkeypatch.undo()
    # gc keeps the export's blob while its version lives, and reclaims it after.
    assert art.digest not in reg.gc().deleted
    reg.delete_version("mlp:v1")  # to the trash, restorable with its exports
    assert (home / "objects" / records.store_key("mlp", 1)).exists()
    assert art.digest in reg.gc().deleted  # REGISTRY_TRASH_DAYS=0 here: purged, then freed
    assert not (home / "objects" / records.store_key("mlp", 1)).exists()


def test_module_level_verbs_run_on_the_default_registry() -> None:
    registry.push(trained_mlp(), "mlp", factory=MLP)
    art = registry.export("mlp", format="torchscript", input_shapes=[(2, 8)])
    assert registry.pull_export("mlp", format="torchscript", input_shapes=[(2, 8)]) == art.path
    assert [a.format for a in registry.list_exports("mlp:v1")] == ["torchscript"]


def test_cli_export_round_trip(tmp_path: Path) -> None:
    home = tmp_path / "cli-home"
    # The CLI process builds the module from the recorded factory tests.helpers:MLP.
    env = clean_env(home, REGISTRY_TRUSTED_FACTORIES="tests.helpers",
                    PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    reg = Registry(home=home)
    model = trained_mlp()
    reg.push(model, "mlp", factory=MLP)
    reg.close()
    out = tmp_path / "mlp.onnx"
    done = run_cli("export", "mlp:v1", "--format", "onnx", "--input-shape", "2x8",
                   "--dynamic-batch", "-o", str(out), env=env, check=True)
    assert "exported and verified: mlp:v1 onnx" in done.stdout
    x = torch.randn(5, 8)
    with torch.no_grad():
        torch.testing.assert_close(run_artifact("onnx", out, x), model(x))
    again = run_cli("export", "mlp:v1", "--format", "onnx", "--input-shape", "2x8",
                    "--dynamic-batch", "--json", env=env, check=True)
    assert json.loads(again.stdout)["cached"] is True
    shown = run_cli("show", "mlp:v1", env=env, check=True)
    assert "exports:" in shown.stdout and "onnx" in shown.stdout and "2x8 dynamic-batch" \
        in shown.stdout
    as_json = json.loads(run_cli("show", "mlp:v1", "--json", env=env, check=True).stdout)
    assert [(e["format"], e["digest"]) for e in as_json["exports"]] == [
        ("onnx", json.loads(again.stdout)["digest"])]
    bad = run_cli("export", "mlp", "--input-shape", "2xa", env=env)
    assert bad.returncode == 2 and "1x3x224x224" in bad.stderr


def test_export_through_a_remote_server(tmp_path: Path) -> None:
    from tests.integration.serving import registry_server

    with registry_server(tmp_path / "server-home", tmp_path) as server:
        exporter = Registry(server.url, home=tmp_path / "exporter")
        other = Registry(server.url, home=tmp_path / "other")
        try:
            model = trained_mlp()
            exporter.push(model, "mlp", factory=MLP)
            art = exporter.export("mlp", format="pt2", input_shapes=[(2, 8)],
                                  dynamic_batch=True)
            assert not art.cached and art.path is not None
            lines = server.output().splitlines()
            uploads = [line for line in lines if "PUT /api/v1/blobs/" in line]
            assert len(uploads) == 1  # the weights, for their push
            # The export's blob goes to the exports' own route (/blobs takes a push's only).
            (export_upload,) = [line for line in lines
                                if "PUT /api/v1/models/mlp/versions/1/exports/blobs/" in line]
            assert art.digest[7:] in export_upload and " 201" in export_upload
            # Another client finds it stored, downloads it through the server and verifies it.
            listed = other.list_exports("mlp:v1")
            assert [(a.format, a.digest) for a in listed] == [("pt2", art.digest)]
            path = other.pull_export("mlp:v1", format="pt2", input_shapes=[(2, 8)],
                                     dynamic_batch=True)
            assert path.is_relative_to(tmp_path / "other") and path.read_bytes() == \
                art.path.read_bytes()
            x = torch.randn(3, 8)
            with torch.no_grad():
                torch.testing.assert_close(run_artifact("pt2", path, x), model(x))
        finally:
            exporter.close()
            other.close()
    # The server kept the record in its own store, for its own `db rebuild`.
    stored = tmp_path / "server-home" / "objects" / records.store_key("mlp", 1)
    assert json.loads(stored.read_bytes())["exports"][0]["digest"] == art.digest


def test_mlflow_mirror_tags_each_version_with_its_export_formats(reg: Registry,
                                                                  tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    from registry.mirror.mirror_mlflow import sync

    reg.push(trained_mlp(), "mlp", factory=MLP)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sync(reg.backend, uri)  # type: ignore[arg-type]
    reg.export("mlp", format="torchscript", input_shapes=[(2, 8)])
    reg.export("mlp", format="pt2", input_shapes=[(2, 8)])
    report = sync(reg.backend, uri)  # type: ignore[arg-type]
    assert report.mirrored == ["mlp:v1"]  # an export changes what the mirror shows
    (version,) = MlflowClient(tracking_uri=uri).search_model_versions("name='mlp'")
    assert version.tags["registry.exports"] == "pt2,torchscript"


@pytest.mark.postgres
def test_exports_on_postgres_rebuild_delete_and_gc(pg_url: str, home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    reg = Registry(catalog=pg_url)
    try:
        reg.push(trained_mlp(), "mlp", factory=MLP)
        art = reg.export("mlp", format="torchscript", input_shapes=[(2, 8)])
        # The same parameters recorded twice keep the first row (a concurrent exporter lost).
        catalog = reg.backend.catalog  # type: ignore[attr-defined]
        (record,) = catalog.list_exports("mlp", 1)
        kept, inserted = catalog.add_export("mlp", 1, {**record, "digest": "sha256:" + "0" * 64})
        assert kept["digest"] == art.digest and not inserted
        reg.backend.rebuild()
        calls = no_export(monkeypatch)
        assert reg.export("mlp", format="torchscript", input_shapes=[(2, 8)]).cached
        assert calls == []
        monkeypatch.undo()
        reg.delete_version("mlp:v1")
        assert art.digest in reg.gc().deleted
    finally:
        reg.close()


@pytest.mark.s3
def test_export_through_a_server_on_s3_goes_by_presigned_url(s3_endpoint: str, s3_store_url: str,
                                                             tmp_path: Path) -> None:
    import os

    from tests.integration.conftest import DUMMY_KEY_ID, DUMMY_SECRET
    from tests.integration.serving import registry_server

    env = {"REGISTRY_STORE_URL": s3_store_url, "REGISTRY_S3_ENDPOINT_URL": s3_endpoint,
           "AWS_ACCESS_KEY_ID": DUMMY_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    with registry_server(tmp_path / "server-home", tmp_path, env_extra=env) as server:
        exporter = Registry(server.url, home=tmp_path / "exporter")
        other = Registry(server.url, home=tmp_path / "other")
        try:
            exporter.push(trained_mlp(), "mlp", factory=MLP)
            art = exporter.export("mlp", format="onnx", input_shapes=[(2, 8)])
            path = other.pull_export("mlp", format="onnx", input_shapes=[(2, 8)])
            assert path.read_bytes() == art.path.read_bytes()  # type: ignore[union-attr]
            # Neither the upload nor the download went through the server.
            assert "PUT /api/v1/blobs/" not in server.output()
            assert f"GET /api/v1/blobs/{art.digest} " not in server.output()
            assert "/link" in server.output()
        finally:
            exporter.close()
            other.close()


def test_an_export_whose_blob_cannot_be_stored_leaves_no_record(
        reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.errors import StoreUnavailableError

    reg.push(trained_mlp(), "mlp", factory=MLP)

    def broken(*_a: Any, **_k: Any) -> None:
        raise StoreUnavailableError("store down")

    # The store refuses the blob: the exports' storage (backend.exports) stores it itself.
    monkeypatch.setattr(type(reg.backend.store), "put_file", broken)  # type: ignore[attr-defined]
    with pytest.raises(StoreUnavailableError):
        reg.export("mlp", format="torchscript", input_shapes=[(2, 8)])
    monkeypatch.undo()
    assert reg.list_exports("mlp") == []
    assert not reg.export("mlp", format="torchscript", input_shapes=[(2, 8)]).cached
