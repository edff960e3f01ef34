"""The Hub door (issue 50): ``HF_ENDPOINT=http://HOST:PORT/hf`` and the real clients.

A `registry serve` with an auth file serves a tiny GPT-2 (pushed from its save_pretrained
directory with a tokenizer built offline, signed), a plain module and a dynamically quantized
one. The clients run in subprocesses (huggingface_hub reads HF_ENDPOINT at import) with a cold
cache of their own: ``snapshot_download``, ``hf_hub_download``, ``HfApi().model_info`` /
``list_repo_files``, the ``hf download`` CLI, ``AutoModelForCausalLM`` / ``AutoTokenizer``
``from_pretrained``, and the download vLLM makes. What they get is compared with
``save_pretrained``'s directory and ``registry.pull``'s outputs.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

import registry
from registry.doors.hf import commit_of
from registry.refs import parse
from server.auth import AuthFile
from tests.helpers import clean_env, run_cli, trained_mlp
from tests.integration.serving import Service, start_registry_server
from tests.keys import ec_key_pair

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")
pytestmark = pytest.mark.slow

VOCAB = 100


@dataclass
class Door:
    service: Service
    home: Path
    root: Path
    token: str
    reg: registry.Registry
    limited: str  # a read token limited to models matching tiny-*

    @property
    def endpoint(self) -> str:
        return f"{self.service.url}/hf"

    def env(self, cache: Path, *, token: str | None = "") -> dict[str, str]:
        env = clean_env(self.root / "client-home", HF_ENDPOINT=self.endpoint,
                        HF_HOME=str(cache), HF_HUB_DISABLE_TELEMETRY="1",
                        HF_HUB_DISABLE_XET="1", TRANSFORMERS_VERBOSITY="error")
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("TRANSFORMERS_OFFLINE", None)
        env.pop("HF_TOKEN", None)
        if token is not None:
            env["HF_TOKEN"] = token or self.token
        return env

    def client(self, script: str, cache: Path, *, token: str | None = "") -> Any:
        """Run ``script`` (which prints one JSON line last) in a fresh interpreter."""
        result = subprocess.run([sys.executable, "-c", script], env=self.env(cache, token=token),
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        return json.loads(result.stdout.strip().splitlines()[-1])


def _tokenizer(directory: Path) -> None:
    """A word-level tokenizer built offline, saved as transformers saves a real one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i + 2 for i in range(20)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                         pad_token="[PAD]").save_pretrained(directory)


def _gpt2() -> Any:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=1,
        eos_token_id=2)).eval()


class _Float(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    root = tmp_path_factory.mktemp("hub-door")
    home = root / "home"
    reg = registry.Registry(home=home)
    source = root / "gpt2"
    _gpt2().save_pretrained(source)
    _tokenizer(source)
    reg.push(source, "tiny-gpt2")  # v1: one shard
    keys = ec_key_pair(root / "keys")
    reg.push(source, "tiny-gpt2", shard_size="20KB", aliases=["production"],  # v2: sharded
             sign_key=keys.private)
    (root / "notes.txt").write_text("a plain module's notes\n")
    reg.push(trained_mlp(), "tinynet", files={"notes.txt": str(root / "notes.txt")})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(_Float(), {nn.Linear},
                                                           dtype=torch.qint8)
    reg.push(quantized, "qmlp")
    auth_file = root / "auth.json"
    token = AuthFile(auth_file).create("reader", ["read"])
    limited = AuthFile(auth_file).create("team", ["read"], models=("tiny-*",))
    service = start_registry_server(home, root, env_extra={"REGISTRY_AUTH_FILE": str(auth_file)})
    try:
        yield Door(service, home, root, token, reg, limited)
    finally:
        service.stop()
        reg.close()


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file() and ".cache" not in p.parts}


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.arange(14).reshape(2, 7) % VOCAB).logits


