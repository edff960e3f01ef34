# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.installed
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint bench clean

$(BASE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Push a small model into a throwaway registry (./.demo), pull it with device="auto", show it.
demo: $(BASE_STAMP)
	rm -rf .demo
	REGISTRY_HOME=$(CURDIR)/.demo $(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check registry server migrations tests benchmarks examples
	$(PY) -m mypy

# Benchmarks against the floors and peers of issue 6 (~800 MB model; BENCH_ARGS=--quick: ~50 MB).
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache
