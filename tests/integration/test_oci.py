"""The OCI door against the real CNCF distribution registry (Debian's ``docker-registry``) on
loopback: a version pushed as a ModelPack artifact, read by an independent client (oras-py),
pulled and imported back, re-pushed with only its changed shards, with and without htpasswd."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import registry
from registry import Registry
from registry.files import version_files
from registry.oci import door as oci_door
from registry.oci import modelpack
from registry.oci.refs import check_url, parse_oci_ref
from tests.helpers import BlockLM, assert_same_state, block_lm, clean_env, run_cli
from tests.integration import oci_registry
from tests.integration.oci_registry import OciRegistry

SHARD = "16KiB"


@pytest.fixture(scope="module")
def oci(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    server = oci_registry.start(tmp_path_factory.mktemp("oci"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oci_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    server = oci_registry.start(tmp_path_factory.mktemp("oci-auth"),
                                users={"alice": "s3cret-pw"})
    yield server
    server.stop()


def _manifest(server: OciRegistry, repo: str, reference: str,
              auth: tuple[str, str] | None = None) -> dict:
    answer = httpx.get(f"http://{server.host}/v2/{repo}/manifests/{reference}", auth=auth,
                       headers={"accept": modelpack.OCI_MANIFEST})
    assert answer.status_code == 200, answer.text
    return json.loads(answer.content)


def _blob(server: OciRegistry, repo: str, digest: str) -> bytes:
    answer = httpx.get(f"http://{server.host}/v2/{repo}/blobs/{digest}", follow_redirects=True)
    assert answer.status_code == 200
    return answer.content


def test_push_writes_a_modelpack_artifact_whose_layers_are_the_blobs(
        reg: Registry, oci: OciRegistry) -> None:
    model = torch.nn.DataParallel(block_lm())
    mv = reg.push(model, "lm", shard_size=SHARD, precision="amp-fp16",
                  files={"README.md": _write(reg, "README.md", b"# lm\n")})
    done = reg.push_oci("lm:v1", oci.ref("team/lm"))
    assert done.ref == oci.ref("team/lm", "v1") and done.uploaded == done.layers
    doc = _manifest(oci, "team/lm", "v1")
    assert doc["mediaType"] == modelpack.OCI_MANIFEST
    assert doc["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert doc["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    files = version_files(mv.metadata)
    by_path = {x["annotations"]["org.cncf.model.filepath"]: x for x in doc["layers"]}
    assert len(files) > 2  # several shards and the README
    for f in files:
        layer = by_path[f.name]
        assert (layer["digest"], layer["size"]) == (f.digest, f.size)
        assert layer["mediaType"] == ("application/vnd.cncf.model.weight.v1.raw"
                                      if f.role == "weights"
                                      else "application/vnd.cncf.model.doc.v1.raw")
    assert by_path["registry-manifest.json"]["mediaType"] == modelpack.REGISTRY_MANIFEST
    config = json.loads(_blob(oci, "team/lm", doc["config"]["digest"]))
    assert config["config"]["format"] == "safetensors"
    assert config["config"]["precision"] == "float32"
    assert config["config"]["architecture"] == "BlockLM"
    params = mv.metadata["source"]["params"]
    assert config["config"]["paramSize"] == modelpack.param_size(params)
    assert config["modelfs"] == {"type": "layers",
                                 "diffIds": [x["digest"] for x in doc["layers"]]}
    assert config["descriptor"]["name"] == "lm" and config["descriptor"]["version"] == "v1"
    notes = doc["annotations"]
    assert notes["io.github.registry.source.wrapping"] == "DataParallel"
    assert notes["io.github.registry.source.devices"] == "cpu"
    assert notes["io.github.registry.source.precision"] == "amp-fp16"
    assert notes["io.github.registry.digest"] == mv.digest


def _write(reg: Registry, name: str, data: bytes) -> Path:
    path = reg.settings.home.parent / name
    path.write_bytes(data)
    return path


def test_an_independent_client_reads_the_same_bytes(reg: Registry, oci: OciRegistry) -> None:
    """oras-py (from the package index) fetches every layer; each equals the registry's blob."""
    import oras.provider

    mv = reg.push(block_lm(), "lm", shard_size=SHARD)
    reg.push_oci("lm:v1", oci.ref("indep/lm", "v1"))
    client = oras.provider.Registry(hostname=oci.host, insecure=True)
    container = f"{oci.host}/indep/lm:v1"
    manifest = client.get_manifest(container)
    got = {x["digest"]: x for x in manifest["layers"]}
    for f in version_files(mv.metadata):
        out = reg.settings.home.parent / f"oras-{f.digest[7:19]}"
        client.download_blob(container, f.digest, str(out))
        assert got[f.digest]["size"] == f.size
        assert out.read_bytes() == reg.backend.blob_path(f.digest, f.size).read_bytes()


