"""The regular expressions an adapter record carries, matched in linear time.

A LoRA config may name its modules by pattern: ``target_modules`` or ``exclude_modules`` as one
regex, ``rank_pattern`` and ``alpha_pattern`` keyed by regexes. The record comes from the store,
so a pattern such as ``(.|.)*X`` would make Python's backtracking ``re`` run for hours on one
module path (in our own target check, or inside PEFT, which matches them with ``re``).

Every pattern is compiled by RE2 (``google-re2``), whose matching is linear in the input; one RE2
cannot compile (a backreference, a lookaround) is refused with an :class:`AdapterError` naming
the field, the pattern and why. PEFT never receives a record's pattern: :func:`literal_config`
matches each one here against the base's module paths and hands PEFT an alternation of the
escaped paths it matched (literals only, which ``re`` matches without backtracking blow-ups), with
exactly the same modules selected. Names PEFT pastes into its own patterns (``layers_pattern``,
``modules_to_save``, the items of a list of targets or exclusions) must be plain module names.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import AdapterError, quoted

MAX_PATTERN = 256
MAX_PATTERNS = 256  # keys of rank_pattern / alpha_pattern
MODULE_NAME = re.compile(r"[A-Za-z0-9_.]{1,256}")
NEVER = "(?!)"  # matches nothing: a pattern key that matched no module


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    import re2

    options = re2.Options()
    options.log_errors = False  # the refusal below says why; RE2 would also print it
    return re2.compile(pattern, options=options)


def compiled(pattern: object, field: str, origin: str) -> Any:
    """``pattern`` compiled by RE2 (linear-time matching); AdapterError naming ``field`` and
    why when it is not a pattern of at most :data:`MAX_PATTERN` characters RE2 accepts."""
    import re2

    if not isinstance(pattern, str) or not pattern:
        raise AdapterError(f"{origin}: its {field} {quoted(pattern, 80)} is not a pattern")
    if len(pattern) > MAX_PATTERN:
        raise AdapterError(f"{origin}: its {field} pattern is {len(pattern)} characters long, "
                           f"over {MAX_PATTERN}; it was not used")
    try:
        return _compiled(pattern)
    except re2.error as exc:
        why = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise AdapterError(
            f"{origin}: its {field} pattern {quoted(pattern, 120)} cannot be matched in linear "
            f"time ({why}: backreferences and lookarounds are not allowed); it was not used"
        ) from None


def check(config: Mapping[str, Any], origin: str) -> None:
    """Every pattern and pattern-pasted name of a LoRA ``config`` (the record's fields)."""
    for field in ("target_modules", "exclude_modules"):
        value = config.get(field)
        if isinstance(value, str):
            compiled(value, field, origin)
        elif value is not None:
            _names(value, field, origin, allow_empty=field == "exclude_modules")
    for field in ("rank_pattern", "alpha_pattern"):
        value = config.get(field) or {}
        if not isinstance(value, dict) or len(value) > MAX_PATTERNS:
            raise AdapterError(f"{origin}: its {field} is not a map of at most {MAX_PATTERNS} "
                               "patterns to numbers")
        for key in value:
            compiled(key, f"{field} key", origin)
    layers = config.get("layers_pattern")
    if layers not in (None, "", []):
        _names([layers] if isinstance(layers, str) else layers, "layers_pattern", origin)
    if config.get("modules_to_save") is not None:
        _names(config["modules_to_save"], "modules_to_save", origin, allow_empty=True)


def _names(value: object, field: str, origin: str, *, allow_empty: bool = False) -> None:
    if not isinstance(value, list) or (not value and not allow_empty) \
            or not all(isinstance(t, str) and MODULE_NAME.fullmatch(t) for t in value):
        raise AdapterError(f"{origin}: its {field} {quoted(value, 80)} is not a list of module "
                           "names (letters, digits, '_' and '.')")


def selected(pattern: str, modules: Iterable[str], field: str, origin: str,
             *, suffix: bool = False) -> list[str]:
    """The module paths ``pattern`` selects, in the order given: a full match, or with
    ``suffix`` a full match of the path or of its end after a dot (PEFT's rule for
    ``rank_pattern`` and ``alpha_pattern`` keys)."""
    regex = _suffix(pattern, field, origin) if suffix else compiled(pattern, field, origin)
    return [m for m in modules if regex.fullmatch(m)]


def _suffix(pattern: str, field: str, origin: str) -> Any:
    compiled(pattern, field, origin)  # the record's pattern itself, by its own length
    return _compiled(f"(?:.*\\.)?(?:{pattern})")


def literal(paths: Iterable[str]) -> str:
    """A pattern that fully matches exactly ``paths`` (escaped literals), or nothing."""
    escaped = [re.escape(p) for p in paths]
    return f"(?:{'|'.join(escaped)})" if escaped else NEVER


def literal_config(config: Mapping[str, Any], modules: Iterable[str],
                   origin: str) -> dict[str, Any]:
    """``config`` with every pattern replaced by the literal paths it selects among
    ``modules`` (the base's module paths): what PEFT is given, selecting the same modules."""
    paths = list(modules)
    out = dict(config)
    for field in ("target_modules", "exclude_modules"):
        if isinstance(config.get(field), str):
            out[field] = literal(selected(config[field], paths, field, origin))
    for field in ("rank_pattern", "alpha_pattern"):
        if config.get(field):
            rewritten: dict[str, Any] = {}
            for key, value in config[field].items():  # in order: PEFT takes the first match
                matched = selected(key, paths, f"{field} key", origin, suffix=True)
                if matched:
                    rewritten.setdefault(literal(matched), value)
            out[field] = rewritten
    return out
