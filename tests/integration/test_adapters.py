"""LoRA adapters as versions over a base version (issue 35): only the adapter is stored, pull
attaches it to the base materialized through the same cache, and the base is protected."""

from __future__ import annotations

import pytest
import torch

from registry import Registry
from registry.errors import (
    AdapterError,
    BaseNotFoundError,
    NotFoundError,
    ReferencedVersionError,
)

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def _base(seed: int = 0) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def _lora(base: torch.nn.Module, targets: list[str] | None = None) -> torch.nn.Module:
    torch.manual_seed(1)
    # init_lora_weights=False: B is random too, so the adapter changes the outputs.
    config = peft.LoraConfig(r=4, target_modules=targets or ["c_attn"], fan_in_fan_out=True,
                             init_lora_weights=False)
    return peft.get_peft_model(base, config).eval()


IDS = torch.tensor([[1, 5, 9, 42, 7, 3]])


def test_an_adapter_round_trips_over_its_named_base(reg: Registry) -> None:
    base_v = reg.push(_base(), "gpt2-tiny")
    tuned = _lora(_base())
    want = tuned(IDS).logits
    mv = reg.push(tuned, "gpt2-tiny-lora", base="gpt2-tiny:v1", tags={"task": "demo"})

    adapter = mv.metadata["adapter"]
    assert adapter["base"] == {"name": "gpt2-tiny", "version": 1, "digest": base_v.digest}
    assert adapter["library"] == "peft" and adapter["config"]["target_modules"] == ["c_attn"]
    lora = peft.get_peft_model_state_dict(tuned)
    lora_bytes = sum(t.numel() * t.element_size() for t in lora.values())
    stored = sum(f["size"] for f in mv.metadata["files"])
    assert set(mv.metadata["tensors"]) == set(lora)  # only the adapter
    assert stored <= 1.05 * lora_bytes + 1024, (stored, lora_bytes)  # + one safetensors header

    pulled = reg.pull(mv.ref, device="cpu")
    assert isinstance(pulled, peft.PeftModel)
    torch.testing.assert_close(pulled(IDS).logits, want)
    merged = reg.pull(mv.ref, device="cpu", merge=True)
    assert type(merged) is transformers.GPT2LMHeadModel
    torch.testing.assert_close(merged(IDS).logits, want, atol=1e-5, rtol=1e-4)
    # The base alone still pulls as it was pushed.
    torch.testing.assert_close(reg.pull("gpt2-tiny:v1", device="cpu")(IDS).logits,
                               _base()(IDS).logits)


def _training(module: torch.nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if m.training]


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("upcast", [True, False], ids=["fp32-adapter", "bf16-adapter"])
@pytest.mark.parametrize("dtype", ["auto", "bfloat16", "float16"])
def test_a_pulled_adapters_dtypes_follow_the_pull_and_it_is_in_eval_mode(
        reg: Registry, dora: bool, upcast: bool, dtype: str) -> None:
    """The adapter's floats follow the rule its base's follow: ``dtype=`` where given, else
    what "auto" makes of the stored dtype on the device (on the CPU, half precision becomes
    float32: a bfloat16 adapter over a bfloat16 base comes back float32 like its base, not
    half of the model in each). The values are the stored ones, cast; DoRA's, which PEFT
    loads, as PEFT's own load of those tensors over the pulled base gives them. Every module of
    what pull returns is in eval mode, PEFT's layers and wrappers included."""
    reg.push(_base().to(torch.bfloat16), "gpt2-bf16")
    torch.manual_seed(1)
    config = peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True,
                             init_lora_weights=False, use_dora=dora)
    # Over a bfloat16 base, PEFT upcasts the adapter to float32 at training unless told not to.
    tuned = peft.get_peft_model(_base().to(torch.bfloat16), config,
                                autocast_adapter_dtype=upcast).eval()
    stored = peft.get_peft_model_state_dict(tuned)
    assert {t.dtype for t in stored.values()} == {torch.float32 if upcast else torch.bfloat16}
    mv = reg.push(tuned, "gpt2-bf16-lora", base="gpt2-bf16:v1")
    expected = torch.float32 if dtype == "auto" else getattr(torch, dtype)
    want = {k: t.to(expected) for k, t in stored.items()}
    if dora:
        reference = peft.get_peft_model(reg.pull("gpt2-bf16:v1", device="cpu", dtype=dtype),
                                        config, low_cpu_mem_usage=True)
        peft.set_peft_model_state_dict(reference, want, low_cpu_mem_usage=True)
        want = peft.get_peft_model_state_dict(reference)

    pulled = reg.pull(mv.ref, device="cpu", dtype=dtype)
    assert _training(pulled) == []
    assert {p.dtype for n, p in pulled.named_parameters() if ".lora_" not in n} == {expected}
    got = peft.get_peft_model_state_dict(pulled)
    assert set(got) == set(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype == expected, key
        torch.testing.assert_close(got[key], tensor, rtol=0, atol=0)
    pulled(IDS)  # one dtype through the whole model
    merged = reg.pull(mv.ref, device="cpu", dtype=dtype, merge=True)
    assert _training(merged) == []
    assert {p.dtype for p in merged.parameters()} == {expected}


def test_the_base_is_found_by_its_weights(reg: Registry) -> None:
    reg.push(_base(seed=7), "other")
    base_v = reg.push(_base(), "gpt2-tiny")
    reg.push(_base(seed=8), "gpt2-tiny")  # a newer version with other weights
    mv = reg.push(_lora(_base()), "lora")
    assert mv.metadata["adapter"]["base"]["digest"] == base_v.digest
    assert mv.metadata["adapter"]["base"]["version"] == 1


def _int8_llama(seed: int = 0) -> torch.nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=100, bos_token_id=0, eos_token_id=0)).eval()
    quantize_(model, Int8WeightOnlyConfig())
    return model