def test_a_second_version_uploads_only_its_changed_shards(reg: Registry,
                                                          oci: OciRegistry) -> None:
    model = block_lm()
    v1 = reg.push(model, "tuned", shard_size=SHARD)
    reg.push_oci("tuned:v1", oci.ref("team/tuned"))
    with torch.no_grad():
        model.layers[-1].mlp.weight.add_(0.5)
    v2 = reg.push(model, "tuned", shard_size=SHARD)
    old = {f.digest for f in version_files(v1.metadata)}
    changed = [f for f in version_files(v2.metadata) if f.digest not in old]
    assert 0 < len(changed) < len(version_files(v2.metadata))
    before = len(oci.completed_uploads())
    done = reg.push_oci("tuned:v2", oci.ref("team/tuned"))
    received = oci.completed_uploads()[before:]
    doc = _manifest(oci, "team/tuned", "v2")
    ours = {x["digest"] for x in doc["layers"]
            if x["mediaType"] == modelpack.REGISTRY_MANIFEST} | {doc["config"]["digest"]}
    # The registry received the changed shards, the new manifest layer and the config: no more.
    assert sorted(d.replace("%3A", ":") for d in received) == sorted(
        {f.digest for f in changed} | ours)
    assert done.bytes_uploaded == sum(f.size for f in changed) + next(
        x["size"] for x in doc["layers"] if x["mediaType"] == modelpack.REGISTRY_MANIFEST)


def test_pull_materializes_by_tag_and_by_digest(reg: Registry, oci: OciRegistry) -> None:
    model = block_lm()
    reg.push(model, "lm", shard_size=SHARD)
    done = reg.push_oci("lm:v1", oci.ref("pulls/lm", "stable"))
    by_tag = reg.pull(oci.ref("pulls/lm", "stable"), device="cpu", model=BlockLM)
    assert_same_state(by_tag.state_dict(), model.state_dict())
    assert by_tag.lm_head.weight is by_tag.embed.weight  # ties come back
    by_digest = registry.Registry(home=reg.settings.home / "other").pull(
        f"oci://{oci.host}/pulls/lm@{done.digest}", device="auto", model=BlockLM)
    assert_same_state(by_digest.state_dict(), model.state_dict())


