"""The embedded registry end to end: SQLite catalog file + file store + cache, real files."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import registry
from registry import (
    ArchitectureUnknownError,
    DigestMismatchError,
    NotFoundError,
    RefError,
    Registry,
    StateDictMismatchError,
    UntrustedFactoryError,
    VersionExistsError,
)
from tests.helpers import MLP, assert_same_state, trained_mlp


def test_module_level_api_contract(home: Path) -> None:
    model = trained_mlp()
    mv = registry.push(model, "resnet18", tags={"dataset": "imagenet"}, aliases=["staging"])
    assert str(mv) == "resnet18:v1"
    assert (mv.name, mv.version, mv.ref) == ("resnet18", 1, "resnet18:v1")
    assert mv.digest.startswith("sha256:") and len(mv.digest) == 71
    assert mv.tags == {"dataset": "imagenet"}
    assert mv.aliases == ["staging"]
    assert mv.metadata["name"] == "resnet18" and mv.metadata["version"] == 1
    assert (home / "registry.db").exists()

    sd = registry.pull_state_dict("resnet18@staging", device="cpu", dtype="auto")
    assert_same_state(sd, model.state_dict())
    module = registry.pull("resnet18:v1", device="auto", dtype="auto", model=MLP)
    assert not module.training
    x = torch.randn(4, 8)
    device = next(module.parameters()).device
    if torch.cuda.is_available():  # "auto" takes the GPU where there is one
        assert device == torch.device("cuda", 0)
        # CUDA's kernels need not agree with the CPU's bit for bit; the weights do (above).
        torch.testing.assert_close(module(x.to(device)).cpu(), model(x))
    else:
        assert device.type == "cpu"
        assert torch.equal(module(x), model(x))

    assert registry.show("resnet18") == mv
    assert registry.list_models() == ["resnet18"]
    assert [v.ref for v in registry.list_versions("resnet18")] == ["resnet18:v1"]
    registry.set_alias("resnet18", "production", 1)
    assert registry.show("resnet18@production").aliases == ["production", "staging"]
    registry.delete_alias("resnet18", "production")
    assert registry.show("resnet18:v1").aliases == ["staging"]
    assert registry.set_tags("resnet18:v1", {"owner": "vision"}).tags == {
        "dataset": "imagenet", "owner": "vision"}
    with pytest.raises(registry.VersionAliasedError, match="resnet18@staging"):
        registry.delete_version("resnet18:v1")  # @staging still points there
    registry.delete_version("resnet18:v1", force=True)
    assert registry.list_models() == []
    report = registry.gc()
    assert report.deleted == [mv.digest]


def test_manifest_records_what_the_issue_lists(reg: Registry) -> None:
    mv = reg.push(trained_mlp(), "mlp", factory=MLP, factory_kwargs={"width": 8})
    meta = mv.metadata
    assert meta["format_version"] == 2
    assert meta["files"] == [{"digest": mv.digest, "size": meta["files"][0]["size"],
                              "format": "safetensors", "tensors": sorted(meta["tensors"])}]
    assert meta["tensor_count"] == 9
    assert meta["architecture"] == {"class": "tests.helpers:MLP", "factory": "tests.helpers:MLP",
                                    "factory_kwargs": {"width": 8}}
    for field in ("devices", "dtypes", "wrapping", "precision", "params", "size_bytes",
                  "torch_version", "python_version"):
        assert field in meta["source"], field
    assert meta["created_at"]
    stored = json.loads((reg.settings.home / "objects" / "manifests" / "mlp" / "v1.json")
                        .read_text())
    assert stored["digest"] == mv.digest


def test_round_trip_bit_exact_for_every_input_kind(reg: Registry, tmp_path: Path) -> None:
    model = trained_mlp()
    expected = model.state_dict()
    pt = tmp_path / "w.pt"
    torch.save(expected, pt)
    st = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in expected.items()}, st)
    for source in (model, dict(expected), pt, str(st)):
        mv = reg.push(source, "mlp")
        assert_same_state(reg.pull_state_dict(mv.ref, device="cpu"), expected)
    digests = {v.digest for v in reg.list_versions("mlp")}
    assert len(digests) == 1, "the same weights must address the same blob"
    assert len(list((reg.settings.home / "objects" / "blobs" / "sha256").iterdir())) == 1


def test_blobs_are_read_only_and_content_addressed(reg: Registry) -> None:
    mv = reg.push(trained_mlp(), "mlp")
    blob = reg.settings.home / "objects" / "blobs" / "sha256" / mv.digest.removeprefix("sha256:")
    assert blob.exists()
    assert not blob.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert load_file(blob).keys() == trained_mlp().state_dict().keys()


def test_versions_increase_and_numbers_are_never_reused(reg: Registry) -> None:
    for _ in range(3):
        reg.push(trained_mlp(), "m")
    reg.delete_version("m:v3")
    assert reg.push(trained_mlp(), "m").version == 4
    with pytest.raises(VersionExistsError, match="m:v3 was deleted.*retired.*v5"):
        reg.push(trained_mlp(), "m:v3")
    with pytest.raises(VersionExistsError, match="m:v2 already exists"):
        reg.push(trained_mlp(), "m:v2")
    assert reg.push(trained_mlp(), "m:v9").version == 9
    assert reg.push(trained_mlp(), "m").version == 10
    assert reg.push(trained_mlp(), "m:7").version == 7  # never handed out: claimable
    assert [v.version for v in reg.list_versions("m")] == [1, 2, 4, 7, 9, 10]


def test_refs_resolve(reg: Registry) -> None:
    a = reg.push({"w": torch.ones(2)}, "m")
    b = reg.push({"w": torch.zeros(2)}, "m", aliases=["prod"])
    reg.push({"w": torch.ones(2)}, "m")  # same bytes as v1: v3 is now the newest with them
    assert reg.show("m").version == 3
    assert reg.show("m:latest").version == 3
    assert reg.show("m:2").version == 2
    assert reg.show("m@prod") == reg.show(b.ref)
    assert reg.show(f"m@{a.digest}").version == 3
    assert reg.show(f"m@{b.digest}").version == 2


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("nope", "model 'nope' not found; models include m"),
        ("m:v9", "m:v9 not found; latest is v2"),
        ("m@prod", "m@prod not found: m has no aliases"),
        ("m@sha256:" + "0" * 64, "no version of m has that digest"),
    ],
)
def test_unknown_refs_say_what_exists(reg: Registry, ref: str, message: str) -> None:
    reg.push({"w": torch.ones(1)}, "m")
    reg.push({"w": torch.ones(2)}, "m")
    with pytest.raises(NotFoundError) as info:
        reg.show(ref)
    assert message in str(info.value)
    assert isinstance(info.value, LookupError)


def test_deleted_version_is_reported_as_deleted(reg: Registry) -> None:
    reg.push({"w": torch.ones(1)}, "m")
    reg.push({"w": torch.ones(2)}, "m")
    reg.delete_version("m:v1")
    with pytest.raises(NotFoundError, match=r"m:v1 not found \(it was deleted\) but is in the "
                                            r"trash: `registry restore m:v1` brings it back; "
                                            r"latest is v2"):
        reg.pull_state_dict("m:v1")
    reg.gc()  # REGISTRY_TRASH_DAYS=0 in tests: purged
    with pytest.raises(NotFoundError, match=r"m:v1 not found \(it was deleted\); latest is v2"):
        reg.pull_state_dict("m:v1")
    with pytest.raises(RefError, match="explicit version"):
        reg.delete_version("m")


def test_aliases_move_and_are_validated(reg: Registry) -> None:
    reg.push({"w": torch.ones(1)}, "m", aliases=["prod"])
    reg.push({"w": torch.ones(2)}, "m")
    assert reg.set_alias("m", "prod", "v2").aliases == ["prod"]
    assert reg.show("m:v1").aliases == []
    with pytest.raises(RefError, match="reserved"):
        reg.set_alias("m", "latest", 1)
    with pytest.raises(NotFoundError, match="m:v5 not found"):
        reg.set_alias("m", "prod", 5)
    with pytest.raises(NotFoundError, match="no alias 'beta'"):
        reg.delete_alias("m", "beta")
    with pytest.raises(RefError, match="reserved"):
        reg.push({"w": torch.ones(3)}, "m", aliases=["v1"])


def test_tags_merge_remove_and_validate(reg: Registry) -> None:
    reg.push({"w": torch.ones(1)}, "m", tags={"a": "1", "b": "2"})
    assert reg.set_tags("m", {"b": None, "c": "3"}).tags == {"a": "1", "c": "3"}
    assert reg.show("m:v1").metadata["tags"] == {"a": "1", "c": "3"}
    with pytest.raises(RefError, match="tag values are strings"):
        reg.set_tags("m", {"n": 3})  # type: ignore[dict-item]
    with pytest.raises(RefError, match="invalid tag key"):
        reg.push({"w": torch.ones(1)}, "m", tags={"": "x"})


def test_failed_push_leaves_no_visible_version(reg: Registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    reg.push({"w": torch.ones(1)}, "m")
    store = reg.backend.store  # type: ignore[attr-defined]

    def broken(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    # The blob cannot be stored: the push fails before its commit. (A store write after the
    # commit, the manifest's, does not fail the push: tests/integration/test_commit_order.py.)
    monkeypatch.setattr(store, "put_file", broken)
    with pytest.raises(OSError, match="No space"):
        reg.push({"w": torch.zeros(5)}, "m")
    monkeypatch.undo()
    assert [v.version for v in reg.list_versions("m")] == [1]
    assert reg.push({"w": torch.zeros(5)}, "m").version == 3  # v2 was reserved, stays retired
    assert not list((reg.settings.home / "objects" / "tmp").glob("push-*"))


def test_normalization_failure_reserves_nothing(reg: Registry) -> None:
    with pytest.raises(registry.NormalizationError):
        reg.push({"w": torch.ones(1), "bad": object()}, "m")
    with pytest.raises(NotFoundError):
        reg.show("m")
    assert reg.push({"w": torch.ones(1)}, "m").version == 1


def test_corrupted_blob_is_never_loaded(reg: Registry) -> None:
    mv = reg.push(trained_mlp(), "m")
    assert reg.pull_state_dict("m")  # verified once, remembered
    blob = reg.settings.home / "objects" / "blobs" / "sha256" / mv.digest.removeprefix("sha256:")
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    stat_before = blob.stat()
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))  # hide the mtime
    with pytest.raises(DigestMismatchError, match="corrupt.*not loaded"):
        reg.pull_state_dict("m")
    with pytest.raises(DigestMismatchError):
        reg.pull("m", model=MLP)
    # Pushing the same weights again notices the damaged copy and replaces it.
    repaired = reg.push(trained_mlp(), "m")
    assert repaired.digest == mv.digest
    assert_same_state(reg.pull_state_dict("m:v1"), trained_mlp().state_dict())


def test_hot_pull_does_not_rehash(reg: Registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    reg.push(trained_mlp(), "m")
    import registry.caching.cache as cache

    calls = []
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda p: calls.append(p) or real(p))
    reg.pull_state_dict("m")
    reg.pull_state_dict("m")
    assert calls == [], "push verified these bytes; pulls should trust the memo"


def test_a_memo_removed_by_another_process_makes_the_next_pull_hash_again(
        reg: Registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The memo a process holds in memory is worth no more than the file it was read from: a
    memo another process removed (it found the blob corrupt) is not trusted from memory."""
    reg.push(trained_mlp(), "m")
    import registry.caching.cache as cache

    reg.pull_state_dict("m")  # the memo is now held in memory too
    calls = []
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda p: calls.append(p) or real(p))
    memos = list((reg.settings.home / "objects").rglob("verified/*"))
    memos += list((reg.settings.home / "cache").rglob("verified/*"))
    assert memos
    for memo in memos:
        memo.unlink()
    reg.pull_state_dict("m")
    assert len(calls) == 1, "the memo is gone: the blob must be hashed again"
    reg.pull_state_dict("m")
    assert len(calls) == 1, "hashed and remembered again"


