"""Pinned, double-buffered staging of a pull's tensors onto CUDA (registry/io/staging.py).

No GPU here: the byte path runs with ordinary buffers and synchronous copies (``pinned=False``,
target ``cpu``), which is the same code the CUDA path runs minus the events; the routing is
checked with a staging that records what crosses it; the ``gpu`` tests run the real thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from registry import Registry
from registry.io import staging as st
from registry.io.weights import load_shard, write_safetensors
from tests.helpers import trained_mlp

TENSORS = {
    "big": torch.randn(50, 7),  # 1400 bytes: many chunks
    "half": torch.randn(33).to(torch.float16),  # odd byte count
    "bf": torch.randn(4, 4).to(torch.bfloat16),
    "count": torch.tensor(12345678901, dtype=torch.int64),  # 0-d
    "mask": torch.tensor([True, False, True]),
    "empty": torch.empty(0, 5),
    "bytes": torch.arange(200, dtype=torch.uint8),
}


def _cpu(chunk: int) -> st.Staging:
    return st.Staging("cpu", chunk, pinned=False)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 2**20])
def test_every_byte_crosses_in_chunks_of_two_buffers(chunk: int) -> None:
    staging = _cpu(chunk)
    moved = staging.move((t, t.dtype) for t in TENSORS.values())
    for (key, want), got in zip(TENSORS.items(), moved, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert torch.equal(got, want), key
        assert got.data_ptr() != want.data_ptr() or not want.numel(), f"{key} was not copied"
    assert len(staging.buffers) <= 2
    assert all(b.data.numel() == chunk for b in staging.buffers)
    assert staging.bytes_copied == sum(t.numel() * t.element_size() for t in TENSORS.values())


@pytest.mark.parametrize("count", [1, 3])
def test_any_number_of_buffers_takes_turns(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "BUFFERS", count)
    staging = _cpu(64)
    moved = staging.move((t, t.dtype) for t in TENSORS.values())
    assert all(torch.equal(a, b) for a, b in zip(TENSORS.values(), moved, strict=True))
    assert len(staging.buffers) == count


def test_buffers_are_reused_across_shards_and_never_grow() -> None:
    staging = _cpu(64)
    first = [b.data.data_ptr() for b in staging.buffers]
    for seed in range(5):
        torch.manual_seed(seed)
        shard = [torch.randn(100), torch.randn(3, 3)]
        got = staging.move((t, t.dtype) for t in shard)
        assert all(torch.equal(a, b) for a, b in zip(shard, got, strict=True))
        if not first:
            first = [b.data.data_ptr() for b in staging.buffers]
        assert [b.data.data_ptr() for b in staging.buffers] == first
    staging.finish()
    assert all(not b.pending and b.used == 0 for b in staging.buffers)


def test_a_cast_happens_after_the_copy_on_the_target() -> None:
    half = torch.randn(1000).to(torch.float16)
    staging = _cpu(100)
    (got,) = staging.move([(half, torch.float32)])
    assert got.dtype == torch.float32
    assert torch.equal(got, half.float())
    # Stored bytes crossed, not the cast ones: half the bytes of a float32 copy.
    assert staging.bytes_copied == half.numel() * 2


def test_non_contiguous_sources_are_copied_correctly() -> None:
    base = torch.randn(8, 6)
    view = base.t()
    (got,) = _cpu(16).move([(view, view.dtype)])
    assert torch.equal(got, view)


def test_a_chunk_below_one_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 byte"):
        st.Staging("cpu", 0, pinned=False)


def test_only_cuda_devices_stage_and_nothing_is_allocated_up_front() -> None:
    stagings = st.Stagings(chunk=4096, prefault_threads=0)
    assert stagings.get(torch.device("cpu")) is None
    assert stagings.get(torch.device("meta")) is None
    cuda1 = stagings.get(torch.device("cuda", 1))
    assert cuda1 is not None and cuda1.pinned and cuda1.cuda
    assert cuda1.buffers == []  # no pinned memory is taken until bytes cross
    assert stagings.get(torch.device("cuda", 1)) is cuda1
    assert stagings.get(torch.device("cuda", 0)) is not cuda1
    assert st.Stagings().chunk == st.DEFAULT_CHUNK


class _Recording(st.Stagings):
    """Stages every device through CPU buffers, recording what crossed."""

    def __init__(self) -> None:
        super().__init__(chunk=64)
        self.moved: list[tuple[int, torch.dtype]] = []

    def get(self, device: torch.device) -> st.Staging | None:
        if device.type != "cpu":
            return None
        if device in self.by_device:
            return self.by_device[device]
        staging = self.by_device[device] = _cpu(self.chunk)
        original = staging.move

        def move(items: Any) -> list[torch.Tensor]:
            items = list(items)
            self.moved += [(t.data_ptr(), d) for t, d in items]
            return original(items)

        staging.move = move  # type: ignore[method-assign]
        return staging


def test_load_shard_sends_staged_tensors_through_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "shard.safetensors"
    tensors = {k: v for k, v in TENSORS.items()}
    write_safetensors(tensors, path)
    expected = {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                for k, t in tensors.items()}

    def dtype_for(key: str, stored: torch.dtype, device: torch.device) -> torch.dtype:
        return torch.float32 if stored == torch.float16 else stored

    recording = _Recording()
    out = load_shard(path, expected, lambda _k: torch.device("cpu"), dtype_for,
                     origin="m:v1", stagings=recording)
    plain = load_shard(path, expected, lambda _k: torch.device("cpu"), dtype_for, origin="m:v1")
    assert set(out) == set(tensors) == set(plain)
    for key, want in tensors.items():
        assert torch.equal(out[key], plain[key]), key
        assert out[key].dtype == dtype_for(key, want.dtype, torch.device("cpu"))
    # Every tensor crossed the staging once, in the order its bytes lie in the file.
    addresses = [address for address, _ in recording.moved]
    assert len(addresses) == len(tensors) and addresses == sorted(addresses)
    assert (recording.by_device[torch.device("cpu")].bytes_copied
            == sum(t.numel() * t.element_size() for t in tensors.values()))


def test_a_pull_sends_its_tensors_through_the_staging(reg: Registry,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The pull's wiring, end to end: with CPU made a staged device, every stored byte of a
    two-shard, float16 version crosses the buffers and comes out cast and bit-exact."""
    model = trained_mlp().half()
    reg.push(model, "mlp", shard_size=400)
    assert len(reg.show("mlp").metadata["files"]) > 1
    made: list[st.Staging] = []
    real_init = st.Staging.__init__

    def init(self: st.Staging, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(st, "uses_staging", lambda device: True)
    monkeypatch.setattr(st.Staging, "__init__", init)
    state = reg.pull_state_dict("mlp", device="cpu", dtype="float32")
    (staging,) = made
    assert staging.bytes_copied == sum(t.numel() * t.element_size()
                                       for t in model.state_dict().values())
    assert len(staging.buffers) <= 2 and all(not b.pending for b in staging.buffers)
    for key, want in model.state_dict().items():
        expected = want.float() if want.is_floating_point() else want
        assert state[key].dtype == expected.dtype and torch.equal(state[key], expected), key


# -- real GPU (skipped where none exists) --------------------------------------------------

@pytest.mark.gpu
def test_pinned_staging_onto_a_real_gpu() -> None:
    torch.manual_seed(0)
    shard = [torch.randn(3_000_000), torch.randn(17).half(), torch.randint(0, 9, (5,))]
    staging = st.Staging("cuda", 1 << 20)
    got = staging.move([(shard[0], torch.float32), (shard[1], torch.float32),
                        (shard[2], torch.int64)])
    staging.finish()
    assert all(b.data.is_pinned() for b in staging.buffers) and len(staging.buffers) == 2
    assert torch.equal(got[0].cpu(), shard[0])
    assert torch.equal(got[1].cpu(), shard[1].float())
    assert torch.equal(got[2].cpu(), shard[2])
    assert all(t.device.type == "cuda" for t in got)