def test_import_keeps_the_digests_and_the_cli_round_trips(reg: Registry, oci: OciRegistry,
                                                          home: Path) -> None:
    model = block_lm()
    mv = reg.push(model, "lm", shard_size=SHARD)
    env = clean_env(home)
    pushed = run_cli("oci", "push", "lm:v1", oci.ref("cli/lm"), "--json", env=env, check=True)
    assert json.loads(pushed.stdout)["ref"] == oci.ref("cli/lm", "v1")
    imported = run_cli("oci", "pull", oci.ref("cli/lm", "v1"), "lm-copy", "--tag", "from=oci",
                       "--json", env=env, check=True)
    copy = json.loads(imported.stdout)
    assert copy["ref"] == "lm-copy:v1" and copy["digest"] == mv.digest
    assert copy["tags"] == {"from": "oci"}
    assert_same_state(reg.pull("lm-copy", device="cpu", model=BlockLM).state_dict(),
                      model.state_dict())

    # `registry pull` reads an artifact without importing it: weights, folder and files.
    ref = oci.ref("cli/lm", "v1")
    out = home.parent / "cli-oci.safetensors"
    wrote = run_cli("pull", ref, "-o", str(out), "--device", "cpu", env=env, check=True)
    # Read by the digest the tag named when the command began: show and pull saw one manifest.
    pinned = oci_door.pinned(ref, reg.settings)
    assert pinned.startswith(oci.ref("cli/lm") + "@sha256:") and pinned in wrote.stdout
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(out), "pt") as fh:
        assert fh.metadata()["registry.ref"] == pinned
        assert fh.metadata()["registry.digest"] == mv.digest
    assert_same_state(load_file(out), model.state_dict())
    assert_same_state(reg.pull_state_dict(ref, device="cpu"), model.state_dict())
    shown = json.loads(run_cli("show", ref, "--json", env=env, check=True).stdout)
    assert (shown["name"], shown["version"], shown["digest"]) == ("lm", 1, mv.digest)
    assert sorted(reg.list_models()) == ["lm", "lm-copy"]  # nothing imported


def test_a_pinned_ref_keeps_reading_the_artifact_its_tag_named(reg: Registry,
                                                               oci: OciRegistry) -> None:
    """``registry pull oci://...:TAG`` pins the tag to a digest before its show and its pull:
    a tag pushed again meanwhile does not mix two artifacts in one command."""
    first, second = block_lm(seed=1), block_lm(seed=2)
    reg.push(first, "lm", shard_size=SHARD)
    reg.push(second, "lm", shard_size=SHARD)
    moving = oci.ref("pin/lm", "latest")
    reg.push_oci("lm:v1", moving)
    pinned = oci_door.pinned(moving, reg.settings)
    assert pinned != moving and oci_door.pinned(pinned, reg.settings) == pinned
    reg.push_oci("lm:v2", moving)  # the tag moves on
    assert reg.show(pinned).version == 1 and reg.show(moving).version == 2
    assert_same_state(reg.pull_state_dict(pinned, device="cpu"), first.state_dict())


