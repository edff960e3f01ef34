"""The AI-BOM (CycloneDX 1.6, checked by cyclonedx-python-lib's strict validator; SPDX 3.0.1,
read back by spdx-python-model's JSON-LD deserializer and written again by its serializer) and
the model card of a version, computed from its signed manifest; the card as save_pretrained's
README.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

import registry
from registry.catalog.records import VersionRecord
from registry.errors import RefError
from registry.mirror.mlflow_view import MAX_DESCRIPTION, describe
from registry.refs import parse
from tests.helpers import clean_env, run_cli
from tests.keys import ec_key_pair

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
validation = pytest.importorskip("cyclonedx.validation.json")
schema = pytest.importorskip("cyclonedx.schema")
spdx3 = pytest.importorskip("spdx_python_model.bindings.v3_0_1")

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
DIGEST = "sha256:" + "5" * 64


def _gpt() -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                     n_positions=64)
    return transformers.GPT2LMHeadModel(config).eval()


def _validate(document: dict[str, object]) -> None:
    validator = validation.JsonStrictValidator(schema.SchemaVersion.V1_6)
    error = validator.validate_str(json.dumps(document))
    assert error is None, str(error)


def test_the_bom_of_a_signed_adapter_validates_and_names_base_datasets_and_files(
        reg: registry.Registry, tmp_path: Path) -> None:
    keys = ec_key_pair(tmp_path / "keys")
    base = reg.push(_gpt(), "gpt")
    lora = peft.get_peft_model(_gpt(), peft.LoraConfig(r=4, target_modules=["c_attn"],
                                                       init_lora_weights=False))
    adapter = reg.push(lora, "gpt-lora", base="gpt:v1", sign_key=keys.private, datasets=[
        {"name": "wiki", "uri": "s3://data/wiki", "digest": DIGEST},
        {"name": "chat", "uri": "https://example.com/chat.jsonl", "digest": "md5:" + "a" * 32}])
    document = reg.bom(adapter.ref)
    _validate(document)

    subject = document["metadata"]["component"]
    assert subject["type"] == "machine-learning-model"
    assert (subject["name"], subject["version"], subject["bom-ref"]) == \
        ("gpt-lora", "v1", adapter.digest)
    files = adapter.metadata["files"] + adapter.metadata.get("attachments", [])
    assert sorted(h["hashes"][0]["content"] for h in subject["components"]) == \
        sorted(f["digest"][7:] for f in files)
    assert all(c["hashes"][0]["alg"] == "SHA-256" for c in subject["components"])
    by_ref = {c["bom-ref"]: c for c in document["components"]}
    parent = next(c for c in by_ref.values() if c["type"] == "machine-learning-model")
    assert (parent["name"], parent["version"], parent["hashes"][0]["content"]) == \
        ("gpt", "v1", base.digest[7:])
    assert {c["name"] for c in by_ref.values() if c["type"] == "data"} == {"wiki", "chat"}
    assert by_ref["dataset:wiki"]["hashes"] == [{"alg": "SHA-256", "content": "5" * 64}]
    depends = {d["ref"]: d.get("dependsOn", []) for d in document["dependencies"]}
    assert set(depends[adapter.digest]) == set(by_ref)
    params = subject["modelCard"]["modelParameters"]
    assert params["datasets"] == [{"ref": "dataset:wiki"}, {"ref": "dataset:chat"}]
    props = {p["name"]: p["value"] for p in subject["properties"]}
    signer = reg.show(adapter.ref).metadata["signatures"][0]["signer"]
    assert signer in props["torch-registry:signature"]
    assert props["torch-registry:training:devices"] == "cpu"

    plain = reg.bom(base.ref)
    _validate(plain)
    card_props = {p["name"]: p["value"]
                  for p in plain["metadata"]["component"]["modelCard"]["properties"]}
    assert int(card_props["torch-registry:parameters"]) == sum(
        p.numel() for p in _gpt().parameters())
    assert plain["metadata"]["component"]["modelCard"]["modelParameters"] == {
        "architectureFamily": "gpt2", "modelArchitecture": "transformers:GPT2LMHeadModel",
        "task": "text-generation"}
    with pytest.raises(RefError, match="unknown BOM format"):
        reg.bom(base.ref, "xml")  # type: ignore[arg-type]


def _spdx_objects(document: dict[str, object]) -> dict[str, object]:
    """The document read by the SPDX 3.0.1 bindings (unknown types or properties and wrongly
    typed values raise), every reference resolved, then written again (required properties are
    checked on writing) and read back to the same graph; its elements by spdxId."""
    objects = spdx3.SHACLObjectSet()
    spdx3.JSONLDDeserializer().deserialize_data(json.loads(json.dumps(document)), objects)
    assert objects.link() == set()  # no reference to an element the document lacks
    again = spdx3.JSONLDSerializer().serialize_data(objects)
    twice = spdx3.SHACLObjectSet()
    spdx3.JSONLDDeserializer().deserialize_data(again, twice)
    by_id = {o._id: o for o in objects.foreach() if getattr(o, "_id", None)}
    assert by_id.keys() == {o._id for o in twice.foreach() if getattr(o, "_id", None)}
    return by_id


def test_the_spdx_bom_of_a_signed_adapter_reads_back_with_ai_and_dataset_profiles(
        reg: registry.Registry, tmp_path: Path) -> None:
    keys = ec_key_pair(tmp_path / "keys")
    base = reg.push(_gpt(), "gpt")
    lora = peft.get_peft_model(_gpt(), peft.LoraConfig(r=4, target_modules=["c_attn"],
                                                       init_lora_weights=False))
    adapter = reg.push(lora, "gpt-lora", base="gpt:v1", sign_key=keys.private, datasets=[
        {"name": "wiki", "uri": "s3://data/wiki", "digest": DIGEST},
        {"name": "chat", "uri": "https://example.com/chat.jsonl", "digest": "md5:" + "a" * 32}])
    document = reg.bom(adapter.ref, "spdx")
    assert document["@context"] == "https://spdx.org/rdf/3.0.1/spdx-context.jsonld"
    by_id = _spdx_objects(document)
    spdx_doc = next(o for o in by_id.values() if isinstance(o, spdx3.SpdxDocument))
    assert {p.split("/")[-1] for p in spdx_doc.profileConformance} == \
        {"core", "software", "ai", "dataset"}
    (subject,) = spdx_doc.rootElement
    assert isinstance(subject, spdx3.ai_AIPackage)
    assert (subject.name, subject.software_packageVersion) == ("gpt-lora", "v1")
    assert [(h.algorithm.split("/")[-1], h.hashValue) for h in subject.verifiedUsing] == \
        [("sha256", adapter.digest[7:])]
    assert list(subject.ai_typeOfModel) == ["LoRA adapter", "LoRA over gpt"]
    hyper = {e.key: e.value for e in subject.ai_hyperparameter}
    assert int(hyper["parameters"]) == adapter.metadata["source"]["params"]
    assert hyper["quantization"] == "none"
    assert "devices: cpu" in subject.ai_informationAboutTraining
    assert list(subject.ai_domain) == []  # an adapter names no task

    relations: dict[str, list[tuple[object, list[object]]]] = {}
    for r in by_id.values():
        if isinstance(r, spdx3.Relationship):
            relations.setdefault(r.relationshipType.split("/")[-1], []).append(
                (r.from_, list(r.to)))
    ((holder, files),) = relations["contains"]
    assert holder is subject and all(isinstance(f, spdx3.software_File) for f in files)
    expected = adapter.metadata["files"] + adapter.metadata.get("attachments", [])
    assert sorted(f.verifiedUsing[0].hashValue for f in files) == \
        sorted(f["digest"][7:] for f in expected)
    assert all(f.name and f.verifiedUsing[0].algorithm.endswith("sha256") for f in files)
    ((trained, datasets),) = relations["trainedOn"]
    assert trained is subject
    assert all(isinstance(d, spdx3.dataset_DatasetPackage) for d in datasets)
    by_name = {d.name: d for d in datasets}
    assert by_name.keys() == {"wiki", "chat"}
    assert by_name["wiki"].software_downloadLocation == "s3://data/wiki"
    assert [h.hashValue for h in by_name["wiki"].verifiedUsing] == ["5" * 64]
    assert list(by_name["chat"].verifiedUsing) == [] and "md5:" in by_name["chat"].comment
    ((parent, children),) = relations["ancestorOf"]
    assert children == [subject] and isinstance(parent, spdx3.ai_AIPackage)
    assert (parent.name, parent.software_packageVersion, parent.verifiedUsing[0].hashValue) \
        == ("gpt", "v1", base.digest[7:])
    assert relations["dependsOn"] == [(subject, [parent])]  # an adapter loads over its base
    notes = [a.statement for a in by_id.values() if isinstance(a, spdx3.Annotation)
             and a.subject is subject]
    signer = reg.show(adapter.ref).metadata["signatures"][0]["signer"]
    assert any(n.startswith("torch-registry:signature=") and signer in n for n in notes)

    plain = _spdx_objects(reg.bom(base.ref, "spdx"))
    model = next(o for o in plain.values() if isinstance(o, spdx3.ai_AIPackage))
    assert list(model.ai_typeOfModel) == ["gpt2", "transformers:GPT2LMHeadModel"]
    assert list(model.ai_domain) == ["text-generation"]
    assert not any(isinstance(o, spdx3.dataset_DatasetPackage) for o in plain.values())


def test_the_card_front_matter_and_body(reg: registry.Registry, tmp_path: Path) -> None:
    keys = ec_key_pair(tmp_path / "keys")
    reg.push(_gpt(), "gpt")
    tuned = _gpt()
    with torch.no_grad():
        tuned.transformer.h[1].mlp.c_fc.weight.add_(0.1)
    mv = reg.push(tuned, "gpt-tuned", parents=["gpt:v1"], sign_key=keys.private,
                  datasets=[{"name": "wiki", "uri": "s3://data/wiki"}], tags={"team": "nlp"})
    text = reg.card(mv.ref)
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta == {"library_name": "transformers", "base_model": "gpt:v1",
                    "base_model_relation": "finetune", "datasets": ["wiki"],
                    "tags": ["torch-registry", "transformers", "team:nlp"],
                    "pipeline_tag": "text-generation"}
    assert f"`{mv.digest}`" in text
    assert "- devices: cpu" in text and "- wrapping: none" in text
    assert f"- parent (given): gpt:v1 `{reg.show('gpt:v1').digest}`" in text
    assert reg.show(mv.ref).metadata["signatures"][0]["signer"] in text
    for f in mv.metadata["files"]:
        assert f["digest"][7:] in text


def test_save_pretrained_writes_the_card_as_readme_unless_one_is_attached(
        reg: registry.Registry, tmp_path: Path) -> None:
    model = _gpt()
    mv = reg.push(model, "gpt")
    out = reg.save_pretrained(mv.ref, tmp_path / "dir")
    readme = (out / "README.md").read_text()
    assert readme.startswith("---\nlibrary_name: \"transformers\"")
    assert f"`{mv.digest}`" in readme and "registry verify gpt:v1" in readme
    assert transformers.AutoModelForCausalLM.from_pretrained(out) is not None

    src = tmp_path / "src"
    model.save_pretrained(src)
    (src / "README.md").write_text("# my own card\n")
    own = reg.push(src, "gpt-own")
    assert (reg.save_pretrained(own.ref, tmp_path / "own") / "README.md").read_text() == \
        "# my own card\n"


def test_a_signed_directory_with_its_card_verifies(reg: registry.Registry,
                                                   tmp_path: Path) -> None:
    model_signing = pytest.importorskip("model_signing")
    del model_signing
    from registry.signing import oms

    keys = ec_key_pair(tmp_path / "keys")
    mv = reg.push(_gpt(), "gpt", sign_key=keys.private)
    out = reg.save_pretrained(mv.ref, tmp_path / "dir")
    assert (out / "README.md").is_file() and (out / oms.SIGNATURE_NAME).is_file()
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("model_signing")
    done = subprocess.run([str(exe), "verify", "key", str(out), "--signature",
                           str(out / oms.SIGNATURE_NAME), "--public_key", str(keys.public)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    (out / "README.md").write_text("changed")
    done = subprocess.run([str(exe), "verify", "key", str(out), "--signature",
                           str(out / oms.SIGNATURE_NAME), "--public_key", str(keys.public)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0  # the card is covered by the signature


def test_a_version_pushed_before_cards_gets_no_readme(home: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_LINEAGE", "0")  # as pushed before lineage: no record at all
    reg = registry.Registry(home=home)
    mv = reg.push(_gpt(), "gpt")
    assert "lineage" not in mv.metadata["source"]
    out = reg.save_pretrained(mv.ref, tmp_path / "dir")
    assert not (out / "README.md").exists()
    assert "No lineage recorded." in reg.card(mv.ref)


def test_the_mlflow_description_is_the_card(reg: registry.Registry) -> None:
    mv = reg.push(_gpt(), "gpt", datasets=[{"name": f"d{i}", "uri": "s3://x/" + "y" * 1500}
                                           for i in range(8)])
    record: VersionRecord = reg.backend.resolve(parse(mv.ref))
    text = describe(record)
    assert text.startswith("# gpt:v1") and "## Lineage" in text
    assert "| trained on | cpu |" in text  # the show facts follow the card
    assert len(text) <= MAX_DESCRIPTION and "registry card gpt:v1" in text  # cut to fit


def test_cli_bom_and_card(home: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    env = clean_env(home)
    ckpt = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(2, 2)}, str(ckpt))
    run_cli("push", "m", str(ckpt), "--dataset", f"d=s3://b/d@{DIGEST}", env=env, check=True)
    out = tmp_path / "bom.json"
    done = run_cli("bom", "m:v1", "-o", str(out), env=env, check=True)
    assert "CycloneDX 1.6" in done.stdout
    _validate(json.loads(out.read_text()))
    printed = json.loads(run_cli("bom", "m", env=env, check=True).stdout)
    assert printed["metadata"]["component"]["name"] == "m"
    spdx_out = tmp_path / "bom.spdx.json"
    done = run_cli("bom", "m:v1", "--format", "spdx", "-o", str(spdx_out), env=env, check=True)
    assert "SPDX 3.0.1" in done.stdout
    objects = _spdx_objects(json.loads(spdx_out.read_text()))
    (dataset,) = [o for o in objects.values() if isinstance(o, spdx3.dataset_DatasetPackage)]
    assert (dataset.name, dataset.software_downloadLocation) == ("d", "s3://b/d")
    refused = run_cli("bom", "m", "--format", "xml", env=env)
    assert refused.returncode == 2 and "xml" in refused.stderr
    card = run_cli("card", "m:v1", env=env, check=True).stdout
    assert card.startswith("---\nlibrary_name: \"pytorch\"") and "dataset: d (s3://b/d)" in card
