"""A version is a set of files: sharded pushes and pulls, dedup of unchanged shards, Hugging
Face sharded directories, format-1 stores, and gc / rebuild with shards shared by versions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from registry import CheckpointError, NotFoundError, Registry
from registry import manifest as mf
from registry.io.digests import version_digest
from tests.helpers import assert_same_state, block_lm, clean_env, run_cli
from tests.integration.conftest import CuttingProxy

SHARD = "16KiB"
FIXTURES = Path(__file__).parent.parent / "fixtures"


def _fine_tune(model: torch.nn.Module) -> torch.nn.Module:
    """Change only the last block and the final norm, as a head fine-tune does."""
    with torch.no_grad():
        model.layers[-1].mlp.weight.add_(0.5)
        model.norm.weight.mul_(2)
    return model


def _shard_of(mv_meta: dict, key: str) -> str:
    return next(f["digest"] for f in mv_meta["files"] if key in f["tensors"])


def _blobs(reg: Registry) -> set[str]:
    return {p.name for p in (reg.settings.home / "objects" / "blobs" / "sha256").iterdir()}


def test_sharded_push_and_pull_are_bit_exact_with_ties_across_groups(reg: Registry) -> None:
    model = block_lm()
    mv = reg.push(model, "lm", shard_size=SHARD)
    meta = mv.metadata
    assert len(meta["files"]) == 5  # embed, four blocks; the small norm joins the last block
    assert mv.digest == version_digest([f["digest"] for f in meta["files"]])
    assert meta["push"] == {"shards": 5, "shards_uploaded": 5, "bytes": mv.metadata["push"][
        "bytes"], "bytes_uploaded": meta["push"]["bytes"], "files": 0, "files_uploaded": 0}
    assert sum(f["size"] for f in meta["files"]) == meta["push"]["bytes"]
    # The tied head is stored once, in the embedding's shard, and comes back tied.
    assert "lm_head.weight" not in meta["tensors"]
    assert meta["source"]["tied"] == {"lm_head.weight": "embed.weight"}
    for i in range(4):
        assert len({_shard_of(meta, f"layers.{i}.attn.weight"),
                    _shard_of(meta, f"layers.{i}.mlp.bias")}) == 1
    assert "push" not in json.loads(
        (reg.settings.home / "objects" / "manifests" / "lm" / "v1.json").read_text())

    pulled = reg.pull("lm", device="cpu", model=lambda: type(model)())
    assert_same_state(pulled.state_dict(), model.state_dict())
    assert pulled.lm_head.weight is pulled.embed.weight
    ids = torch.randint(0, 64, (2, 5))
    torch.testing.assert_close(pulled(ids), model(ids))
    assert_same_state(reg.pull_state_dict("lm", device="cpu"), model.state_dict())


def test_re_push_of_a_fine_tune_uploads_only_the_changed_shard(reg: Registry) -> None:
    base = block_lm()
    v1 = reg.push(base, "lm", shard_size=SHARD)
    before = _blobs(reg)
    v2 = reg.push(_fine_tune(block_lm()), "lm", shard_size=SHARD)
    report = v2.metadata["push"]
    assert (report["shards"], report["shards_uploaded"]) == (5, 1)
    changed = _shard_of(v2.metadata, "layers.3.mlp.weight")
    assert changed == _shard_of(v2.metadata, "norm.weight")
    assert report["bytes_uploaded"] == next(f["size"] for f in v2.metadata["files"]
                                            if f["digest"] == changed)
    unchanged = [f["digest"] for f in v2.metadata["files"] if f["digest"] != changed]
    assert set(unchanged) <= {f["digest"] for f in v1.metadata["files"]}
    assert _blobs(reg) - before == {changed[7:]}
    # The same weights again upload nothing.
    assert reg.push(base, "lm", shard_size=SHARD).metadata["push"]["shards_uploaded"] == 0


def test_gc_and_rebuild_with_shards_shared_between_versions(reg: Registry) -> None:
    v1 = reg.push(block_lm(), "lm", shard_size=SHARD)
    v2 = reg.push(_fine_tune(block_lm()), "lm", shard_size=SHARD)
    only_v1 = {f["digest"] for f in v1.metadata["files"]} - {
        f["digest"] for f in v2.metadata["files"]}
    assert len(only_v1) == 1
    assert reg.gc().deleted == []  # every shard is referenced
    reg.delete_version("lm:v1")
    assert reg.gc().deleted == sorted(only_v1)
    assert_same_state(reg.pull_state_dict("lm:v2", device="cpu"),
                      _fine_tune(block_lm()).state_dict())
    # The catalog is lost; the store alone brings v2 back, with every file it owns.
    (reg.settings.home / "registry.db").unlink()
    fresh = Registry(home=reg.settings.home)
    assert fresh._backend.rebuild() == 1  # type: ignore[attr-defined]
    assert fresh.gc().deleted == []
    assert_same_state(fresh.pull_state_dict("lm:v2", device="cpu"),
                      _fine_tune(block_lm()).state_dict())
    fresh.close()


@pytest.mark.s3
def test_s3_dedup_sends_one_put_for_the_changed_shard(cutting_proxy: CuttingProxy,
                                                      s3_endpoint: str, s3_store_url: str,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = cutting_proxy
    monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", proxy.url)
    reg = Registry(home=tmp_path / "home", store=s3_store_url)
    reg.push(block_lm(), "lm", shard_size=SHARD)
    blob_puts = proxy.blob_requests(b"PUT")
    assert len(blob_puts) == 5
    proxy.requests.clear()
    v2 = reg.push(_fine_tune(block_lm()), "lm", shard_size=SHARD)
    blob_puts = proxy.blob_requests(b"PUT")
    changed = _shard_of(v2.metadata, "layers.3.mlp.weight")
    assert len(blob_puts) == 1 and changed[7:].encode() in blob_puts[0]
    # A cold pull fetches every shard into the cache and verifies each.
    puller = Registry(home=tmp_path / "puller", store=s3_store_url,
                      catalog=f"sqlite:///{tmp_path / 'home' / 'registry.db'}")
    assert_same_state(puller.pull_state_dict("lm:v2", device="cpu"),
                      _fine_tune(block_lm()).state_dict())
    cached = tmp_path / "puller" / "cache" / "blobs" / "sha256"
    assert {p.name for p in cached.iterdir()} == {
        f["digest"][7:] for f in v2.metadata["files"]}
    reg.close()
    puller.close()


# -- Hugging Face style directories -----------------------------------------------------------

def _hf_sharded(model: torch.nn.Module, directory: Path, kind: str) -> Path:
    """Write ``model`` as transformers' save_pretrained writes a sharded checkpoint."""
    directory.mkdir()
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    keys = list(state)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves, 1):
        if kind == "safetensors":
            name = f"model-{i:05d}-of-00002.safetensors"
            save_file({k: state[k] for k in part}, directory / name, metadata={"format": "pt"})
        else:
            name = f"pytorch_model-{i:05d}-of-00002.bin"
            torch.save({k: state[k] for k in part}, directory / name)
        weight_map.update(dict.fromkeys(part, name))
    index = "model.safetensors.index.json" if kind == "safetensors" else \
        "pytorch_model.bin.index.json"
    (directory / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text("{}")
    return directory


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_hf_sharded_directory_pushes_and_pulls_bit_exact(reg: Registry, tmp_path: Path,
                                                         kind: str) -> None:
    model = block_lm()
    path = _hf_sharded(model, tmp_path / "ckpt", kind)
    mv = reg.push(path, "hf")
    assert mv.metadata["source"]["checkpoint"]["shards"] == 2
    assert mv.metadata["source"]["checkpoint"]["file"] == "ckpt"
    assert_same_state(reg.pull_state_dict("hf", device="cpu"), model.state_dict())
    # A .pt file of the same tensors is the same blob: one model, one content address.
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, tmp_path / "same.pt")
    assert reg.push(tmp_path / "same.pt", "hf").digest == mv.digest


