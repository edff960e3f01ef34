"""Hostile OCI layers (issue 45): a gzip bomb is stopped by the expansion caps while it streams,
a file that is also a folder is a typed error, and a registry trickling a byte at a time cannot
hold a pull past its deadline. Nothing is left in the checkouts, nothing outside the home."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator

import pytest

import registry
from registry.oci import modelpack

from .oci_fake import BLOB_TYPE, FakeOci, sha
from .test_oci_answers import _Fc, _layer, _member, _nothing_kept, _tar, _weights

TAR_GZ = modelpack.WEIGHT.replace(".raw", ".tar+gzip")
TAR = modelpack.WEIGHT.replace(".raw", ".tar")


@pytest.fixture
def fake() -> Iterator[FakeOci]:
    server = FakeOci().start()
    yield server
    server.close()


def _checkouts(reg: registry.Registry) -> list[str]:
    root = reg.settings.cache_dir / "oci" / "checkouts"
    return [str(p) for p in root.rglob("*")] if root.exists() else []


def _bomb(size: int) -> bytes:
    """A gzip tar of the weights and one member of ``size`` zero bytes, streamed in."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        weights = _weights()
        info = _member("model.safetensors")
        info.size = len(weights)
        tar.addfile(info, io.BytesIO(weights))
        info = _member("zeros.bin")
        info.size = size
        tar.addfile(info, _Zeros(size))
    return out.getvalue()


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n

    def readable(self) -> bool:
        return True


@pytest.mark.parametrize(("env", "size"), [
    ({"REGISTRY_OCI_MAX_EXPANSION": "4"}, 64 * 2**20),  # the ratio: 4 x the 1 MiB floor
    ({"REGISTRY_OCI_MAX_UNPACKED": "1MiB"}, 8 * 2**20),  # the absolute cap
], ids=["ratio", "absolute"])
def test_a_gzip_bomb_stops_at_the_expansion_cap(fake: FakeOci, monkeypatch: pytest.MonkeyPatch,
                                                env: dict[str, str], size: int) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    archive = _bomb(size)
    assert len(archive) < 2**20  # a small layer...
    fake.blobs[sha(archive)] = archive
    fake.add_artifact("m", "v1", [_layer(archive, "model", media_type=TAR_GZ)])
    reg = registry.Registry()
    with pytest.raises(registry.OciArtifactError, match="expands to more than"):
        reg.import_oci(fake.ref("m:v1"), "m")
    with pytest.raises(registry.OciArtifactError, match="expands to more than"):
        reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)
    _nothing_kept(reg)
    assert _checkouts(reg) == []


def test_the_expansion_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert registry.Settings.from_env().oci_max_expansion == 100
    for name, value in [("REGISTRY_OCI_MAX_EXPANSION", "0"), ("REGISTRY_OCI_MAX_UNPACKED", "lots"),
                        ("REGISTRY_OCI_MIN_RATE", "-1"), ("REGISTRY_OCI_BLOB_GRACE", "soon")]:
        monkeypatch.setenv(name, value)
        with pytest.raises(registry.SettingsError, match=name):
            registry.Settings.from_env()
        monkeypatch.delenv(name)


@pytest.mark.parametrize("layout", ["tar-then-raw", "raw-then-tar", "one-tar"])
def test_a_name_that_is_both_a_file_and_a_folder(fake: FakeOci, reg: registry.Registry,
                                                 layout: str) -> None:
    data = _weights()
    file_x = _tar([(_member("model.safetensors"), data), (_member("x"), b"file\n")])
    folder_x = _tar([(_member("x/y"), b"in a folder\n")])
    both = _tar([(_member("model.safetensors"), data), (_member("x/y"), b"1"),
                 (_member("x"), b"2")])
    fake.blobs.update({sha(b): b for b in (data, file_x, folder_x, both)})
    layers = {
        "tar-then-raw": [_layer(file_x, "model", media_type=TAR), _layer(data, "x/y")],
        "raw-then-tar": [_layer(data, "model.safetensors"), _layer(data, "x"),
                         _layer(folder_x, "more", media_type=TAR)],
        "one-tar": [_layer(both, "model", media_type=TAR)],
    }[layout]
    fake.add_artifact("m", "v1", layers)
    with pytest.raises(registry.OciArtifactError, match="both a file and"):
        reg.import_oci(fake.ref("m:v1"), "m")
    with pytest.raises(registry.OciArtifactError, match="both a file and"):
        reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)
    _nothing_kept(reg)
    assert _checkouts(reg) == []


def test_a_trickling_registry_meets_the_blob_deadline(fake: FakeOci,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_OCI_BLOB_GRACE", "1")
    monkeypatch.setenv("REGISTRY_OCI_MIN_RATE", "1GiB")
    data = _weights()

    def trickle() -> Iterator[bytes]:
        for i in range(len(data)):  # a byte every 0.3 s: under any per-read timeout
            time.sleep(0.3)
            yield data[i:i + 1]

    fake.blobs[sha(data)] = data
    fake.add_artifact("m", "v1", [_layer(data)])
    fake.overrides[("GET", f"/v2/m/blobs/{sha(data)}")] = lambda: (
        200, {"Content-Type": BLOB_TYPE, "Content-Length": str(len(data))}, trickle())
    reg = registry.Registry()
    with pytest.raises(registry.OciUnavailableError, match="took more than 1 s"):
        reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)
    _nothing_kept(reg)