def test_an_adapter_over_a_quantized_base(reg: Registry, tmp_path) -> None:
    """LoRA trained over a torchao int8 base, as QLoRA trains over a quantized one: the base is
    found by its stored (quantized) weights, the pull attaches the adapter to the quantized
    base, and merging, which would quantize the merged weights again, asks for floats first."""
    pytest.importorskip("torchao")
    reg.push(_int8_llama(seed=5), "llama-int8")
    base_v = reg.push(_int8_llama(), "llama-int8")
    torch.manual_seed(1)
    tuned = peft.get_peft_model(_int8_llama(), peft.LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).eval()
    layer = tuned.base_model.model.model.layers[0].self_attn.q_proj
    assert type(layer.base_layer.weight).__name__ == "Int8Tensor"  # LoRA over int8 Linears
    with torch.no_grad():
        want = tuned(IDS).logits
    mv = reg.push(tuned, "llama-int8-chat")  # no base=: found by the weights' digest
    assert mv.metadata["adapter"]["base"] == {"name": "llama-int8", "version": 2,
                                              "digest": base_v.digest}
    assert all("lora_" in key for key in mv.metadata["tensors"])

    pulled = reg.pull(mv.ref, device="cpu")
    assert isinstance(pulled, peft.PeftModel)
    layer = pulled.base_model.model.model.layers[0].self_attn.q_proj
    assert type(layer.base_layer.weight).__name__ == "Int8Tensor"
    with torch.no_grad():
        torch.testing.assert_close(pulled(IDS).logits, want)

    with pytest.raises(AdapterError, match=r"llama-int8:v2 is quantized.*dtype='float32'"):
        reg.pull(mv.ref, device="cpu", merge=True)
    merged = reg.pull(mv.ref, device="cpu", dtype="float32", merge=True)
    assert type(merged) is transformers.LlamaForCausalLM
    assert type(merged.model.layers[0].self_attn.q_proj.weight) is torch.nn.Parameter
    with torch.no_grad():
        torch.testing.assert_close(merged(IDS).logits, want, atol=1e-5, rtol=1e-4)
    # A merged from_pretrained directory would quantize the merged weights again: refused.
    with pytest.raises(AdapterError, match=r"llama-int8:v2 is quantized.*dtype='float32'"):
        reg.save_pretrained(mv.ref, tmp_path / "merged", merge=True)
    assert not (tmp_path / "merged").exists()


def test_an_adapter_without_its_base_in_the_registry_is_refused(reg: Registry) -> None:
    reg.push(_base(seed=3), "gpt2-tiny")
    with pytest.raises(BaseNotFoundError, match="push the base model first"):
        reg.push(_lora(_base()), "lora")
    assert reg.list_models() == ["gpt2-tiny"]


