"""Model formats: how a model in each format is stored as plain tensors plus a manifest record
at push, and rebuilt from them at pull. ``base.py`` is the interface, ``table.py`` the one map
from a recorded format to its module (the only importer of one), ``common.py`` what several
share; one module per format: ``floats.py``, ``torchao.py``, ``dynamic.py`` (torch.ao),
``ctensors.py`` (compressed-tensors) and ``lora.py`` (PEFT adapters, with ``peft/``).
docs/development.md, "Adding a format", says how a new one is added."""
