"""Files that travel with the weights, and from_pretrained directories written back (issue 11).

Tiny transformers models are built from configs (nothing is downloaded), saved with their own
``save_pretrained`` as safetensors, as ``.bin`` and sharded, with a tokenizer built offline,
pushed as directories, then written back by ``save_pretrained``/``--format hf`` and loaded by
transformers with no missing or unexpected keys and the same outputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import registry
from registry import attachments
from registry.errors import ArchitectureUnknownError, NormalizationError, RefError
from tests.helpers import clean_env, run_cli, trained_mlp

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

VOCAB = 100


def _gpt2() -> Any:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64,
        bos_token_id=1, eos_token_id=2))


def _bert() -> Any:
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64))


def _llama() -> Any:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2))


def _t5() -> Any:
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2,
        decoder_start_token_id=0))


BUILDERS: dict[str, Callable[[], Any]] = {"gpt2": _gpt2, "bert": _bert, "llama": _llama,
                                          "t5": _t5}


def _build(kind: str) -> Any:
    torch.manual_seed(0)
    return BUILDERS[kind]().eval()


def _outputs(model: Any, kind: str) -> torch.Tensor:
    ids = torch.arange(14).reshape(2, 7) % VOCAB
    with torch.no_grad():
        if kind == "t5":
            return model(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
        return model(input_ids=ids).logits


def _tokenizer(directory: Path) -> None:
    """A word-level tokenizer built offline, saved as transformers saves a real one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i + 2 for i in range(20)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                                pad_token="[PAD]")
    fast.save_pretrained(directory)


def _save(model: Any, directory: Path, how: str) -> Path:
    if how == "bin":
        model.save_pretrained(directory, safe_serialization=False)
    elif how == "sharded":
        model.save_pretrained(directory, max_shard_size="50KB")
    else:
        model.save_pretrained(directory)
    return directory


AUTO = {"gpt2": "AutoModelForCausalLM", "llama": "AutoModelForCausalLM",
        "bert": "AutoModelForMaskedLM", "t5": "AutoModelForSeq2SeqLM"}


def _loads_cleanly(directory: Path, kind: str) -> Any:
    """The model transformers' Auto class loads from ``directory``, with nothing missing,
    unexpected or mismatched."""
    auto = getattr(transformers, AUTO[kind])
    loaded, info = auto.from_pretrained(directory, output_loading_info=True)
    assert type(loaded).__name__ == json.loads((directory / "config.json").read_text())[
        "architectures"][0]
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    assert not info.get("error_msgs"), info
    return loaded.eval()