def test_an_adapter_whose_targets_its_named_base_lacks_is_refused(reg: Registry) -> None:
    reg.push(torch.nn.Sequential(torch.nn.Linear(4, 4)), "mlp")
    with pytest.raises(AdapterError, match="'c_attn'.*base does not have"):
        reg.push(_lora(_base()), "lora", base="mlp:v1")


def test_ls_and_delete_know_the_adapters_of_a_base(reg: Registry) -> None:
    reg.push(_base(), "gpt2-tiny")
    mv = reg.push(_lora(_base()), "lora", base="gpt2-tiny:v1")
    assert [a.ref for a in reg.list_adapters("gpt2-tiny:v1")] == [mv.ref]
    assert [a.ref for a in reg.list_adapters("gpt2-tiny")] == [mv.ref]  # any version
    assert reg.list_adapters("lora") == []
    with pytest.raises(ReferencedVersionError, match="lora:v1.*force=True"):
        reg.delete_version("gpt2-tiny:v1")
    assert reg.show("gpt2-tiny:v1")
    reg.delete_version("gpt2-tiny:v1", force=True)
    with pytest.raises(BaseNotFoundError, match="push that base model again"):
        reg.pull(mv.ref, device="cpu")
    # The same weights pushed again are the base again: the adapter names them by digest.
    reg.push(_base(), "gpt2-tiny")
    assert isinstance(reg.pull(mv.ref, device="cpu"), peft.PeftModel)
    # While another version holds the same weights, deleting one of them leaves the base.
    reg.push(_base(), "gpt2-tiny")
    reg.delete_version("gpt2-tiny:v2")
    with pytest.raises(ReferencedVersionError):
        reg.delete_version("gpt2-tiny:v3")


def test_the_servers_delete_route_keeps_the_base_of_adapters(reg: Registry, home) -> None:
    """The guard is the server's too: a DELETE without force answers 409 naming the adapters,
    and the remote client raises the same ReferencedVersionError."""
    from fastapi.testclient import TestClient

    from registry.settings import Settings
    from server.app import create_app

    reg.push(_base(), "gpt2-tiny")
    reg.push(_lora(_base()), "lora", base="gpt2-tiny:v1")
    app = create_app(Settings.from_env(home=home))
    with TestClient(app) as client:
        answer = client.delete("/api/v1/models/gpt2-tiny/versions/1")
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert error["code"] == "version_referenced"
        assert "lora:v1" in error["message"] and "force" in error["message"]
        assert reg.show("gpt2-tiny:v1")
        assert client.delete("/api/v1/models/gpt2-tiny/versions/1",
                             params={"force": "true"}).status_code == 200
    with pytest.raises(NotFoundError):
        reg.show("gpt2-tiny:v1")


def test_the_base_is_pulled_through_the_same_cache(reg: Registry, monkeypatch) -> None:
    reg.push(_base(), "gpt2-tiny")
    mv = reg.push(_lora(_base()), "lora", base="gpt2-tiny:v1")
    fetched: list[str] = []
    original = type(reg.backend).open_blob

    def spy(self, digest: str, size: int):  # type: ignore[no-untyped-def]
        fetched.append(digest)
        return original(self, digest, size)

    monkeypatch.setattr(type(reg.backend), "open_blob", spy)
    reg.pull("gpt2-tiny:v1", device="cpu")
    base_blobs = list(fetched)
    fetched.clear()
    reg.pull(mv.ref, device="cpu")
    assert fetched[:len(base_blobs)] == base_blobs  # the base's blobs, by digest, once each
    assert len(fetched) == len(base_blobs) + 1  # plus the adapter's one shard


def test_the_cli_shows_the_base_lists_adapters_and_needs_force(reg: Registry, home) -> None:
    from tests.helpers import clean_env, run_cli

    reg.push(_base(), "gpt2-tiny")
    reg.push(_lora(_base()), "lora", base="gpt2-tiny:v1")
    env = clean_env(home)
    shown = run_cli("show", "lora:v1", env=env, check=True).stdout
    assert "over gpt2-tiny:v1" in shown and "LORA r=4 on c_attn" in shown
    # Pulled over its base, not "unknown (pull with model=)" nor a bare state dict.
    assert "architecture  its base's (gpt2-tiny:v1)" in shown
    assert "input         PEFT model (its adapter only)" in shown
    listing = run_cli("ls", "gpt2-tiny", env=env, check=True).stdout
    assert "adapters:" in listing and "lora:v1" in listing.split("adapters:")[1]
    refused = run_cli("rm", "gpt2-tiny:v1", env=env)
    assert refused.returncode != 0 and "lora:v1" in refused.stderr and "--force" in refused.stderr
    run_cli("rm", "gpt2-tiny:v1", "--force", env=env, check=True)