_CLIENT = """
import json, sys, torch, transformers
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
out = {}
out["snapshot"] = snapshot_download("tiny-gpt2", revision="production")
out["again"] = snapshot_download("tiny-gpt2", revision="production")
info = HfApi().model_info("tiny-gpt2", revision="production")
out["sha"] = info.sha
out["siblings"] = sorted(s.rfilename for s in info.siblings)
out["main_sha"] = HfApi().model_info("tiny-gpt2").sha
out["v1_files"] = sorted(HfApi().list_repo_files("tiny-gpt2", revision="v1"))
out["config"] = hf_hub_download("tiny-gpt2", "config.json", revision="v1")
model = transformers.AutoModelForCausalLM.from_pretrained("tiny-gpt2", revision="production")
tok = transformers.AutoTokenizer.from_pretrained("tiny-gpt2", revision="production")
out["ids"] = tok("w1 w3")["input_ids"]
with torch.no_grad():
    logits = model(input_ids=torch.arange(14).reshape(2, 7) % 100).logits
torch.save(logits, sys.argv[0] if False else "{logits}")
print(json.dumps(out))
"""


def test_the_real_clients_pull_a_transformers_version(door: Door, tmp_path: Path) -> None:
    logits_file = tmp_path / "logits.pt"
    got = door.client(_CLIENT.replace("{logits}", str(logits_file)), tmp_path / "hf")
    # The snapshot holds exactly what save_pretrained writes, byte for byte (model.sig too).
    written = door.reg.save_pretrained("tiny-gpt2@production", tmp_path / "saved")
    snapshot = Path(got["snapshot"])
    assert _files(snapshot) == _files(written)
    assert {"model.safetensors.index.json", "model.sig", "tokenizer.json",
            "config.json", "README.md"} <= set(_files(snapshot))
    # The model card is served as README.md (issue 51), the one save_pretrained writes.
    card = _files(snapshot)["README.md"].decode()
    assert card.startswith("---\nlibrary_name: \"transformers\"")
    assert door.reg.show("tiny-gpt2@production").digest in card
    assert got["again"] == got["snapshot"]
    assert got["siblings"] == sorted(_files(written))
    # The commit is the version's, stable: computed here from its manifest alone.
    record = door.reg.backend.resolve(parse("tiny-gpt2@production"))
    assert got["sha"] == commit_of(record.manifest, None) == got["main_sha"]
    assert Path(got["snapshot"]).name == got["sha"]
    v1 = door.reg.save_pretrained("tiny-gpt2:v1", tmp_path / "v1")
    assert got["v1_files"] == sorted(_files(v1))
    assert Path(got["config"]).read_bytes() == (v1 / "config.json").read_bytes()
    # transformers loaded what the registry pulls, computing the same.
    assert got["ids"] == [3, 5]
    pulled = door.reg.pull("tiny-gpt2@production", device="cpu").eval()
    torch.testing.assert_close(torch.load(logits_file), _logits(pulled))