def test_gc_keeps_referenced_blobs(reg: Registry) -> None:
    a = reg.push({"w": torch.ones(3)}, "a")
    b = reg.push({"w": torch.zeros(3)}, "b")
    c = reg.push({"w": torch.ones(3)}, "c")  # shares a's blob
    reg.delete_version("a:v1")
    reg.delete_version(b.ref)
    report = reg.gc()
    assert report.deleted == [b.digest]
    assert report.kept == 1
    assert reg.pull_state_dict(c.ref)["w"].sum() == 3
    assert a.digest == c.digest
    assert reg.gc().deleted == []


def test_db_rebuild_restores_catalog_from_store(home: Path) -> None:
    reg = Registry(home=home)
    reg.push({"w": torch.ones(1)}, "m", tags={"t": "1"}, aliases=["prod"])
    reg.push({"w": torch.ones(2)}, "m")
    reg.push({"w": torch.ones(3)}, "m")
    reg.delete_version("m:v3")
    reg.set_tags("m:v2", {"t": "2"})
    reg.push({"w": torch.ones(4)}, "other")
    before = {name: reg.list_versions(name) for name in reg.list_models()}
    reg.close()
    (home / "registry.db").unlink()
    for extra in home.glob("registry.db-*"):
        extra.unlink()

    fresh = Registry(home=home)
    assert fresh.list_models() == []
    assert fresh.backend.rebuild() == 3
    after = {name: fresh.list_versions(name) for name in fresh.list_models()}
    assert after == before
    assert fresh.show("m@prod").version == 1
    assert fresh.push({"w": torch.ones(9)}, "m").version == 4, "v3 stays retired after rebuild"


