# One venv, one install stamp: `make install` is idempotent and re-runs only when pyproject.toml changes.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test lint typecheck check bench soak clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[engine,otel,loadtest,dev]'
	touch $(STAMP)

run: install
	$(VENV)/bin/gateway dev --host 127.0.0.1 --port 9000

test: install
	$(PY) -m pytest -m "not soak and not bench" $(PYTEST_ARGS)

# ruff, and the import layers as contracts (pyproject.toml [tool.importlinter]).
lint: install
	$(VENV)/bin/ruff check gateway deploy loadtest tests
	$(VENV)/bin/ruff format --check gateway deploy loadtest tests
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy

check: lint typecheck

# ~16 min: 3 rounds, each level measured on every target back to back; cells are medians. BENCH_ARGS="--quick" (1 short round), "--repeat 5", ...
bench: install
	$(PY) -m loadtest.bench $(BENCH_ARGS)

soak: install
	$(PY) -m pytest -m soak $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