def test_the_hf_cli_downloads_a_version(door: Door, tmp_path: Path) -> None:
    hf = Path(sys.executable).with_name("hf")
    result = subprocess.run([str(hf), "download", "tiny-gpt2", "--revision", "v1",
                             "--local-dir", str(tmp_path / "out")],
                            env=door.env(tmp_path / "hf"), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _files(tmp_path / "out") == _files(
        door.reg.save_pretrained("tiny-gpt2:v1", tmp_path / "saved"))


def test_the_download_vllm_makes(door: Door, tmp_path: Path) -> None:
    # vLLM's loader: snapshot_download with allow_patterns for the weights, the configs and
    # the tokenizer's files (vllm/model_executor/model_loader/weight_utils.py).
    got = door.client("""
import json
from huggingface_hub import snapshot_download
path = snapshot_download("tiny-gpt2", revision="production",
                         allow_patterns=["*.safetensors", "*.json", "tokenizer*", "*.txt"])
print(json.dumps(path))
""", tmp_path / "hf")
    written = _files(door.reg.save_pretrained("tiny-gpt2@production", tmp_path / "saved"))
    assert _files(Path(got)) == {k: v for k, v in written.items()
                                 if k not in ("model.sig", "README.md")}


def test_a_plain_module_lists_its_weights_and_files(door: Door, tmp_path: Path) -> None:
    got = door.client("""
import json
from huggingface_hub import snapshot_download
print(json.dumps(snapshot_download("tinynet")))
""", tmp_path / "hf")
    files = _files(Path(got))
    assert sorted(files) == ["README.md", "model.safetensors", "notes.txt"]  # its card too
    record = door.reg.backend.resolve(parse("tinynet"))
    shard = record.manifest["files"][0]
    assert "sha256:" + hashlib.sha256(files["model.safetensors"]).hexdigest() == shard["digest"]
    pulled = door.reg.pull_state_dict("tinynet", device="cpu")
    from safetensors.torch import load

    loaded = load(files["model.safetensors"])
    assert sorted(loaded) == sorted(pulled)
    for key, value in pulled.items():
        assert torch.equal(loaded[key], value)
    # Its dtype variant: the floats cast (BatchNorm's integer counter kept), the files too.
    half = door.client("""
import json
from huggingface_hub import snapshot_download
print(json.dumps(snapshot_download("tinynet", revision="v1+float16")))
""", tmp_path / "hf16")
    cast = _files(Path(half))
    assert sorted(cast) == ["model.safetensors", "notes.txt"]
    assert cast["notes.txt"] == files["notes.txt"]
    for key, value in load(cast["model.safetensors"]).items():
        expected = pulled[key].half() if pulled[key].is_floating_point() else pulled[key]
        assert value.dtype == expected.dtype and torch.equal(value, expected), key


def test_a_dtype_variant_is_a_revision_of_its_own(door: Door, tmp_path: Path) -> None:
    logits = tmp_path / "logits.pt"
    got = door.client(f"""
import json, torch, transformers
from huggingface_hub import HfApi, snapshot_download
out = {{"path": snapshot_download("tiny-gpt2", revision="production+float16"),
        "sha": HfApi().model_info("tiny-gpt2", revision="v2+float16").sha,
        "bf16": HfApi().model_info("tiny-gpt2", revision="production+bfloat16").sha}}
model = transformers.AutoModelForCausalLM.from_pretrained("tiny-gpt2",
                                                          revision="production+bfloat16")
out["dtype"] = str(model.dtype)
with torch.no_grad():
    torch.save(model(input_ids=torch.arange(14).reshape(2, 7) % 100).logits, {str(logits)!r})
print(json.dumps(out))
""", tmp_path / "hf")
    record = door.reg.backend.resolve(parse("tiny-gpt2@production"))
    assert got["sha"] == commit_of(record.manifest, "float16") != commit_of(record.manifest,
                                                                            None)
    assert got["bf16"] == commit_of(record.manifest, "bfloat16")
    # The variant is save_pretrained's directory in that dtype (signed bytes are not: no sig).
    cast = _files(door.reg.save_pretrained("tiny-gpt2@production", tmp_path / "saved",
                                           dtype="float16"))
    assert _files(Path(got["path"])) == cast
    assert json.loads(cast["config.json"])["dtype"] == "float16"
    # Made once: the derived folder on the server is reused by the next request.
    derived = door.home / "cache" / "hub" / got["sha"]
    listing = derived / ".registry-hub-files.json"
    stamp = listing.stat().st_mtime_ns
    url = f"{door.endpoint}/tiny-gpt2/resolve/production%2Bfloat16/model.safetensors.index.json"
    assert httpx.get(url, headers={"authorization": f"Bearer {door.token}"}).status_code == 200
    assert listing.stat().st_mtime_ns == stamp
    assert got["dtype"] == "torch.bfloat16"
    pulled = door.reg.pull("tiny-gpt2@production", device="cpu", dtype="bfloat16").eval()
    torch.testing.assert_close(torch.load(logits), _logits(pulled))


def test_a_quantized_version_has_no_dtype_variant(door: Door) -> None:
    headers = {"authorization": f"Bearer {door.token}"}
    answer = httpx.get(f"{door.endpoint}/api/models/qmlp/revision/main%2Bfloat16",
                       headers=headers)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "qmlp:v1 is quantized" in message and "without +float16" in message
    assert httpx.get(f"{door.endpoint}/api/models/qmlp/revision/main",
                     headers=headers).status_code == 200


def test_unknown_repos_revisions_and_files_raise_the_hub_errors(door: Door,
                                                                  tmp_path: Path) -> None:
    got = door.client("""
import json
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (EntryNotFoundError, RepositoryNotFoundError,
                                    RevisionNotFoundError)
out = {}
for what, call in {
    "repo": lambda: HfApi().model_info("no-such-model"),
    "revision": lambda: HfApi().model_info("tiny-gpt2", revision="v99"),
    "alias": lambda: hf_hub_download("tiny-gpt2", "config.json", revision="staging"),
    "file": lambda: hf_hub_download("tiny-gpt2", "pytorch_model.bin", revision="v1"),
}.items():
    try:
        call()
        out[what] = None
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as exc:
        out[what] = type(exc).__name__
print(json.dumps(out))
""", tmp_path / "hf")
    assert got == {"repo": "RepositoryNotFoundError", "revision": "RevisionNotFoundError",
                   "alias": "RevisionNotFoundError", "file": "RemoteEntryNotFoundError"}


def test_no_token_no_read(door: Door, tmp_path: Path) -> None:
    got = door.client("""
import json
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError
try:
    snapshot_download("tiny-gpt2")
    print(json.dumps("downloaded"))
except HfHubHTTPError as exc:
    print(json.dumps([exc.response.status_code, str(exc)]))
""", tmp_path / "hf", token=None)
    assert got[0] == 401 and "missing bearer token" in got[1]
    answer = httpx.head(f"{door.endpoint}/tiny-gpt2/resolve/main/config.json")
    assert answer.status_code == 401
    bad = httpx.head(f"{door.endpoint}/tiny-gpt2/resolve/main/config.json",
                     headers={"authorization": "Bearer reg_not-a-token"})
    assert bad.status_code == 401


def test_headers_ranges_and_revisions_by_version_digest_and_commit(door: Door) -> None:
    headers = {"authorization": f"Bearer {door.token}"}
    record = door.reg.backend.resolve(parse("tiny-gpt2:v1"))
    commit = commit_of(record.manifest, None)
    blob = door.reg.backend.blob_path(record.manifest["files"][0]["digest"],
                                      record.manifest["files"][0]["size"]).read_bytes()
    digest = record.digest.removeprefix("sha256:")[:16]
    for revision in ("v1", "1", commit, f"sha256:{digest}", digest):
        url = f"{door.endpoint}/tiny-gpt2/resolve/{revision}/model.safetensors"
        head = httpx.head(url, headers=headers)
        assert head.status_code == 200, (revision, head.text)
        assert head.headers["x-repo-commit"] == commit
        assert head.headers["etag"] == f'"{hashlib.sha256(blob).hexdigest()}"'
        assert head.headers["x-linked-etag"] == head.headers["etag"]
        assert int(head.headers["x-linked-size"]) == len(blob)
        assert int(head.headers["content-length"]) == len(blob)
    url = f"{door.endpoint}/tiny-gpt2/resolve/v1/model.safetensors"
    part = httpx.get(url, headers={**headers, "range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == blob[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(blob)}"
    tail = httpx.get(url, headers={**headers, "range": "bytes=-10"})
    assert tail.status_code == 206 and tail.content == blob[-10:]
    config = httpx.get(f"{door.endpoint}/tiny-gpt2/resolve/v1/config.json",
                       headers={**headers, "range": "bytes=0-9"})
    assert config.status_code == 206 and config.content == httpx.get(
        f"{door.endpoint}/tiny-gpt2/resolve/v1/config.json", headers=headers).content[:10]
    past = httpx.get(url, headers={**headers, "range": f"bytes={len(blob)}-"})
    assert past.status_code == 416
    whole = httpx.get(url, headers={**headers, "range": "bytes=0-1,5-6"})  # several: all of it
    assert whole.status_code == 200 and whole.content == blob


def test_registry_materialize_writes_a_uri_atomically(door: Door, tmp_path: Path) -> None:
    env = clean_env(door.home)
    dest = tmp_path / "model"
    result = run_cli("materialize", "registry://tiny-gpt2@production", str(dest), env=env,
                     check=True)
    assert _files(dest) == _files(door.reg.save_pretrained("tiny-gpt2@production",
                                                          tmp_path / "saved"))
    assert "model.safetensors.index.json" in result.stdout and str(dest) in result.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left
    # Through a server (REGISTRY_URI), in safetensors: the weights alone.
    remote = clean_env(tmp_path / "empty-home", REGISTRY_URI=door.service.url,
                       REGISTRY_TOKEN=door.token)
    single = tmp_path / "weights"
    run_cli("materialize", "registry://tinynet:v1", str(single), "--format", "safetensors",
            env=remote, check=True)
    assert sorted(p.name for p in single.iterdir()) == ["model.safetensors"]
    # An existing empty folder (a volume KServe mounted at /mnt/models) is filled in place.
    mounted = tmp_path / "mnt-models"
    mounted.mkdir()
    run_cli("materialize", "registry://tinynet", str(mounted), "--format", "safetensors",
            env=remote, check=True)
    assert sorted(p.name for p in mounted.iterdir()) == ["model.safetensors"]
    assert (mounted / "model.safetensors").read_bytes() == \
        (single / "model.safetensors").read_bytes()
    # A destination that holds anything is refused, and left as it was.
    again = run_cli("materialize", "registry://tinynet", str(single), env=remote)
    assert again.returncode != 0 and "exists" in again.stderr
    bad = run_cli("materialize", "hf://tinynet", str(tmp_path / "x"), env=remote)
    assert bad.returncode == 2 and "registry://NAME" in bad.stderr


def test_a_model_the_token_cannot_see_is_a_missing_repo(door: Door, tmp_path: Path) -> None:
    got = door.client("""
import json
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import RepositoryNotFoundError
out = {"seen": sorted(HfApi().list_repo_files("tiny-gpt2"))}
try:
    snapshot_download("tinynet")
    out["hidden"] = "downloaded"
except RepositoryNotFoundError:
    out["hidden"] = "RepositoryNotFoundError"
print(json.dumps(out))
""", tmp_path / "hf", token=door.limited)
    assert "config.json" in got["seen"] and got["hidden"] == "RepositoryNotFoundError"
    headers = {"authorization": f"Bearer {door.limited}"}
    for path in ("api/models/{}", "api/models/{}/revision/v1", "api/models/{}/tree/main",
                 "{}/resolve/main/model.safetensors"):
        hidden = httpx.get(f"{door.endpoint}/{path.format('tinynet')}", headers=headers)
        missing = httpx.get(f"{door.endpoint}/{path.format('tinynot')}", headers=headers)
        assert hidden.status_code == missing.status_code == 404, path
        assert hidden.headers["x-error-code"] == missing.headers["x-error-code"] == "RepoNotFound"
        assert hidden.text.replace("tinynet", "X") == missing.text.replace("tinynot", "X")
        assert hidden.headers["x-error-message"].replace("tinynet", "X") == \
            missing.headers["x-error-message"].replace("tinynot", "X")
    # The same model for a token over every model.
    assert httpx.get(f"{door.endpoint}/api/models/tinynet",
                     headers={"authorization": f"Bearer {door.token}"}).status_code == 200


def test_a_torchao_version_is_derived_once_and_loads_quantized(door: Door,
                                                                tmp_path: Path) -> None:
    torchao = pytest.importorskip("torchao.quantization")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2,
                                      vocab_size=VOCAB)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "float")
    model = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "float", dtype=torch.float32,
        quantization_config=transformers.TorchAoConfig(torchao.Int8WeightOnlyConfig()))
    door.reg.push(model, "llama-int8")
    logits = tmp_path / "logits.pt"
    got = door.client(f"""
import json, torch, transformers
from huggingface_hub import HfApi
model = transformers.AutoModelForCausalLM.from_pretrained("llama-int8")
with torch.no_grad():
    torch.save(model(input_ids=torch.arange(8).reshape(1, 8)).logits, {str(logits)!r})
print(json.dumps({{"sha": HfApi().model_info("llama-int8").sha,
                  "weight": type(model.model.layers[0].self_attn.q_proj.weight).__name__}}))
""", tmp_path / "hf")
    assert got["weight"] == "Int8Tensor"
    # Derived once into the server's cache by save_pretrained's writer: the same files.
    derived = door.home / "cache" / "hub" / got["sha"]
    written = _files(door.reg.save_pretrained("llama-int8", tmp_path / "saved"))
    assert {k: v for k, v in _files(derived).items() if not k.startswith(".")} == written
    pulled = door.reg.pull("llama-int8", device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(torch.load(logits, weights_only=False),
                                   pulled(torch.arange(8).reshape(1, 8)).logits)


def test_derived_revisions_are_listed_and_pruned_beside_readers(door: Door) -> None:
    from registry.doors import hubcache

    headers = {"authorization": f"Bearer {door.token}"}
    url = f"{door.endpoint}/tinynet/resolve/v1%2Bfloat16/model.safetensors"
    first = httpx.get(url, headers=headers)
    assert first.status_code == 200
    env = clean_env(door.home)
    listed = json.loads(run_cli("cache", "ls", "--json", env=env, check=True).stdout)
    revisions = {r["origin"]: r for r in listed["hub_revisions"]}
    commit = revisions["tinynet:v1+float16"]["commit"]
    folder = door.home / "cache" / "hub" / commit
    assert revisions["tinynet:v1+float16"]["bytes"] == sum(
        p.stat().st_size for p in folder.iterdir())
    assert "hub " + commit[:12] in run_cli("cache", "ls", env=env, check=True).stdout

    def prune(*args: str) -> dict[str, Any]:
        return dict(json.loads(run_cli("cache", "prune", *args, "--json", env=env,
                                       check=True).stdout))

    assert "tinynet:v1+float16" not in prune("--keep", "tinynet:v1")["hub_revisions"]
    assert folder.exists()
    with hubcache.locked(folder.parent, commit):  # as while it is being derived
        assert commit in prune()["hub_busy"]
    assert folder.exists()
    # A client's HEAD lists the revision; prune removes it before the GET: the GET is served
    # the same bytes, derived again.
    assert httpx.head(url, headers=headers).headers["etag"] == first.headers["etag"]
    assert "tinynet:v1+float16" in prune()["hub_revisions"]
    assert not folder.exists()
    again = httpx.get(url, headers=headers)
    assert again.status_code == 200 and again.headers["etag"] == first.headers["etag"]
    assert again.content == first.content and folder.exists()


def test_a_file_listed_before_its_revision_was_pruned_is_derived_again(door: Door,
                                                                        tmp_path: Path) -> None:
    from registry.doors import hubcache
    from registry.doors.hf import HubDoor

    local = door.reg.backend
    hub = HubDoor(resolve=local.resolve, list_versions=local.list_versions,
                  open_blob=local.open_blob, signature=lambda _m: None,
                  cache_dir=tmp_path / "cache")
    rev = hub.revision("tinynet", "v1+float16")
    listed = rev.file("model.safetensors")
    with open(listed.path or "", "rb") as fh:
        before = fh.read()
    assert hubcache.remove(hub.derived_dir, rev.commit)
    opened = hub.open(rev, listed)  # the listing it holds names a file that is gone
    assert not isinstance(opened, bytes)
    with opened:
        assert opened.read() == before
    assert hashlib.sha256(before).hexdigest() == listed.sha256