def test_architecture_unknown_without_factory_or_model(reg: Registry) -> None:
    reg.push(trained_mlp().state_dict(), "m")
    with pytest.raises(ArchitectureUnknownError, match="pass model=.*pull_state_dict"):
        reg.pull("m")


def test_pull_with_model_instance_on_meta_or_callable(reg: Registry) -> None:
    model = trained_mlp()
    reg.push(model, "m")
    x = torch.randn(2, 8)
    with torch.device("meta"):
        skeleton = MLP()
    skeleton.register_buffer("scale", torch.full((3,), 2.0), persistent=False)
    for spec in (skeleton, MLP(), lambda: MLP()):
        out = reg.pull("m", model=spec, device="cpu")
        assert torch.equal(out(x), model(x))


def test_factory_trust_rules(reg: Registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    reg.push(trained_mlp(), "cls", factory=MLP)  # an nn.Module subclass: always allowed
    assert isinstance(reg.pull("cls"), MLP)
    reg.push(trained_mlp(), "fn", factory="tests.helpers:make_mlp")  # a function
    with pytest.raises(UntrustedFactoryError, match="REGISTRY_TRUSTED_FACTORIES"):
        reg.pull("fn")
    monkeypatch.setenv("REGISTRY_TRUSTED_FACTORIES", "tests")
    trusting = Registry(home=reg.settings.home)
    assert isinstance(trusting.pull("fn"), MLP)
    reg.push({"w": torch.ones(1)}, "evil", factory="os:system")
    with pytest.raises(UntrustedFactoryError, match="'os:system'"):
        reg.pull("evil")
    # Outside the trusted prefixes a module is never imported: it must be imported already.
    reg.push({"w": torch.ones(1)}, "gone", factory="no_such_pkg.models:Net")
    with pytest.raises(UntrustedFactoryError, match="not imported"):
        reg.pull("gone")
    # Under a trusted prefix a module that is not installed cannot be imported.
    reg.push({"w": torch.ones(1)}, "absent", factory="tests.no_such_module:Net")
    with pytest.raises(ArchitectureUnknownError, match="cannot be imported"):
        trusting.pull("absent")


def test_torchvision_factory_is_trusted_by_default(reg: Registry) -> None:
    tv = pytest.importorskip("torchvision.models")
    model = tv.resnet18(num_classes=10).eval()
    reg.push(model, "resnet18", factory="torchvision.models:resnet18",
             factory_kwargs={"num_classes": 10})
    pulled = reg.pull("resnet18", device="cpu")
    _assert_aligned_and_identical(pulled, model, torch.randn(2, 3, 32, 32))


def test_small_vit_pulls_aligned_and_computes_identically(reg: Registry) -> None:
    tv = pytest.importorskip("torchvision.models")
    kwargs = {"image_size": 32, "patch_size": 8, "num_layers": 2, "num_heads": 2,
              "hidden_dim": 64, "mlp_dim": 128, "num_classes": 10}
    torch.manual_seed(0)
    model = tv.VisionTransformer(**kwargs).eval()
    reg.push(model, "vit", factory=tv.VisionTransformer, factory_kwargs=kwargs)
    pulled = reg.pull("vit", device="cpu")
    _assert_aligned_and_identical(pulled, model, torch.randn(2, 3, 32, 32))


def _assert_aligned_and_identical(pulled: torch.nn.Module, model: torch.nn.Module,
                                  x: torch.Tensor) -> None:
    """The pull's guarantee on the CPU: the weights are the pushed bits, every one of them at a
    64-byte aligned address (memory-mapped or copied), so the outputs are the same bits too."""
    assert_same_state(pulled.state_dict(), model.state_dict())
    for name, tensor in (*pulled.named_parameters(), *pulled.named_buffers()):
        assert tensor.data_ptr() % 64 == 0, f"{name} is not 64-byte aligned"
    with torch.no_grad():
        assert torch.equal(pulled(x), model(x))


def test_state_dict_mismatch_names_keys_and_cause(reg: Registry) -> None:
    reg.push(trained_mlp(), "m")
    with pytest.raises(StateDictMismatchError, match="wrapped in DataParallel.*model.module"):
        reg.pull("m", model=torch.nn.DataParallel(MLP()))
    with pytest.raises(StateDictMismatchError,
                       match=r"2 missing key\(s\): 0.weight, 0.bias; 9 unexpected key\(s\)"):
        reg.pull("m", model=torch.nn.Sequential(torch.nn.Linear(8, 16)))
    with pytest.raises(StateDictMismatchError, match="shape mismatch.*fc2.weight"):
        reg.pull("m", model=lambda: MLP(classes=5))
    outer = torch.nn.Module()
    outer.net = MLP()
    with pytest.raises(StateDictMismatchError, match="nests the network under 'net'"):
        reg.pull("m", model=outer)


def _push_many(args: tuple[str, int]) -> list[int]:
    home, count = args
    reg = Registry(home=home)
    return [reg.push({"w": torch.full((4,), float(os.getpid() * 100 + i))}, "shared").version
            for i in range(count)]


@pytest.mark.slow
def test_concurrent_pushes_on_sqlite_get_distinct_versions(home: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(_push_many, [(str(home), 10)] * 4)
    versions = sorted(v for chunk in results for v in chunk)
    assert versions == list(range(1, 41))
    reg = Registry(home=home)
    assert [v.version for v in reg.list_versions("shared")] == list(range(1, 41))
    assert len({v.digest for v in reg.list_versions("shared")}) == 40


# -- module metadata and key order come back (issue 18) ---------------------------------------

class VersionSeeingNet(torch.nn.Module):
    """An MLP whose BatchNorm writes down the version its loader is handed."""

    seen: list[object] = []

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)
        self.bn = _SeeingBatchNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x))


