"""What a state dict carries besides its tensors: key order and each module's ``_metadata``.

``nn.Module.state_dict()`` returns an ``OrderedDict`` in model order whose ``_metadata``
attribute maps each module's prefix (``""`` for the root, ``"features.0"``) to
``{"version": N}``. ``load_state_dict`` hands that version to each module's
``_load_from_state_dict``: BatchNorm reads it to tell an old checkpoint from a current one, and
torchvision's MNASNet refuses to load without it. Push records both facts in the manifest
(``module_metadata`` and ``key_order``) and pull gives them back (:func:`ordered_state`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

MAX_VERSION = 2**31 - 1

ModuleMetadata = dict[str, dict[str, int]]


def module_metadata_of(state: object) -> ModuleMetadata:
    """The ``{prefix: {"version": N}}`` a state dict carries (``{}`` when it carries none).

    Only integer versions are kept: they are what ``_load_from_state_dict`` reads, and all a
    manifest may hold (plain JSON, bounded).
    """
    return clean_module_metadata(getattr(state, "_metadata", None))


def clean_module_metadata(raw: object) -> ModuleMetadata:
    """``raw`` (a ``_metadata`` mapping, or anything) reduced to ``{prefix: {"version": N}}``."""
    if not isinstance(raw, Mapping):
        return {}
    out: ModuleMetadata = {}
    for prefix, entry in raw.items():
        version = entry.get("version") if isinstance(entry, Mapping) else None
        if isinstance(prefix, str) and isinstance(version, int) \
                and not isinstance(version, bool) and 0 <= version <= MAX_VERSION:
            out[prefix] = {"version": version}
    return out


def ordered_state(state: Mapping[str, Any], manifest: Mapping[str, Any],
                  owners: Mapping[str, str] | None = None) -> OrderedDict[str, Any]:
    """``state`` as ``state_dict()`` would give it: in the pushed key order, with ``_metadata``.

    A quantized version records the order of its stored components (``0._weight_qdata``,
    ``0._weight_scale``); where ``state`` holds the module key they were split from instead
    (``owners``: component -> module key), that key takes its first component's place.
    Versions pushed before key order was recorded keep the order ``state`` has.
    """
    order: Iterable[str] = manifest.get("key_order") or ()
    owners = owners or {}
    out: OrderedDict[str, Any] = OrderedDict()
    for stored in order:
        key = stored if stored in state else owners.get(stored, stored)
        if key in state and key not in out:
            out[key] = state[key]
    for key, value in state.items():
        if key not in out:
            out[key] = value
    metadata = manifest.get("module_metadata")
    if metadata:
        out._metadata = OrderedDict(  # type: ignore[attr-defined]
            (prefix, dict(entry)) for prefix, entry in metadata.items())
    return out