@pytest.mark.parametrize("kind,how", [
    ("gpt2", "safetensors"), ("gpt2", "bin"), ("gpt2", "sharded"),
    ("bert", "safetensors"), ("llama", "sharded"), ("t5", "bin"), ("t5", "sharded"),
])
def test_pretrained_directory_round_trips(reg: registry.Registry, tmp_path: Path, kind: str,
                                          how: str) -> None:
    model = _build(kind)
    source = _save(model, tmp_path / "source", how)
    _tokenizer(source)
    (source / "README.md").write_text("# a tiny model card\n")
    # The registry cuts its own shards: a small target gives a sharded version.
    mv = reg.push(source, kind, shard_size="20KB" if how == "sharded" else None)

    attached = {a["name"] for a in mv.metadata["attachments"]}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "README.md"} <= attached
    assert not {n for n in attached if attachments.is_weights_name(n)}  # weights normalized
    arch = mv.metadata["architecture"]
    config = json.loads((source / "config.json").read_text())
    assert arch["kind"] == "transformers" and arch["config"] == config
    assert arch["class"] == f"transformers:{config['architectures'][0]}"
    if (source / "generation_config.json").exists():
        assert arch["generation_config"] == json.loads(
            (source / "generation_config.json").read_text())
    assert mv.metadata["push"]["files"] == len(attached)

    files = reg.pull_files(mv.ref, tmp_path / "files")
    assert sorted(p.relative_to(files).as_posix() for p in files.rglob("*")
                  if p.is_file()) == sorted(attached)
    for name in attached:
        assert (files / name).read_bytes() == (source / name).read_bytes(), name

    out = reg.save_pretrained(mv.ref, tmp_path / "hf")
    shards = len(mv.metadata["files"])
    assert (shards > 1) == (how == "sharded")
    assert (out / "model.safetensors.index.json").exists() == (shards > 1)
    if shards > 1:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) == shards
        assert set(index["weight_map"]) == set(mv.metadata["tensors"])
    assert (out / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    loaded = _loads_cleanly(out, kind)
    torch.testing.assert_close(_outputs(loaded, kind), _outputs(model, kind))
    assert transformers.AutoTokenizer.from_pretrained(out)("w1 w3")["input_ids"] == [3, 5]
    # The same version pulled without model= (rebuilt from its recorded config) computes the
    # same as what transformers loads from the written directory.
    pulled = reg.pull(mv.ref, device="cpu").eval()
    assert type(pulled) is type(model)
    torch.testing.assert_close(_outputs(pulled, kind), _outputs(loaded, kind))


def test_save_pretrained_casts_and_says_so(reg: registry.Registry, tmp_path: Path) -> None:
    model = _build("gpt2")
    mv = reg.push(_save(model, tmp_path / "src", "safetensors"), "gpt2")
    out = registry.Registry(home=reg.settings.home).save_pretrained(mv.ref, tmp_path / "fp16",
                                                                    dtype="float16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    loaded = _loads_cleanly(out, "gpt2")
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}
    torch.testing.assert_close(_outputs(loaded.float(), "gpt2"), _outputs(model, "gpt2"),
                               atol=2e-2, rtol=2e-2)
    # Writing again into the same folder, unsharded over sharded, leaves no stale shard.
    sharded = reg.push(_save(model, tmp_path / "sharded", "sharded"), "gpt2-sharded",
                       shard_size="20KB")
    reg.save_pretrained(sharded.ref, tmp_path / "again")
    reg.save_pretrained(mv.ref, tmp_path / "again")
    assert sorted(p.name for p in (tmp_path / "again").glob("model*")) == ["model.safetensors"]


def test_recorded_config_wins_over_an_attached_one(reg: registry.Registry,
                                                   tmp_path: Path) -> None:
    model = _build("gpt2")
    source = _save(model, tmp_path / "src", "safetensors")
    (tmp_path / "odd.json").write_text('{"odd": true}')
    mv = reg.push(source, "gpt2", files={"config.json": tmp_path / "odd.json"})
    assert (reg.pull_files(mv.ref, tmp_path / "files") / "config.json").read_text() \
        == '{"odd": true}'
    out = reg.save_pretrained(mv.ref, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["n_layer"] == 2
    _loads_cleanly(out, "gpt2")


def test_files_with_a_module_push_and_refusals(reg: registry.Registry, tmp_path: Path) -> None:
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    (tmp_path / "labels.json").write_text('["cat", "dog"]')
    mv = reg.push(trained_mlp(), "mlp", files={"vocab.txt": tmp_path / "vocab.txt",
                                               "meta/labels.json": str(tmp_path / "labels.json")})
    assert [a["name"] for a in mv.metadata["attachments"]] == ["meta/labels.json", "vocab.txt"]
    out = registry.Registry(home=reg.settings.home).pull_files("mlp", tmp_path / "got")
    assert (out / "meta" / "labels.json").read_text() == '["cat", "dog"]'
    assert (out / "vocab.txt").read_text() == "a\nb\n"
    reg.gc()  # attached files are kept as long as their version lives
    again = reg.pull_files("mlp", tmp_path / "again")
    assert (again / "vocab.txt").read_text() == "a\nb\n"

    with pytest.raises(ArchitectureUnknownError, match="mlp:v1 records no transformers config"):
        reg.save_pretrained("mlp", tmp_path / "hf")
    with pytest.raises(RefError, match="invalid file name '../x'"):
        reg.push(trained_mlp(), "mlp", files={"../x": tmp_path / "vocab.txt"})
    with pytest.raises(NormalizationError, match="'w.safetensors' is a weights file"):
        reg.push(trained_mlp(), "mlp", files={"w.safetensors": tmp_path / "vocab.txt"})
    with pytest.raises(NormalizationError, match="'x.txt': .* does not exist"):
        reg.push(trained_mlp(), "mlp", files={"x.txt": tmp_path / "missing.txt"})
    assert [v.ref for v in reg.list_versions("mlp")] == ["mlp:v1"]


def test_oversized_file_is_refused_and_nothing_is_visible(
        reg: registry.Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attachments, "MAX_FILE_BYTES", 1000)
    source = _save(_build("gpt2"), tmp_path / "src", "safetensors")
    (source / "big.txt").write_bytes(b"x" * 1001)
    with pytest.raises(NormalizationError, match=r"'big.txt' is 1001 bytes, over the limit of "
                                                 r"1000 bytes"):
        reg.push(source, "gpt2")
    assert reg.list_models() == []
    home = reg.settings.home
    assert not [p for p in home.rglob("*") if p.is_file() and "blobs" in p.parts]
    assert not [p for p in home.rglob("file-*") if p.is_file()]  # no staged copy left


def test_cli_push_with_files_and_pull_hf(reg: registry.Registry, home: Path,
                                         tmp_path: Path) -> None:
    from registry.display import version_table

    env = clean_env(home)
    model = _build("gpt2")
    source = _save(model, tmp_path / "src", "sharded")
    (tmp_path / "notes.txt").write_text("notes")
    run_cli("push", "gpt2", str(source), "--file", f"notes.txt={tmp_path / 'notes.txt'}",
            "--shard-size", "20KB", env=env, check=True)
    shown = version_table(reg.show("gpt2"))
    assert "files         config.json, generation_config.json, notes.txt (3 files" in shown
    assert "architecture  transformers:GPT2LMHeadModel" in shown
    got = run_cli("pull", "gpt2", "--files", "-o", str(tmp_path / "files"), env=env, check=True)
    assert "file(s) of gpt2:v1" in got.stdout
    assert (tmp_path / "files" / "notes.txt").read_text() == "notes"
    assert (tmp_path / "files" / "config.json").read_bytes() \
        == (source / "config.json").read_bytes()
    run_cli("pull", "gpt2", "--format", "hf", "-o", str(tmp_path / "hf"), env=env, check=True)
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    torch.testing.assert_close(_outputs(_loads_cleanly(tmp_path / "hf", "gpt2"), "gpt2"),
                               _outputs(model, "gpt2"))

    reg.push(trained_mlp(), "mlp")
    refused = run_cli("pull", "mlp", "--format", "hf", "-o", str(tmp_path / "no"), env=env)
    assert refused.returncode != 0 and "records no transformers config" in refused.stderr
    from click.testing import CliRunner

    from registry.cli import cli

    into_folder = CliRunner().invoke(cli, ["pull", "mlp", "-o", str(tmp_path)])
    assert into_folder.exit_code == 2 and "is a folder" in into_folder.output


def _files_through_a_server(tmp_path: Path, env: dict[str, str] | None = None) -> None:
    from tests.integration.serving import registry_server

    model = _build("gpt2")
    source = _save(model, tmp_path / "src", "sharded")
    _tokenizer(source)
    with registry_server(tmp_path / "server-home", tmp_path, env_extra=env) as service:
        pusher = registry.Registry(service.url, home=tmp_path / "pusher")
        puller = registry.Registry(service.url, home=tmp_path / "puller")
        try:
            mv = pusher.push(source, "gpt2", shard_size="20KB")
            assert mv.metadata["push"]["files_uploaded"] == mv.metadata["push"]["files"] > 2
            files = puller.pull_files("gpt2", tmp_path / "files")
            for a in mv.metadata["attachments"]:
                assert (files / a["name"]).read_bytes() == (source / a["name"]).read_bytes()
            out = puller.save_pretrained("gpt2", tmp_path / "hf")
            torch.testing.assert_close(_outputs(_loads_cleanly(out, "gpt2"), "gpt2"),
                                       _outputs(model, "gpt2"))
            # Unchanged files are not sent again.
            again = pusher.push(source, "gpt2", shard_size="20KB")
            assert again.metadata["push"]["files_uploaded"] == 0
        finally:
            pusher.close()
            puller.close()


def test_files_through_a_server(tmp_path: Path) -> None:
    _files_through_a_server(tmp_path)


@pytest.mark.s3
def test_files_through_a_server_on_s3(s3_endpoint: str, s3_store_url: str,
                                      tmp_path: Path) -> None:
    """On S3 the files travel by presigned URL, straight between the client and the store."""
    from tests.integration.conftest import DUMMY_KEY_ID, DUMMY_SECRET

    _files_through_a_server(tmp_path, {
        "REGISTRY_STORE_URL": s3_store_url, "REGISTRY_S3_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": DUMMY_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull})


@pytest.mark.parametrize("kind", ["gpt2", "t5", "bert"])
def test_tied_weights_of_a_module_push_are_written_as_transformers_writes_them(
        reg: registry.Registry, tmp_path: Path, kind: str) -> None:
    """A module push stores tied weights once (``lm_head.weight`` an alias of the embeddings);
    the directory leaves the aliases out, as transformers' own save_pretrained does."""
    model = _build(kind)
    mv = reg.push(model, kind)
    assert mv.metadata["source"]["tied"]
    assert mv.metadata["architecture"]["class"] == f"transformers:{type(model).__name__}"
    out = reg.save_pretrained(mv.ref, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] \
        == [type(model).__name__]
    torch.testing.assert_close(_outputs(_loads_cleanly(out, kind), kind), _outputs(model, kind))


def test_pull_files_stays_inside_the_destination(reg: registry.Registry, tmp_path: Path) -> None:
    (tmp_path / "labels.json").write_text("[]")
    reg.push(trained_mlp(), "mlp", files={"meta/labels.json": tmp_path / "labels.json"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (dest / "meta").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NormalizationError, match="outside"):
        reg.pull_files("mlp", dest)
    assert list((tmp_path / "elsewhere").iterdir()) == []
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NormalizationError, match="is not a folder"):
        reg.pull_files("mlp", tmp_path / "afile")