class _SeeingBatchNorm(torch.nn.BatchNorm1d):
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):  # type: ignore[no-untyped-def]
        VersionSeeingNet.seen.append(local_metadata.get("version"))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


@pytest.mark.parametrize("kind", ["module", "state_dict", "checkpoint"])
def test_batchnorm_version_metadata_arrives_at_load_state_dict(reg: Registry, tmp_path: Path,
                                                               kind: str) -> None:
    model = VersionSeeingNet()
    model.train()
    model(torch.randn(8, 4))
    model.eval()
    pushed: object = {"module": model, "state_dict": model.state_dict()}.get(kind)
    if kind == "checkpoint":
        pushed = tmp_path / "net.pth"
        torch.save(model.state_dict(), pushed)
    mv = reg.push(pushed, "net", factory=VersionSeeingNet)  # type: ignore[arg-type]
    assert mv.metadata["module_metadata"]["bn"] == {"version": 2}
    VersionSeeingNet.seen.clear()
    pulled = reg.pull("net", device="cpu")
    assert VersionSeeingNet.seen == [2], "BatchNorm must see version 2, not the old-file path"
    x = torch.randn(3, 4)
    assert torch.equal(pulled(x), model(x))
    VersionSeeingNet.seen.clear()
    reg.pull("net", device="cpu", model=VersionSeeingNet)
    assert VersionSeeingNet.seen == [2]


