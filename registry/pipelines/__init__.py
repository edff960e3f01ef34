"""The two pipelines, a pair: :mod:`.push` (a model to a committed version) and :mod:`.pull` (a
ref to a module on its device). Functions over ``(backend, settings, ...)``; the facade
(:class:`registry.Registry`) calls them and holds no step of its own.

The folder is ``pipelines`` and the modules are not ``registry/push`` or ``registry/pull``:
``registry.push`` and ``registry.pull`` are the package's verbs (PEP 562 names of
``registry/__init__``), and a submodule of that name would replace the verb with the module once
imported (tests/unit/test_exported_members.py).
"""
