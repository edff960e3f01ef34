"""Modules built with their parameters on ``meta``: no memory, no random init.

:func:`empty_parameters` is used wherever a module is built only to be filled or measured: a
pull (:mod:`registry.model.materialize`), a push checking that a recorded architecture
rebuilds (:mod:`registry.model.architectures`), LoRA layers attached to a base
(:mod:`registry.formats.lora`).

torch is imported on first use, not with this module: :mod:`registry.model.architectures` is read
by manifest validation, which the catalog commands of the CLI run without torch. Whoever
enters the context builds a module, so torch is loaded by then.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

# torch.nn.init functions skipped for meta tensors while a module is built: on meta they compute
# nothing, yet Linear's reset_parameters alone runs ~0.3 ms of Python decompositions per layer.
INIT_NAMES = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
              "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
              "kaiming_normal_", "orthogonal_", "sparse_")

_patch_lock = threading.Lock()
_patch_users = 0
_building = threading.local()
# (original, patched) for nn.Module.register_parameter and each nn.init function, made once.
_swaps: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}


def _building_here() -> bool:
    return bool(getattr(_building, "depth", 0))


def _make_swaps() -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    import torch
    from torch import nn

    original_register = nn.Module.register_parameter

    def register_on_meta(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original_register(self, name, param)
        if _building_here() and param is not None and not param.is_meta:
            self._parameters[name] = type(param)(param.to("meta"),
                                                 requires_grad=param.requires_grad)

    def skipping_meta(original: Callable[..., Any]) -> Callable[..., Any]:
        def init(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if _building_here() and isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
            return original(tensor, *args, **kwargs)

        return init

    swaps = {"register_parameter": (original_register, register_on_meta)}
    for name in INIT_NAMES:
        if hasattr(nn.init, name):
            original = getattr(nn.init, name)
            swaps[name] = (original, skipping_meta(original))
    return swaps


def _patch(on: bool) -> None:
    from torch import nn

    if not _swaps:
        _swaps.update(_make_swaps())
    for name, (original, patched) in _swaps.items():
        owner: Any = nn.Module if name == "register_parameter" else nn.init
        setattr(owner, name, patched if on else original)


@contextlib.contextmanager
def empty_parameters() -> Iterator[None]:
    """Create parameters on ``meta`` while a module is built in this thread; buffers stay real.

    Non-persistent buffers (computed in ``__init__``, absent from state dicts) keep their values,
    which a plain ``torch.device("meta")`` context would lose. The patch on
    ``nn.Module.register_parameter`` acts only in the thread that entered the context, so a
    model built concurrently elsewhere (a training thread, another request) is untouched.
    ``torch.nn.init`` functions return a ``meta`` tensor untouched in that thread.
    """
    global _patch_users
    with _patch_lock:
        if _patch_users == 0:
            _patch(True)
        _patch_users += 1
    _building.depth = getattr(_building, "depth", 0) + 1
    try:
        yield
    finally:
        _building.depth -= 1
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                _patch(False)