def test_pull_state_dict_is_ordered_like_state_dict_with_its_metadata(reg: Registry) -> None:
    from collections import OrderedDict

    from tests.helpers import TiedLM

    for model in (trained_mlp(), TiedLM()):
        expected = model.state_dict()
        reg.push(model, "m")
        state = reg.pull_state_dict("m", device="cpu")
        assert isinstance(state, OrderedDict)
        assert list(state) == list(expected) != sorted(expected)
        assert dict(state._metadata) == dict(expected._metadata)  # type: ignore[attr-defined]
        for (key, value), (_, want) in zip(state.items(), expected.items(), strict=True):
            assert torch.equal(value, want), key
    # A plain state dict with extras keeps the order it was given in, extras included.
    plain = {"z.weight": torch.ones(2), "epoch": 3, "a.weight": torch.zeros(2)}
    reg.push(plain, "plain")
    assert list(reg.pull_state_dict("plain", device="cpu")) == ["z.weight", "epoch", "a.weight"]


def test_a_version_pushed_before_key_order_pulls_sorted(reg: Registry) -> None:
    from tests.security.test_manifests import _edit_catalog, _manifest

    reg.push(trained_mlp(), "m")
    manifest = _manifest(reg, "m")
    del manifest["key_order"], manifest["module_metadata"]
    _edit_catalog(reg, "m", 1, manifest=json.dumps(manifest))
    state = reg.pull_state_dict("m", device="cpu")
    assert list(state) == sorted(trained_mlp().state_dict())
    assert not hasattr(state, "_metadata")
    reg.pull("m", model=MLP, device="cpu")
