"""A blob in the store folder is whatever a writer of that folder put there: it is opened once,
its type and size are checked on that open file against the manifest before a byte is read, it
is hashed through it, and that very file is mapped for loading. The memo records the identity
of the file that was hashed, so a file put at the blob's path later is never vouched for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import registry
from registry.caching import cache
from registry.errors import DigestMismatchError
from registry.io.weights import write_safetensors
from tests.helpers import trained_mlp
from tests.integration.serving import Service


def _blob(reg: registry.Registry, mv: registry.ModelVersion) -> Path:
    return reg.settings.home / "objects" / "blobs" / "sha256" / mv.digest.removeprefix("sha256:")


def _swap(blob: Path, state: dict[str, torch.Tensor]) -> None:
    """Put another file at ``blob``'s path, as a writer of the store folder would: same keys,
    shapes and size, other values."""
    other = blob.with_name("other")
    write_safetensors({k: v + 1 for k, v in state.items()}, other)
    assert other.stat().st_size == blob.stat().st_size
    os.replace(other, blob)


def _finishes(call: Callable[[], Any], seconds: float = 120) -> BaseException | None:
    """Run ``call`` on a thread; the error it raised. A call still running after ``seconds``
    (hashing /dev/zero forever, blocked on a FIFO) fails the test instead of hanging it."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            caught.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the pull never returned: it is reading a file with no end"
    return caught[0] if caught else None