def test_directory_with_one_weights_file_and_bad_directories(reg: Registry,
                                                             tmp_path: Path) -> None:
    model = block_lm()
    single = tmp_path / "single"
    single.mkdir()
    torch.save(model.state_dict(), single / "pytorch_model.bin")
    (single / "README.md").write_text("a model card")
    assert_same_state(reg.pull_state_dict(reg.push(single, "one").ref, device="cpu"),
                      model.state_dict())

    several = tmp_path / "several"
    several.mkdir()
    torch.save({"a": torch.ones(1)}, several / "a.pt")
    torch.save({"b": torch.ones(1)}, several / "b.pt")
    with pytest.raises(CheckpointError, match=r"several weights files \(a.pt, b.pt\)"):
        reg.push(several, "x")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="holds no weights file"):
        reg.push(empty, "x")
    escaping = _hf_sharded(model, tmp_path / "escaping", "safetensors")
    (escaping / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"embed.weight": "../../etc/passwd"}}))
    with pytest.raises(CheckpointError, match="not a file name in its directory"):
        reg.push(escaping, "x")
    with pytest.raises(NotFoundError):
        reg.show("x")  # nothing of the refused pushes is visible
    assert reg.list_models() == ["one"]


def test_cli_pushes_a_directory_and_reports_what_it_uploaded(tmp_path: Path) -> None:
    path = _hf_sharded(block_lm(), tmp_path / "ckpt", "safetensors")
    env = clean_env(tmp_path / "home")
    first = run_cli("push", "lm", str(path), "--shard-size", SHARD, env=env, check=True)
    # Saved untied, as save_pretrained does: the head is a sixth shard of its own.
    assert "uploaded 6 of 6 shards" in first.stdout
    second = run_cli("push", "lm", str(path), "--shard-size", SHARD, env=env, check=True)
    assert "uploaded 0 of 6 shards (0 B of" in second.stdout
    bad = run_cli("push", "lm", str(path), "--shard-size", "lots", env=env)
    assert bad.returncode == 2 and "shard_size='lots' is not a size" in bad.stderr


