# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.installed
STAMP := $(VENV)/.installed-dev
# pip --quiet still relays setuptools' boxed notice for an editable install whose package_dir maps
# a folder ("Editable installation. Please be careful with folders..."): information, not a
# fault, that reads like one. It is filtered by its message in the build backend pip starts.
PIP = PYTHONWARNINGS="ignore:Editable installation" $(1) -m pip

.PHONY: demo test docs test-oldest-torch lint bench dist clean

# The base venv holds everything the README uses (`[all]`: torchvision for its quick start, the
# hf, export and mlflow extras); the dev extras come on top for `make test`.
$(BASE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(call PIP,$(PY)) install --quiet --upgrade pip
	$(call PIP,$(PY)) install --quiet -e '.[all]'
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(call PIP,$(PY)) install --quiet -e '.[dev]'
	touch $(STAMP)

# Push a small model into a throwaway registry (./.demo), pull it with device="auto", show it.
demo: $(BASE_STAMP)
	rm -rf .demo
	REGISTRY_HOME=$(CURDIR)/.demo $(PY) examples/demo.py

# The manual (docs/, mkdocs.yml) into site/; --strict turns a broken link, a page missing from
# the nav or a docstring the API reference cannot render into a failure, so `make test` runs it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

test: $(STAMP) docs
	$(PY) -m pytest

# The unit tests against the oldest torch pyproject.toml admits ("torch>=X" -> torch==X), in a
# venv of their own, so the declared floor is proven rather than hoped for (CI runs this too).
OLDEST_VENV ?= .venv-oldest-torch
TORCH_FLOOR := $(shell sed -n 's/^ *"torch>=\([0-9.]*\)".*/\1/p' pyproject.toml)
OLDEST_STAMP := $(OLDEST_VENV)/.installed-torch-$(TORCH_FLOOR)
$(OLDEST_STAMP): pyproject.toml
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(call PIP,$(OLDEST_VENV)/bin/python) install --quiet --upgrade pip
	$(call PIP,$(OLDEST_VENV)/bin/python) install --quiet "torch==$(TORCH_FLOOR)" -e '.[test]'
	touch $(OLDEST_STAMP)

test-oldest-torch: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/python -c "import torch; print('unit tests on torch', torch.__version__)"
	$(OLDEST_VENV)/bin/python -m pytest tests/unit

lint: $(STAMP)
	$(PY) -m ruff check registry server migrations tests benchmarks examples
	$(PY) -m mypy

# Benchmarks against the floors and peers of issue 6 (~800 MB model; BENCH_ARGS=--quick: ~50 MB).
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(call PIP,$(PY)) install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

# The release of the distribution torch-registry (import name `registry`): its sdist and wheel
# in dist/, as tests/integration/test_release.py builds and installs them.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .demo site .pytest_cache .mypy_cache .ruff_cache build dist