def test_a_blob_replaced_while_it_is_hashed_is_neither_loaded_nor_vouched_for(
        reg: registry.Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    model = trained_mlp()
    mv = reg.push(model, "m")
    for memo in (reg.settings.cache_dir / "verified").iterdir():
        memo.unlink()  # the next pull hashes the blob
    blob = _blob(reg, mv)
    real = cache.sha256_file

    def hash_then_swap(source: Any) -> str:
        digest = real(source)
        _swap(blob, model.state_dict())
        return digest

    monkeypatch.setattr(cache, "sha256_file", hash_then_swap)
    fresh = registry.Registry(home=reg.settings.home)
    pulled = fresh.pull_state_dict("m", device="cpu")
    monkeypatch.setattr(cache, "sha256_file", real)
    for key, value in model.state_dict().items():
        assert torch.equal(pulled[key], value), f"{key}: the swapped file was loaded"
    fresh.close()
    again = registry.Registry(home=reg.settings.home)
    with pytest.raises(DigestMismatchError, match="corrupt"):
        again.pull_state_dict("m", device="cpu")
    again.push(model, "m")  # pushing the true weights again repairs the store
    repaired = again.pull_state_dict("m", device="cpu")
    assert all(torch.equal(repaired[k], v) for k, v in model.state_dict().items())
    again.close()


@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo", "folder", "longer", "shorter"])
def test_a_blob_that_is_not_the_manifests_file_is_refused_before_it_is_read(
        reg: registry.Registry, kind: str) -> None:
    mv = reg.push(trained_mlp(), "m")
    blob = _blob(reg, mv)
    data = blob.read_bytes()
    blob.chmod(0o644)
    blob.unlink()
    if kind == "link to /dev/zero":
        blob.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(blob)
    elif kind == "folder":
        blob.mkdir()
    else:
        blob.write_bytes(data + b"\0" * 64 if kind == "longer" else data[:-64])
    fresh = registry.Registry(home=reg.settings.home)
    error = _finishes(lambda: fresh.pull_state_dict("m", device="cpu"))
    assert isinstance(error, DigestMismatchError), repr(error)
    assert str(blob) in str(error)
    if kind in ("longer", "shorter"):  # refused on its size, before it was hashed
        assert "where its manifest lists" in str(error)
    fresh.close()


def test_the_server_answers_a_blob_that_is_a_link_to_dev_zero(server: Service) -> None:
    home: Path = server.home  # type: ignore[attr-defined]
    client = registry.Registry(server.url, home=server.root / "work" / "zero")  # type: ignore
    torch.manual_seed(7)
    mv = client.push(torch.nn.Linear(3, 5), "zero")
    client.close()
    blob = home / "objects" / "blobs" / "sha256" / mv.digest.removeprefix("sha256:")
    data = blob.read_bytes()
    blob.chmod(0o644)
    blob.unlink()
    blob.symlink_to("/dev/zero")
    try:
        responses: list[httpx.Response] = []
        error = _finishes(lambda: responses.append(httpx.get(
            f"{server.url}/api/v1/blobs/{mv.digest}", timeout=60)))
        assert error is None, repr(error)
        assert 400 <= responses[0].status_code < 500, responses[0].status_code
        assert len(responses[0].content) < 2000
    finally:
        blob.unlink()
        blob.write_bytes(data)


@pytest.mark.parametrize("dtype", ["auto", "float16"])
def test_save_pretrained_writes_the_blob_it_verified_not_one_put_at_its_path_after(
        reg: registry.Registry, work: Path, monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """Its shards were copied (``dtype="auto"``) or cast from the blob's path opened again
    after the check: a file put there meanwhile was written out as the version's weights."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    model: Any = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16))
    model.save_pretrained(work / "src")
    mv = reg.push(work / "src", "gpt2")
    for memo in (reg.settings.cache_dir / "verified").iterdir():
        memo.unlink()  # the save hashes the blob
    blob = _blob(reg, mv)
    stored = load_file(blob)
    real = cache.sha256_file

    def hash_then_swap(source: Any) -> str:
        digest = real(source)
        _swap(blob, stored)
        return digest

    monkeypatch.setattr(cache, "sha256_file", hash_then_swap)
    fresh = registry.Registry(home=reg.settings.home)
    out = fresh.save_pretrained(mv.ref, work / "dest", dtype=dtype)
    monkeypatch.setattr(cache, "sha256_file", real)
    fresh.close()
    written = load_file(out / "model.safetensors")
    assert written.keys() == stored.keys()
    for key, value in stored.items():
        expected = value.half() if dtype == "float16" and value.is_floating_point() else value
        assert torch.equal(written[key], expected), f"{key}: the swapped file was written"


def test_the_server_sends_the_blob_it_verified_not_one_put_at_its_path_after(
        reg: registry.Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """`GET /api/v1/blobs/<digest>` answered FileResponse(path) after the check: the path was
    opened again, and a file put there meanwhile was served (and every client's digest check
    failed on the true version). A range of it too."""
    from fastapi.testclient import TestClient

    from server.app import create_app

    model = trained_mlp()
    mv = reg.push(model, "m")
    for memo in (reg.settings.cache_dir / "verified").iterdir():
        memo.unlink()  # the server hashes the blob
    blob = _blob(reg, mv)
    true = blob.read_bytes()
    real = cache.sha256_file
    swaps: list[int] = []

    def hash_then_swap(source: Any) -> str:
        digest = real(source)
        if not swaps:
            swaps.append(1)
            _swap(blob, model.state_dict())
        return digest

    monkeypatch.setattr(cache, "sha256_file", hash_then_swap)
    with TestClient(create_app(reg.settings)) as client:
        whole = client.get(f"/api/v1/blobs/{mv.digest}")
        assert swaps and blob.read_bytes() != true
        assert whole.status_code == 200 and whole.content == true, "the swapped file was served"
        assert whole.headers["content-length"] == str(len(true))
        # The swapped file is caught now (its identity is not the memo's): never served.
        assert client.get(f"/api/v1/blobs/{mv.digest}").status_code == 422
        blob.chmod(0o644)
        blob.write_bytes(true)
        part = client.get(f"/api/v1/blobs/{mv.digest}", headers={"Range": "bytes=8-27"})
        assert (part.status_code, part.content) == (206, true[8:28])
        assert part.headers["content-range"] == f"bytes 8-27/{len(true)}"
        tail = client.get(f"/api/v1/blobs/{mv.digest}", headers={"Range": "bytes=-5"})
        assert (tail.status_code, tail.content) == (206, true[-5:])
        past = client.get(f"/api/v1/blobs/{mv.digest}", headers={"Range": f"bytes={len(true)}-"})
        assert past.status_code == 416 and past.content == b""
        head = client.head(f"/api/v1/blobs/{mv.digest}")
        assert (head.status_code, head.content) == (200, b"")
        assert head.headers["content-length"] == str(len(true))


def test_pull_files_writes_the_file_it_verified_not_one_put_at_its_path_after(
        reg: registry.Registry, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attached files were copied from the blob's path opened again after the check: a file
    put there meanwhile (same size, other bytes) was written out as the version's tokenizer."""
    from registry.files import attached_files

    true = b'{"vocab": "' + b"a" * 200 + b'"}'
    (work / "tokenizer.json").write_bytes(true)
    mv = reg.push(trained_mlp(), "m", files={"tokenizer.json": work / "tokenizer.json"})
    (attached,) = attached_files(reg.show(mv.ref).metadata)
    for memo in (reg.settings.cache_dir / "verified").iterdir():
        memo.unlink()  # the pull hashes the blob
    blob = reg.settings.home / "objects" / "blobs" / "sha256" / attached.digest.split(":")[1]
    real = cache.sha256_file

    def hash_then_swap(source: Any) -> str:
        digest = real(source)
        other = blob.with_name("other")
        other.write_bytes(true.replace(b"a", b"b"))
        os.replace(other, blob)
        return digest

    monkeypatch.setattr(cache, "sha256_file", hash_then_swap)
    fresh = registry.Registry(home=reg.settings.home)
    out = fresh.pull_files(mv.ref, work / "dest")
    monkeypatch.setattr(cache, "sha256_file", real)
    fresh.close()
    assert (out / "tokenizer.json").read_bytes() == true
