"""Model patterns of tokens (server/auth.py): fnmatch only, bounded, and one check that every
route uses (``Principal.may_see``)."""

from __future__ import annotations

import pytest

from registry.errors import ForbiddenError, NotFoundError, SettingsError
from server.auth import (
    MAX_PATTERNS,
    Principal,
    missing_model,
    parse_model_patterns,
    visible_models,
)


def test_patterns_parse_trimmed_and_once() -> None:
    assert parse_model_patterns(" team-a-*, shared ,team-a-*") == ("team-a-*", "shared")
    assert parse_model_patterns(["m?", "[!x]*"]) == ("m?", "[!x]*")


@pytest.mark.parametrize(("text", "says"), [
    ("", "no model patterns given"),
    (" , ", "no model patterns given"),
    ("Team-*", "invalid model pattern 'Team-*'"),
    ("^team.*$", "invalid model pattern '^team.*$'"),
    ("a/b", "invalid model pattern 'a/b'"),
    ("(a|b)*", "invalid model pattern"),
    ("x" * 129, "invalid model pattern"),
    (",".join(f"m{i}" for i in range(MAX_PATTERNS + 1)), f"at most {MAX_PATTERNS}"),
])
def test_bad_patterns_are_settings_errors_naming_them(text: str, says: str) -> None:
    with pytest.raises(SettingsError) as raised:
        parse_model_patterns(text)
    assert says in str(raised.value)


def test_a_file_may_not_hold_anything_but_pattern_strings() -> None:
    for value in ([1], [None], [["a"]], [""]):
        with pytest.raises(SettingsError, match="invalid model pattern"):
            parse_model_patterns(value)


@pytest.mark.parametrize(("name", "seen"), [
    ("team-a-x", True), ("team-a-", True), ("shared", True), ("team-b-x", False),
    ("shared2", False), ("xteam-a-x", False), ("m1", True), ("mx", False),
])
def test_may_see_is_case_sensitive_fnmatch_over_the_whole_name(name: str, seen: bool) -> None:
    caller = Principal("ci", models=("team-a-*", "shared", "m[0-9]"))
    assert caller.may_see(name) is seen
    assert caller.visible(["team-b-q", name]) == ([name] if seen else [])


def test_a_token_without_patterns_sees_every_model() -> None:
    caller = Principal("boss")
    assert not caller.restricted and caller.may_see("anything")
    assert caller.check("anything") == "anything"
    caller.require_all_models("gc")  # no error


def test_a_hidden_model_raises_what_a_missing_one_does() -> None:
    caller = Principal("ci", models=("team-a-*",))
    with pytest.raises(NotFoundError) as hidden:
        caller.check("team-b-y")
    assert str(hidden.value) == str(missing_model(caller, "team-b-y")) == (
        "model 'team-b-y' not found; this token sees models matching team-a-*")
    with pytest.raises(ForbiddenError, match="needs an admin token created without --models"):
        caller.require_all_models("POST /api/v1/gc")


def test_visible_pages_walk_past_hidden_names() -> None:
    names = sorted([f"team-b-{i:04d}" for i in range(2500)] + ["team-a-1", "team-a-2",
                                                                 "zeta"])
    asked: list[tuple[int, str | None]] = []

    def page(n: int, after: str | None) -> list[str]:
        asked.append((n, after))
        rest = [x for x in names if after is None or x > after]
        return rest[:n]

    caller = Principal("ci", models=("team-a-*", "zeta"))
    assert visible_models(caller, page, limit=2, after=None) == ["team-a-1", "team-a-2"]
    assert visible_models(caller, page, limit=5, after="team-a-2") == ["zeta"]
    assert len(asked) > 2  # it read on through the hidden names in batches
    assert visible_models(Principal("boss"), page, limit=3, after=None) == names[:3]
