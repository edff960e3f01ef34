from __future__ import annotations

import inspect

import registry
from registry import errors


def test_every_error_has_a_unique_code_and_is_exported() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.RegistryError)]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    assert {errors.ERRORS_BY_CODE[c.code] for c in classes} == set(classes)
    assert all(getattr(registry, c.__name__) is c for c in classes)
