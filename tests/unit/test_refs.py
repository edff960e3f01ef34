from __future__ import annotations

import pytest

from registry import RefError, RegistryError
from registry.refs import Ref, parse, parse_push_target, validate_alias, validate_version

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("resnet18", Ref("resnet18")),
        ("resnet18:latest", Ref("resnet18")),
        ("resnet18:v3", Ref("resnet18", version=3)),
        ("resnet18:3", Ref("resnet18", version=3)),
        ("resnet18@production", Ref("resnet18", alias="production")),
        (f"resnet18@{DIGEST}", Ref("resnet18", digest=DIGEST)),
        ("resnet18@sha256:5d134060e707", Ref("resnet18", digest="sha256:5d134060e707")),
        ("a", Ref("a")),
        ("0net", Ref("0net")),
        ("bert.base-uncased_v2", Ref("bert.base-uncased_v2")),
        ("m:v2147483647", Ref("m", version=2**31 - 1)),
        ("m@a_b-c9", Ref("m", alias="a_b-c9")),
        ("x" * 128, Ref("x" * 128)),
    ],
)
def test_parse_valid(text: str, expected: Ref) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("ref", "text"),
    [
        (Ref("m"), "m"),
        (Ref("m", version=3), "m:v3"),
        (Ref("m", alias="prod"), "m@prod"),
        (Ref("m", digest=DIGEST), f"m@{DIGEST}"),
    ],
)
def test_format_round_trips(ref: Ref, text: str) -> None:
    assert str(ref) == text
    assert parse(str(ref)) == ref


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", "empty"),
        ("ResNet", "'ResNet'"),
        ("-resnet", "'-resnet'"),
        (".hidden", "'.hidden'"),
        ("_x", "'_x'"),
        ("res net", "'res net'"),
        ("org/resnet", "'org/resnet'"),
        ("../etc", "'../etc'"),
        ("x" * 129, "invalid model name"),
        ("resnet:", "empty version"),
        ("resnet:v", "'v'"),
        ("resnet:v0", "'v0'"),
        ("resnet:0", "'0'"),
        ("resnet:v03", "'v03'"),
        ("resnet:-1", "'-1'"),
        ("resnet:v1.5", "'v1.5'"),
        ("resnet:V3", "'V3'"),
        ("resnet:v3:v4", "'v3:v4'"),
        ("resnet:v99999999999", "'v99999999999'"),
        ("resnet:latest2", "'latest2'"),
        ("resnet@", "empty alias"),
        ("resnet@latest", "reserved"),
        ("resnet@v3", "reserved"),
        ("resnet@Prod", "'Prod'"),
        ("resnet@1prod", "'1prod'"),
        ("resnet@prod!", "'prod!'"),
        ("resnet@" + "a" * 64, "invalid alias"),
        ("resnet@sha256:abc", "invalid digest"),
        ("resnet@sha256:5d134060e70", "a prefix needs at least 12; this one has 11"),
        ("resnet@sha256:", "12 to 64 lowercase hex digits"),
        ("resnet@sha256:" + "AB" * 32, "invalid digest"),
        ("resnet@sha256:" + "ab" * 33, "invalid digest"),
        ("@prod", "invalid model name"),
        (":v1", "invalid model name"),
        ("resnet@prod@x", "'prod@x'"),
    ],
)
def test_parse_malformed_names_the_bad_part(text: str, names: str) -> None:
    with pytest.raises(RefError) as info:
        parse(text)
    assert names in str(info.value)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RegistryError)


@pytest.mark.parametrize("value", [None, 3, b"resnet", ["resnet"]])
def test_parse_refuses_non_strings(value: object) -> None:
    with pytest.raises(RefError, match="must be a string"):
        parse(value)


def test_push_target_allows_explicit_version_but_not_alias_or_latest() -> None:
    assert parse_push_target("resnet18") == ("resnet18", None)
    assert parse_push_target("resnet18:v7") == ("resnet18", 7)
    with pytest.raises(RefError, match="aliases="):
        parse_push_target("resnet18@prod")
    with pytest.raises(RefError, match="latest"):
        parse_push_target("resnet18:latest")


def test_versions_and_aliases_validate_alone() -> None:
    assert validate_version(4) == 4
    assert validate_version("v4") == 4
    assert validate_version("4") == 4
    for bad in (0, -2, True, "four", 2**31):
        with pytest.raises(RefError):
            validate_version(bad)
    assert validate_alias("champion") == "champion"
    with pytest.raises(RefError, match="reserved"):
        validate_alias("v12")


def test_tags_validate_and_removals_only_when_asked() -> None:
    from registry.refs import validate_aliases, validate_tags

    assert validate_tags({"b": "2", "a": "1"}) == {"a": "1", "b": "2"}
    assert validate_tags({"a": None}, removals=True) == {"a": None}
    with pytest.raises(RefError, match="invalid value for tag 'a'"):
        validate_tags({"a": None})
    for bad_key in ("", " padded", "k" * 251, 3):
        with pytest.raises(RefError, match="invalid tag key"):
            validate_tags({bad_key: "v"})  # type: ignore[dict-item]
    with pytest.raises(RefError, match="dict of str"):
        validate_tags(["a"])  # type: ignore[arg-type]
    assert validate_aliases("prod") == ["prod"]
    assert validate_aliases(["b", "a", "b"]) == ["a", "b"]


def test_a_model_version_reprs_on_one_line_whatever_its_manifest_holds() -> None:
    from registry.manifest import ModelVersion

    manifest = {"tensors": {f"layer{i}.weight": {"dtype": "F32", "shape": [64, 64]}
                            for i in range(300)}}
    mv = ModelVersion(name="resnet18", version=3, digest="sha256:" + "5f0c" * 16,
                      tags={"dataset": "imagenet"}, aliases=["production"], metadata=manifest)
    text = repr(mv)
    assert text == ("ModelVersion('resnet18:v3', digest='sha256:5f0c5f0c5f0c…', "
                    "aliases=['production'], tags={'dataset': 'imagenet'})")
    assert "\n" not in text and "layer0" not in text
