"""The public surface: ``registry.__all__`` is what the package exports, and every module-level
verb takes exactly the arguments of the facade method it forwards to."""

from __future__ import annotations

import inspect

import registry
from registry import _api
from registry.client import Registry

VERBS = [name for name, obj in vars(_api).items()
         if inspect.isfunction(obj) and obj.__module__ == _api.__name__
         and not name.startswith("_") and name != "default_registry"]


def test_all_is_sorted_and_exactly_the_public_names() -> None:
    assert registry.__all__ == sorted(registry.__all__)
    # The names that need torch load on first use (PEP 562); touch each, then none may be missing
    # and no other public name may have appeared.
    for name in registry.__all__:
        getattr(registry, name)
    assert sorted(dir(registry)) == sorted({*vars(registry), *registry.__all__})
    public = {name for name in vars(registry) if not name.startswith("_")
              and not inspect.ismodule(getattr(registry, name))}
    assert set(registry.__all__) == public


def test_every_facade_operation_has_a_module_level_verb() -> None:
    facade = {name for name, _ in inspect.getmembers(Registry, inspect.isfunction)
              if not name.startswith("_") and name not in ("close",)}
    assert facade == set(VERBS)
    assert set(VERBS) <= set(registry.__all__)


def test_verbs_take_the_facade_signatures() -> None:
    for name in VERBS:
        verb = inspect.signature(getattr(registry, name), eval_str=True)
        method = inspect.signature(getattr(Registry, name), eval_str=True)
        expected = list(method.parameters.values())[1:]  # without self
        assert list(verb.parameters.values()) == expected, name
        assert verb.return_annotation == method.return_annotation, name


def test_the_verbs_push_and_pull_stay_functions_beside_the_pipelines() -> None:
    # The pipelines live in registry/pipelines/, not registry/push or registry/pull: importing a
    # submodule binds its name on the package and would replace the verb with a module.
    import importlib
    import importlib.util

    for verb in ("push", "pull"):
        importlib.import_module(f"registry.pipelines.{verb}")
        assert importlib.util.find_spec(f"registry.{verb}") is None, verb
        assert inspect.isfunction(getattr(registry, verb)), verb
        assert getattr(registry, verb) is getattr(_api, verb), verb
