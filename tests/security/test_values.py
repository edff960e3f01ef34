"""Refs, names, aliases, tags, versions and devices: hostile values are typed errors with short
messages, never bare ValueError/IndexError, and never echoed whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import registry
from registry.errors import CheckpointError, DeviceUnavailableError, RefError, quoted
from registry.model import devices as dev
from registry.refs import (
    MAX_VERSION,
    Ref,
    parse,
    validate_alias,
    validate_aliases,
    validate_name,
    validate_tags,
    validate_version,
)
from tests.helpers import clean_env, run_cli, trained_mlp

# An error message may quote ~200 characters of the bad value plus its own words.
SHORT = 600


def _id(value: object) -> str:
    return quoted(value, 24)  # pytest's own str() of a 5000-digit int raises


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=300),
                 st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}[:@].{0,80}", fullmatch=True)))
def test_parse_accepts_or_raises_ref_error_and_round_trips(text: str) -> None:
    try:
        ref = parse(text)
    except RefError as exc:
        assert len(str(exc)) < SHORT
        return
    assert parse(str(ref)) == ref


@settings(max_examples=300, deadline=None)
@given(st.builds(Ref, st.from_regex(r"[a-z0-9][a-z0-9._-]{0,127}", fullmatch=True),
                 version=st.one_of(st.none(), st.integers(1, MAX_VERSION))))
def test_every_valid_ref_round_trips(ref: Ref) -> None:
    assert parse(str(ref)) == ref


@pytest.mark.parametrize("text", ["m:" + "9" * 5000, "m:v" + "1" * 5000, "m:v2147483648",
                                  "m:" + "1" * 11, "m:0", "m:v01", "m:-1", "m:1e3", "m:v1.0"],
                         ids=_id)
def test_absurd_versions_are_ref_errors(text: str) -> None:
    with pytest.raises(RefError) as caught:
        parse(text)
    assert len(str(caught.value)) < SHORT


@pytest.mark.parametrize("value", [True, False, 0, -1, 2**31, 10**5000, 1.0, "v0", None,
                                   "9" * 5000, [], "３"], ids=_id)
def test_validate_version_refuses_non_versions(value: object) -> None:
    with pytest.raises(RefError) as caught:
        validate_version(value)
    assert len(str(caught.value)) < SHORT


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.integers(), st.none(), st.binary(max_size=20)))
def test_name_and_alias_validators_are_total(value: object) -> None:
    for check in (validate_name, validate_alias):
        try:
            out = check(value)
        except RefError as exc:
            assert len(str(exc)) < SHORT
        else:
            assert out == value and isinstance(out, str) and "/" not in out and out != ".."


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=300), st.one_of(st.text(max_size=6000), st.none(),
                                                        st.integers()), max_size=5))
def test_tag_validator_is_total(tags: dict[str, object]) -> None:
    try:
        out = validate_tags(tags)  # type: ignore[arg-type]
    except RefError as exc:
        assert len(str(exc)) < SHORT
        return
    for key, value in out.items():
        assert isinstance(value, str) and len(value) <= 5000
        (key + value).encode("utf-8")  # storable: no lone surrogate


def test_a_megabyte_tag_is_never_echoed_whole(reg: registry.Registry) -> None:
    reg.push(trained_mlp(), "m")
    huge = "x" * 500_000 + "MIDDLE" + "x" * 500_000
    with pytest.raises(RefError) as caught:
        reg.set_tags("m", {"k": huge})
    assert len(str(caught.value)) < SHORT and "MIDDLE" not in str(caught.value)
    with pytest.raises(RefError) as caught:
        reg.push(trained_mlp(), "m", tags={huge: "v"})
    assert len(str(caught.value)) < SHORT


@pytest.mark.parametrize("value", ["\x00", "a\ud800b"])
def test_tags_that_no_database_or_json_encoder_can_hold_are_refused(value: str) -> None:
    with pytest.raises(RefError):
        validate_tags({"k": value})
    with pytest.raises(RefError):
        validate_tags({value: "v"})


def test_tag_and_alias_counts_are_bounded() -> None:
    with pytest.raises(RefError, match="at most"):
        validate_tags({f"k{i}": "v" for i in range(1001)})
    with pytest.raises(RefError, match="at most"):
        validate_aliases([f"a{i}" for i in range(101)])


def test_quoted_is_bounded_for_any_value() -> None:
    for value in ("x" * 10**6, b"y" * 10**6, 10**5000, {"k" * 10**5: ["v" * 10**5] * 10},
                  [list(range(1000))] * 1000):
        assert len(quoted(value)) < 400


@pytest.mark.parametrize("device", [2**70, 10**5000, 128, -1, "cuda:" + "9" * 5000,
                                    "cuda:99999999999999999999", "x" * 10**6, 1.5, None,
                                    b"cpu", [0], "meta", "cuda:-1"], ids=_id)
def test_absurd_devices_are_device_unavailable(reg: registry.Registry, device: object) -> None:
    reg.push(trained_mlp(), "m")
    with pytest.raises(DeviceUnavailableError) as caught:
        reg.pull_state_dict("m", device=device)  # type: ignore[arg-type]
    assert len(str(caught.value)) < SHORT


def test_device_resolution_is_total() -> None:
    facts = dev.TorchFacts()

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.integers(), st.text(max_size=40), st.from_regex(r"cuda:\d{1,40}")))
    def check(request: object) -> None:
        try:
            device = dev.resolve_device(request, 0, facts)  # type: ignore[arg-type]
        except DeviceUnavailableError:
            return
        assert device == torch.device("cpu")

    check()


def _checkpoint_cases(work: Path) -> dict[str, Path]:
    good = work / "good.pth"
    torch.save(trained_mlp().state_dict(), good)
    data = good.read_bytes()
    legacy = work / "legacy.pt"
    torch.save(trained_mlp().state_dict(), legacy, _use_new_zipfile_serialization=False)
    cases = {
        "empty.pth": b"", "empty.bin": b"", "empty.pt": b"", "empty.safetensors": b"",
        "truncated.pth": data[: len(data) // 2], "ten-bytes.bin": data[:10],
        "one-byte.pt": b"\x80", "truncated-legacy.pt": legacy.read_bytes()[:50],
        "garbage.pth": bytes(range(256)) * 4,
    }
    paths = {}
    for name, content in cases.items():
        (work / name).write_bytes(content)
        paths[name] = work / name
    (work / "link-to-empty.pth").symlink_to(work / "empty.pth")
    paths["link-to-empty.pth"] = work / "link-to-empty.pth"
    (work / "dangling.bin").symlink_to(work / "nowhere")
    paths["dangling.bin"] = work / "dangling.bin"
    (work / "to-dir.pt").symlink_to(work)
    paths["to-dir.pt"] = work / "to-dir.pt"
    return paths


def test_bad_checkpoint_files_are_checkpoint_errors(reg: registry.Registry, work: Path) -> None:
    for name, path in _checkpoint_cases(work).items():
        with pytest.raises(CheckpointError) as caught:
            reg.push(path, "m")
        assert len(str(caught.value)) < SHORT, name
    assert reg.list_models() == []


def test_symlink_to_a_real_checkpoint_is_read(reg: registry.Registry, work: Path) -> None:
    """Control for the case above: a symlink (Lightning's last.ckpt) to a good file works."""
    torch.save(trained_mlp().state_dict(), work / "epoch.ckpt")
    (work / "last.ckpt").symlink_to(work / "epoch.ckpt")
    assert reg.push(work / "last.ckpt", "m").version == 1


def test_cli_push_of_an_empty_checkpoint_is_one_line(home: Path, work: Path) -> None:
    (work / "empty.pth").write_bytes(b"")
    result = run_cli("push", "m", str(work / "empty.pth"), env=clean_env(home))
    assert result.returncode == CheckpointError.exit_code
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "is empty" in result.stderr


def test_tags_added_over_many_calls_stay_bounded(reg: registry.Registry) -> None:
    reg.push(trained_mlp(), "m", tags={f"a{i}": "v" for i in range(600)})
    with pytest.raises(RefError, match="at most 1000"):
        reg.set_tags("m", {f"b{i}": "v" for i in range(600)})
    assert len(reg.show("m").tags) == 600