def test_the_cli_writes_an_adapter_merged_into_its_base(reg: Registry, home, tmp_path) -> None:
    """`registry pull ADAPTER --merge -o FILE`: the base's weights with the adapter merged in,
    what pull(merge=True) gives, loadable into the base model; without --merge, the adapter's
    own tensors."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from tests.helpers import clean_env, run_cli

    reg.push(_base(), "gpt2-tiny")
    tuned = _lora(_base())
    with torch.no_grad():
        want = tuned(IDS).logits
    mv = reg.push(tuned, "lora", base="gpt2-tiny:v1")
    env = clean_env(home)
    out = tmp_path / "merged.safetensors"
    run_cli("pull", "lora:v1", "--merge", "-o", str(out), env=env, check=True)
    merged = load_file(out)
    expected = reg.pull(mv.ref, device="cpu", merge=True).state_dict()
    assert list(merged) == list(expected)
    for key, tensor in expected.items():
        torch.testing.assert_close(merged[key], tensor, rtol=0, atol=0)
    with safe_open(out, "pt") as fh:
        assert fh.metadata()["registry.merged_into"] == "gpt2-tiny:v1"
    model = _base(seed=7)
    model.load_state_dict(merged)
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, want, atol=1e-5, rtol=1e-4)

    adapter_only = tmp_path / "adapter.safetensors"
    run_cli("pull", "lora:v1", "-o", str(adapter_only), env=env, check=True)
    assert set(load_file(adapter_only)) == set(mv.metadata["tensors"])
    refused = run_cli("pull", "gpt2-tiny:v1", "--merge", "-o", str(tmp_path / "x.safetensors"),
                      env=env)
    assert refused.returncode != 0 and "not an adapter version" in refused.stderr
    refused = run_cli("pull", "lora:v1", "--merge", "--files", "-o", str(tmp_path / "d"),
                      env=env)
    assert refused.returncode != 0 and "--files" in refused.stderr
    folder = tmp_path / "merged"
    run_cli("pull", "lora:v1", "--merge", "--format", "hf", "-o", str(folder), env=env,
            check=True)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, want, atol=1e-5, rtol=1e-4)


def test_save_pretrained_merges_an_adapter_into_its_bases_directory(reg: Registry,
                                                                    tmp_path) -> None:
    """save_pretrained(adapter, merge=True): the base's from_pretrained directory (its config,
    its shards, its attached files) with the adapter merged into the weights in the base's
    stored dtype (or dtype=), as pull(merge=True) merges them; transformers loads it as a plain
    model."""
    from safetensors.torch import load_file

    base = _base().to(torch.bfloat16)
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    (base_dir / "tokenizer_config.json").write_text('{"model_max_length": 64}\n')
    reg.push(str(base_dir), "gpt2-bf16")
    torch.manual_seed(1)
    tuned = peft.get_peft_model(_base().to(torch.bfloat16), peft.LoraConfig(
        r=4, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False)).eval()
    mv = reg.push(tuned, "lora", base="gpt2-bf16:v1")

    out = reg.save_pretrained(mv.ref, tmp_path / "merged", merge=True)
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= \
        {p.name for p in out.iterdir()}
    written = load_file(out / "model.safetensors")
    assert {t.dtype for t in written.values()} == {torch.bfloat16}  # as the base stores them
    merged = reg.pull(mv.ref, device="cpu", dtype="bfloat16", merge=True).state_dict()
    for key, tensor in written.items():
        torch.testing.assert_close(tensor, merged[key], rtol=0, atol=0)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    with torch.no_grad():
        want = tuned.merge_and_unload()(IDS).logits.float()
        torch.testing.assert_close(loaded(IDS).logits.float(), want, atol=0.05, rtol=0.05)
    as_float = reg.save_pretrained(mv.ref, tmp_path / "float32", "float32", merge=True)
    written = load_file(as_float / "model.safetensors")
    merged = reg.pull(mv.ref, device="cpu", dtype="float32", merge=True).state_dict()
    assert {t.dtype for t in written.values()} == {torch.float32}
    for key, tensor in written.items():
        torch.testing.assert_close(tensor, merged[key], rtol=0, atol=0)

    with pytest.raises(AdapterError, match=r"gpt2-bf16:v1 is not an adapter version"):
        reg.save_pretrained("gpt2-bf16:v1", tmp_path / "no", merge=True)


def test_save_pretrained_of_an_adapter_is_a_peft_adapter_directory(reg: Registry,
                                                                   tmp_path) -> None:
    reg.push(_base(), "gpt2-tiny")
    tuned = _lora(_base())
    mv = reg.push(tuned, "lora", base="gpt2-tiny:v1")
    out = reg.save_pretrained(mv.ref, tmp_path / "adapter")
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json",
                                                     "adapter_model.safetensors"]
    loaded = peft.PeftModel.from_pretrained(_base(), out).eval()
    torch.testing.assert_close(loaded(IDS).logits, tuned(IDS).logits)

    # dtype= casts the adapter's floats, as it casts a base's (`pull --format hf --dtype`).
    from safetensors.torch import load_file

    half = reg.save_pretrained(mv.ref, tmp_path / "half", dtype="bfloat16")
    written = load_file(half / "adapter_model.safetensors")
    lora = peft.get_peft_model_state_dict(tuned)
    assert {t.dtype for t in written.values()} == {torch.bfloat16}
    for key, tensor in lora.items():
        torch.testing.assert_close(written[key], tensor.to(torch.bfloat16), rtol=0, atol=0)
    loaded = peft.PeftModel.from_pretrained(_base().to(torch.bfloat16), half,
                                            autocast_adapter_dtype=False)
    assert {p.dtype for n, p in loaded.named_parameters() if ".lora_" in n} == {torch.bfloat16}


def test_each_lora_layer_lands_on_its_base_layers_device(reg: Registry) -> None:
    """A base spread over devices by a device map: the adapter's tensors, read onto the first
    device, are assigned on the device of the layer each adapts (as PEFT's own load places
    them). ``meta`` stands in for a second device on this GPU-less machine."""
    from safetensors.torch import load_file

    from registry.formats.lora import attach
    from registry.refs import parse

    reg.push(_base(), "gpt2-tiny")
    mv = reg.push(_lora(_base()), "gpt2-tiny-lora", base="gpt2-tiny:v1")
    record = reg.backend.resolve(parse(mv.ref))
    tensors: dict[str, torch.Tensor] = {}
    for f in record.manifest["files"]:
        tensors.update(load_file(reg.backend.blob_path(f["digest"], f["size"])))
    spread = _base()
    spread.transformer.h[1].attn.c_attn.to("meta")
    attached = attach(spread, tensors, record.manifest["adapter"], mv.ref, merge=False)
    devices = {name: p.device.type for name, p in attached.named_parameters()
               if ".lora_" in name}
    assert devices and all((d == "meta") == (".h.1." in n) for n, d in devices.items()), devices


def test_the_delete_guard_does_not_name_adapters_a_limited_token_cannot_see(
        reg: Registry, home, tmp_path) -> None:
    """Through a token limited to team-a-*, the 409 counts an adapter of another team over the
    base but does not name it; the guard still holds."""
    from fastapi.testclient import TestClient

    from registry.settings import Settings
    from server.app import create_app
    from server.auth import AuthFile, AuthPolicy

    reg.push(_base(), "team-a-base")
    reg.push(_lora(_base()), "team-a-lora", base="team-a-base:v1")
    reg.push(_lora(_base()), "team-b-lora", base="team-a-base:v1")
    tokens = AuthFile(tmp_path / "auth.json")
    limited = tokens.create("team-a", ["admin"], ("team-a-*",))
    boss = tokens.create("boss", ["admin"])
    app = create_app(Settings.from_env(home=home), auth=AuthPolicy("tokens", tokens))
    with TestClient(app) as client:
        for token, named in ((limited, "team-a-lora:v1 and 1 more"),
                             (boss, "team-a-lora:v1, team-b-lora:v1")):
            answer = client.delete("/api/v1/models/team-a-base/versions/1",
                                   headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 409, answer.text
            message = answer.json()["error"]["message"]
            assert "base of 2 adapter version(s)" in message and named in message, message
            assert ("team-b" in message) == (token == boss)
    assert reg.show("team-a-base:v1")