# -- format 1 ---------------------------------------------------------------------------------

def _legacy_state() -> dict[str, object]:
    """What tests/fixtures/format1-home/make.py pushed with the format-1 code."""
    emb = torch.arange(40, dtype=torch.float32).reshape(10, 4) / 8
    return {"embed.weight": emb, "head.weight": emb,
            "block.0.weight": (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 6) / 4,
            "block.0.bias": torch.tensor([0.5, -1.0, 2.0]),
            "norm.weight": torch.arange(3, dtype=torch.float16), "steps": torch.tensor(7),
            "epoch": 3}


def _copy_fixture(tmp_path: Path) -> Path:
    home = tmp_path / "legacy-home"
    shutil.copytree(FIXTURES / "format1-home", home, ignore=shutil.ignore_patterns("make.py"))
    return home


def test_a_format_1_store_and_catalog_keep_working(tmp_path: Path) -> None:
    home = _copy_fixture(tmp_path)
    reg = Registry(home=home)  # the embedded catalog migrates itself (0003 -> head)
    mv = reg.show("legacy@production")
    assert mv.metadata["format_version"] == 1 and mv.tags == {"made-by": "format-1 code"}
    expected = _legacy_state()
    expected["norm.weight"] = expected["norm.weight"].float()  # type: ignore[union-attr]  # fp16 -> fp32 on the CPU
    pulled = reg.pull_state_dict("legacy:v1", device="cpu")
    assert pulled.pop("epoch") == expected.pop("epoch")
    assert_same_state(pulled, expected)  # type: ignore[arg-type]
    assert pulled["head.weight"] is pulled["embed.weight"]
    # The migration recorded the version's file, so gc keeps it.
    assert reg.gc().deleted == []
    # New versions beside old ones are format 2, and share the old blob when bytes agree.
    v2 = reg.push({k: v for k, v in _legacy_state().items()}, "legacy")
    assert v2.metadata["format_version"] == mf.FORMAT_VERSION == 2
    assert v2.digest == mv.digest
    reg.close()
    # The store alone rebuilds both formats.
    (home / "registry.db").unlink()
    rebuilt = Registry(home=home)
    assert rebuilt._backend.rebuild() == 2  # type: ignore[attr-defined]
    assert rebuilt.show("legacy@production").version == 1
    again = rebuilt.pull_state_dict("legacy:v1", device="cpu", dtype="float16")
    assert torch.equal(again["norm.weight"], _legacy_state()["norm.weight"])  # type: ignore[arg-type]
    rebuilt.close()