def test_basic_auth_from_the_environment_or_the_docker_config(
        reg: Registry, oci_auth: OciRegistry, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    reg.push(block_lm(), "lm", shard_size=SHARD)
    with pytest.raises(registry.UnauthorizedError, match="no credentials are configured"):
        reg.push_oci("lm:v1", oci_auth.ref("auth/lm"))
    monkeypatch.setenv("REGISTRY_OCI_AUTH", json.dumps(
        {oci_auth.host: {"username": "alice", "password": "wrong"}}))
    with pytest.raises(registry.UnauthorizedError, match="credentials given were refused") \
            as caught:
        Registry().push_oci("lm:v1", oci_auth.ref("auth/lm"))
    assert "wrong" not in str(caught.value)
    monkeypatch.setenv("REGISTRY_OCI_AUTH", json.dumps(
        {oci_auth.host: {"username": "alice", "password": "s3cret-pw"}}))
    assert Registry().push_oci("lm:v1", oci_auth.ref("auth/lm")).uploaded > 0
    monkeypatch.delenv("REGISTRY_OCI_AUTH")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text(json.dumps(
        {"auths": {oci_auth.host: {"auth": "YWxpY2U6czNjcmV0LXB3"}}}))  # alice:s3cret-pw
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    pulled = Registry(home=tmp_path / "fresh").pull(oci_auth.ref("auth/lm", "v1"), device="cpu",
                                                    model=BlockLM)
    assert_same_state(pulled.state_dict(), block_lm().state_dict())


def test_another_producers_artifact_imports_like_a_checkpoint_directory(
        reg: Registry, oci: OciRegistry, tmp_path: Path) -> None:
    """An artifact pushed by oras-py (plain safetensors with a DataParallel prefix, a config,
    the spec's media types) imports as a version with its keys normalized."""
    from safetensors.torch import save_file

    model = block_lm()
    state = {f"module.{k}": v.clone() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    weights = tmp_path / "model.safetensors"
    save_file(state, weights)
    _push_foreign(oci, "foreign/lm:v1", [(weights, modelpack.WEIGHT, "model.safetensors")],
                  tmp_path, {"descriptor": {"name": "foreign"},
                             "config": {"format": "safetensors"},
                             "modelfs": {"type": "layers", "diffIds": []}})
    mv = reg.import_oci(oci.ref("foreign/lm", "v1"), "foreign")
    assert mv.metadata["source"]["wrapping"] == ["DataParallel/DistributedDataParallel"]
    expected = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert_same_state(reg.pull_state_dict("foreign", device="cpu"), expected)
    # A pull materializes it without an import: the same normalization, no catalog entry.
    pulled = reg.pull(oci.ref("foreign/lm", "v1"), device="cpu", model=BlockLM)
    assert_same_state(pulled.state_dict(), model.state_dict())
    assert reg.list_versions("foreign") == [reg.show("foreign")]  # nothing added by the pull
    digest = httpx.head(f"http://{oci.host}/v2/foreign/lm/manifests/v1",
                        headers={"accept": modelpack.OCI_MANIFEST}).headers["docker-content-digest"]
    fresh = Registry(home=tmp_path / "fresh")
    by_digest = fresh.pull(f"oci://{oci.host}/foreign/lm@{digest}", device="auto", model=BlockLM)
    assert_same_state(by_digest.state_dict(), model.state_dict())
    assert fresh.list_models() == []


def _sha(path: Path) -> str:
    from registry.io.digests import sha256_file

    return sha256_file(path)


def test_tls_with_a_custom_ca(reg: Registry, tmp_path_factory: pytest.TempPathFactory,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry on a non-loopback address speaks HTTPS only: refused with the system's CAs,
    trusted through REGISTRY_OCI_CA_BUNDLE."""
    workdir = tmp_path_factory.mktemp("oci-tls")
    address = oci_registry.non_loopback_address()
    ca, cert, key = oci_registry.tls_files(workdir / "tls", address)
    server = oci_registry.start(workdir / "registry", address=address, tls=(cert, key))
    try:
        reg.push(block_lm(), "lm", shard_size=SHARD)
        with pytest.raises(registry.OciUnavailableError, match="cannot be reached"):
            reg.push_oci("lm:v1", server.ref("tls/lm"))
        monkeypatch.setenv("REGISTRY_OCI_CA_BUNDLE", str(ca))
        done = Registry().push_oci("lm:v1", server.ref("tls/lm"))
        assert done.ref.startswith(f"oci://{address}:") and done.uploaded == done.layers
        pulled = Registry(home=workdir / "fresh").pull(server.ref("tls/lm", "v1"), device="cpu",
                                                      model=BlockLM)
        assert_same_state(pulled.state_dict(), block_lm().state_dict())
        with pytest.raises(registry.InsecureTransportError):
            check_url(f"http://{server.host}/v2/", parse_oci_ref(server.ref("tls/lm")),
                      what="URL")
    finally:
        server.stop()


def test_a_push_to_another_repository_mounts_instead_of_uploading(
        reg: Registry, oci: OciRegistry) -> None:
    mv = reg.push(block_lm(), "lm", shard_size=SHARD)
    reg.push_oci("lm:v1", oci.ref("mount/a"))
    before = len(oci.completed_uploads())
    done = reg.push_oci("lm:v1", oci.ref("mount/b"))
    files = version_files(mv.metadata)
    assert done.mounted == len(files) + 1  # every file and the manifest layer
    assert done.uploaded == 0
    # only the config was sent again, the one blob the door puts whole
    assert len(oci.completed_uploads()) - before == 1


def test_signatures_travel_with_the_artifact_and_verify_after_import(
        reg: Registry, oci: OciRegistry, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A signed version's bundles and records are layers of its artifact; imported under its
    own name and number they verify as on the original; a pull applies REGISTRY_VERIFY."""
    pytest.importorskip("model_signing")
    from tests.keys import ec_key_pair

    producer, stranger = ec_key_pair(tmp_path / "k", "producer"), ec_key_pair(tmp_path / "k", "x")
    model = block_lm()
    mv = reg.push(model, "lm", shard_size=SHARD, sign_key=producer.private)
    reg.push_oci(mv.ref, oci.ref("signed/lm", "v1"))
    doc = _manifest(oci, "signed/lm", "v1")
    bundles = [x for x in doc["layers"] if x["mediaType"] == modelpack.SIGNATURE_BUNDLE]
    signature = reg.show(mv.ref).metadata["signatures"][0]
    assert [x["digest"] for x in bundles] == [signature["digest"]]
    assert any(x["mediaType"] == modelpack.SIGNATURE_RECORDS for x in doc["layers"])
    # show reads the artifact's version and signatures from its small layers, no weight.
    looker = tmp_path / "looker"
    shown = Registry(home=looker).show(oci.ref("signed/lm", "v1"))
    assert (shown.ref, shown.digest) == (mv.ref, mv.digest)
    assert shown.metadata["signatures"] == [signature]
    fetched = {p.name for p in (looker / "cache" / "blobs" / "sha256").iterdir()}
    assert fetched.isdisjoint(f["digest"].removeprefix("sha256:")
                              for f in mv.metadata["files"])

    other = Registry(home=tmp_path / "elsewhere")
    copy = other.import_oci(oci.ref("signed/lm", "v1"))
    assert copy.ref == "lm:v1" and copy.digest == mv.digest
    good = other.verify("lm:v1", public_keys=[producer.public])
    assert [s.digest for s in good] == [signature["digest"]] and good[0].verified
    renamed = other.import_oci(oci.ref("signed/lm", "v1"), "lm-renamed")  # signs lm:v1 only
    assert other.verify(renamed.ref, public_keys=[producer.public]) == []

    monkeypatch.setenv("REGISTRY_VERIFY", "require")
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(producer.public))
    pulled = Registry(home=tmp_path / "third").pull(oci.ref("signed/lm", "v1"), device="cpu",
                                                    model=BlockLM)
    assert_same_state(pulled.state_dict(), model.state_dict())
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(stranger.public))
    with pytest.raises(registry.SignatureError, match="signed only by"):
        Registry(home=tmp_path / "fourth").pull(oci.ref("signed/lm", "v1"), device="cpu",
                                                model=BlockLM)


def test_another_producers_tar_layers_pull(reg: Registry, oci: OciRegistry,
                                           tmp_path: Path) -> None:
    """modctl-style archived layers (``weight.v1.tar+gzip``, ``weight.config.v1.tar``) pushed
    by oras-py are unpacked and pulled."""
    import tarfile

    from safetensors.torch import save_file

    model = block_lm()
    save_file({k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              tmp_path / "model.safetensors")
    (tmp_path / "tokenizer.json").write_text("{}")
    archives = []
    for name, media_type, mode in (("model.safetensors", modelpack.WEIGHT, "w:gz"),
                                   ("tokenizer.json", modelpack.WEIGHT_CONFIG, "w")):
        archive = tmp_path / f"{name}.tar"
        with tarfile.open(archive, mode) as tar:
            tar.add(tmp_path / name, arcname=name)
        suffix = ".tar+gzip" if mode == "w:gz" else ".tar"
        archives.append((archive, media_type.replace(".raw", suffix), name))
    _push_foreign(oci, "foreign/tarred:v1", archives, tmp_path)
    pulled = reg.pull(oci.ref("foreign/tarred", "v1"), device="cpu", model=BlockLM)
    assert_same_state(pulled.state_dict(), model.state_dict())


def _push_foreign(oci: OciRegistry, container: str, layers: list[tuple[Path, str, str]],
                  workdir: Path, config_body: dict[str, Any] | None = None) -> str:
    """Push ``(file, media type, filepath)`` layers and a ModelPack config (``config_body``,
    by default only its format) with oras-py, as another producer would; the artifact's
    oci:// reference."""
    import oras.provider

    client = oras.provider.Registry(hostname=oci.host, insecure=True)
    target = client.get_container(f"{oci.host}/{container}")
    descriptors = []
    for path, media_type, filepath in layers:
        descriptors.append({"mediaType": media_type, "digest": _sha(path),
                            "size": path.stat().st_size,
                            "annotations": {modelpack.FILEPATH: filepath}})
        client.upload_blob(str(path), target, descriptors[-1])
    config = workdir / "modelpack-config.json"
    config.write_text(json.dumps(config_body or {"config": {"format": "safetensors"}}))
    conf = {"mediaType": modelpack.CONFIG_TYPE, "digest": _sha(config),
            "size": config.stat().st_size}
    client.upload_blob(str(config), target, conf)
    client.upload_manifest({"schemaVersion": 2, "mediaType": modelpack.OCI_MANIFEST,
                            "artifactType": modelpack.ARTIFACT_TYPE, "config": conf,
                            "layers": descriptors}, target)
    repo, _, tag = container.rpartition(":")
    return oci.ref(repo, tag)


def _plain_pull(reg: Registry, ref: str) -> tuple[dict, dict[str, bytes]]:
    """The manifest of the version a plain pull of ``ref`` builds (no import), and the bytes
    of each attached file as the pull serves them (from the verified cache)."""
    import os

    from registry.oci.door import opened

    with opened(ref, reg.settings) as (record, fetch):
        served = {}
        for a in record.manifest.get("attachments", []):
            with os.fdopen(fetch(a["digest"], a["size"]), "rb") as fh:
                served[a["name"]] = fh.read()
        return record.manifest, served


def test_a_foreign_pull_attaches_the_raw_config_and_doc_layers(
        reg: Registry, oci: OciRegistry, tmp_path: Path) -> None:
    """A save_pretrained-like directory pushed as raw layers by another producer: the plain
    pull's version lists its non-weight files as a push of the directory would (the same
    entries as the import's: names, digests, sizes) and serves them byte for byte; each is the
    very layer blob, kept in the verified cache by its digest."""
    from safetensors.torch import save_file

    model = block_lm()
    source = tmp_path / "src"
    source.mkdir()
    save_file({k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              source / "model.safetensors")
    (source / "config.json").write_text(json.dumps({"hidden": 8, "note": "not transformers"}))
    (source / "generation_config.json").write_text(json.dumps({"max_length": 16}))
    (source / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    (source / "README.md").write_bytes(b"# lm\nfrom another producer\n")
    kinds = {"config.json": modelpack.WEIGHT_CONFIG, "generation_config.json":
             modelpack.WEIGHT_CONFIG, "tokenizer.json": modelpack.WEIGHT_CONFIG,
             "README.md": modelpack.DOC}
    ref = _push_foreign(oci, "foreign/raw-files:v1", [
        (source / "model.safetensors", modelpack.WEIGHT, "model.safetensors"),
        *((source / name, kind, name) for name, kind in kinds.items())], tmp_path)

    manifest, served = _plain_pull(reg, ref)
    listed = manifest["attachments"]
    assert [(a["name"], a["digest"], a["size"]) for a in listed] == [
        (name, _sha(source / name), (source / name).stat().st_size) for name in sorted(kinds)]
    assert served == {name: (source / name).read_bytes() for name in kinds}
    assert reg.list_models() == []  # the plain pull added no version
    imported = reg.import_oci(ref, "raw-imported")
    assert listed == imported.metadata["attachments"]
    pulled = reg.pull(ref, device="cpu", model=BlockLM)
    assert_same_state(pulled.state_dict(), model.state_dict())


def test_a_foreign_pull_attaches_files_unpacked_from_tar_layers(
        reg: Registry, oci: OciRegistry, tmp_path: Path) -> None:
    """Files out of ``.tar`` / ``.tar+gzip`` config and doc layers are attached by the sha256
    of their own bytes, kept in the verified cache; the pull's memo is used only while every
    file it lists is still cached."""
    import tarfile

    from safetensors.torch import save_file

    model = block_lm()
    source = tmp_path / "src"
    (source / "docs").mkdir(parents=True)
    save_file({k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              source / "model.safetensors")
    (source / "config.json").write_text(json.dumps({"hidden": 8, "note": "not transformers"}))
    (source / "tokenizer.json").write_text("{}")
    (source / "docs" / "card.md").write_bytes(b"# card\n" * 50)
    layers = [(source / "model.safetensors", modelpack.WEIGHT, "model.safetensors")]
    for names, media_type, mode in ((["config.json", "tokenizer.json"],
                                     modelpack.WEIGHT_CONFIG.replace(".raw", ".tar"), "w"),
                                    (["docs/card.md"],
                                     modelpack.DOC.replace(".raw", ".tar+gzip"), "w:gz")):
        archive = tmp_path / f"{names[0].replace('/', '-')}.tar"
        with tarfile.open(archive, mode) as tar:
            for name in names:
                tar.add(source / name, arcname=name)
        layers.append((archive, media_type, names[0].split("/")[0]))
    ref = _push_foreign(oci, "foreign/tar-files:v1", layers, tmp_path)
    names = ["config.json", "docs/card.md", "tokenizer.json"]
    expected = {n: (source / n).read_bytes() for n in names}

    manifest, served = _plain_pull(reg, ref)
    listed = manifest["attachments"]
    assert [(a["name"], a["digest"], a["size"]) for a in listed] == [
        (n, _sha(source / n), len(expected[n])) for n in names]
    assert served == expected
    cache = reg.settings.cache_dir / "blobs" / "sha256"
    for a in listed:  # by their own digests, not the archives'
        assert (cache / a["digest"][7:]).read_bytes() == expected[a["name"]]
    pulled = reg.pull(ref, device="cpu", model=BlockLM)
    assert_same_state(pulled.state_dict(), model.state_dict())

    # An attached file gone from the cache: the memo is not used, the pull normalizes again.
    (cache / listed[1]["digest"][7:]).unlink()
    again, served = _plain_pull(reg, ref)
    assert again["attachments"] == listed and served == expected
    imported = reg.import_oci(ref, "tar-imported")
    assert imported.metadata["attachments"] == listed


@pytest.mark.slow
def test_a_foreign_pull_keeps_a_signed_directorys_model_sig_as_an_import_does(
        oci: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory signed with the reference ``model_signing`` CLI and pushed as raw layers:
    the plain pull checks its ``model.sig`` and keeps it as ``provenance/model.sig`` with the
    signer in ``source``, exactly as the import (a push of the directory) records them."""
    pytest.importorskip("model_signing")
    import subprocess
    import sys

    from safetensors.torch import save_file

    from tests.keys import ec_key_pair

    key = ec_key_pair(tmp_path / "keys", "producer")
    source = tmp_path / "src"
    source.mkdir()
    save_file({k: v.clone() for k, v in block_lm().state_dict().items()
               if k != "lm_head.weight"}, source / "model.safetensors")
    (source / "README.md").write_text("# signed by its producer\n")
    exe = Path(sys.executable).with_name("model_signing")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "model_signing"]
    signed = subprocess.run([*command, "sign", "key", str(source), "--private_key",
                             str(key.private), "--signature", str(source / "model.sig")],
                            capture_output=True, text=True, timeout=300)
    assert signed.returncode == 0, signed.stdout + signed.stderr
    ref = _push_foreign(oci, "foreign/signed:v1", [
        (source / "model.safetensors", modelpack.WEIGHT, "model.safetensors"),
        (source / "README.md", modelpack.DOC, "README.md"),
        (source / "model.sig", modelpack.DOC, "model.sig")], tmp_path)
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(key.public))
    reg = Registry(home=tmp_path / "home")

    manifest, served = _plain_pull(reg, ref)
    assert [a["name"] for a in manifest["attachments"]] == ["README.md", "provenance/model.sig"]
    assert served["provenance/model.sig"] == (source / "model.sig").read_bytes()
    assert manifest["source"]["signed_files"]["verified"] is True
    imported = reg.import_oci(ref, "signed-imported")
    assert manifest["attachments"] == imported.metadata["attachments"]
    assert manifest["source"]["signed_files"] == imported.metadata["source"]["signed_files"]


@pytest.mark.slow
def test_save_pretrained_and_pull_files_of_an_oci_ref(reg: Registry, oci: OciRegistry,
                                                      tmp_path: Path, home: Path) -> None:
    """save_pretrained and pull_files take an oci:// ref: another producer's save_pretrained
    directory comes back as the import of it does, byte for byte, and loads in transformers;
    an artifact this registry pushed serves its attached files without an import."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32))
    source = tmp_path / "src"
    model.save_pretrained(source, safe_serialization=True)
    (source / "README.md").write_bytes(b"# gpt2-tiny\nfrom another producer\n")
    (source / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    names = ["README.md", "config.json", "generation_config.json", "tokenizer.json"]
    ref = _push_foreign(oci, "foreign/gpt2:v1", [
        (source / "model.safetensors", modelpack.WEIGHT, "model.safetensors"),
        *((source / n, modelpack.DOC if n == "README.md" else modelpack.WEIGHT_CONFIG, n)
          for n in names)], tmp_path)

    files = reg.pull_files(ref, tmp_path / "files")
    assert sorted(p.name for p in files.iterdir()) == names
    for name in names:
        assert (files / name).read_bytes() == (source / name).read_bytes()
    from_pull = reg.save_pretrained(ref, tmp_path / "hf-pull")
    assert reg.list_models() == []  # neither added a version
    imported = reg.import_oci(ref, "gpt2-imported")
    from_import = reg.save_pretrained(imported.ref, tmp_path / "hf-import")
    written = sorted(p.name for p in from_pull.iterdir())
    assert written == sorted(p.name for p in from_import.iterdir())
    assert {*names, "model.safetensors"} <= set(written)
    for name in written:
        assert (from_pull / name).read_bytes() == (from_import / name).read_bytes(), name
    for name in ("README.md", "tokenizer.json"):
        assert (from_pull / name).read_bytes() == (source / name).read_bytes()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(from_pull)
    assert_same_state(loaded.state_dict(), model.state_dict())
    by_cli = tmp_path / "hf-cli"  # `registry pull --format hf` of the artifact, as the call
    run_cli("pull", ref, "--format", "hf", "-o", str(by_cli), env=clean_env(home), check=True)
    for name in written:
        assert (by_cli / name).read_bytes() == (from_pull / name).read_bytes(), name
    got = run_cli("pull", ref, "--files", "-o", str(tmp_path / "files-cli"),
                  env=clean_env(home), check=True)
    assert f"{len(names)} file(s) of oci://" in got.stdout
    assert sorted(p.name for p in (tmp_path / "files-cli").iterdir()) == names

    reg.push(block_lm(), "lm", files={"README.md": _write(reg, "README.md", b"# ours\n")})
    reg.push_oci("lm:v1", oci.ref("ours/lm", "v1"))
    fresh = Registry(home=tmp_path / "fresh")
    ours = fresh.pull_files(oci.ref("ours/lm", "v1"), tmp_path / "ours")
    assert (ours / "README.md").read_bytes() == b"# ours\n"
    assert fresh.list_models() == []
