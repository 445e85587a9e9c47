# Allmende: `make demo` runs the platform with demo data, `make test` runs the tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: help install vendor-echarts jars keycloak kubernetes demo up down test test-unit lint format bench schemas screenshots system-packages clean slurm-demo

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'
	@echo "  (the pages' ECharts is vendored in the package; the browser tests use the system chromium)"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed ## create the virtualenv with the project (editable) and its dev tools

# The pages' ECharts, vendored in the package with its licences (services/web/assets.py pins the version).
ECHARTS_VERSION := $(shell sed -n 's/^ECHARTS_VERSION = "\(.*\)".*/\1/p' services/web/assets.py)
vendor-echarts: ## refresh services/web/static/vendor from the npm registry (ECHARTS_VERSION in services/web/assets.py)
	tmp=$$(mktemp -d) && cd $$tmp && npm pack -s echarts@$(ECHARTS_VERSION) zrender@$(ECHARTS_VERSION) tslib@2.3.0 >/dev/null \
	  && for t in *.tgz; do mkdir -p $${t%.tgz} && tar -xzf $$t -C $${t%.tgz}; done && cd - >/dev/null \
	  && cp $$tmp/echarts-*/package/dist/echarts.min.js services/web/static/vendor/ \
	  && cp $$tmp/echarts-*/package/LICENSE services/web/static/vendor/echarts.LICENSE \
	  && cp $$tmp/echarts-*/package/NOTICE services/web/static/vendor/echarts.NOTICE \
	  && cp $$tmp/zrender-*/package/LICENSE services/web/static/vendor/zrender.LICENSE \
	  && cp $$tmp/tslib-*/package/LICENSE.txt services/web/static/vendor/tslib.LICENSE && rm -rf $$tmp

infra/kafka/lib/.fetched: infra/kafka/pom.xml
	mvn -q -B -f infra/kafka/pom.xml package
	touch $@

jars: infra/kafka/lib/.fetched ## fetch the Kafka broker jars (Maven Central, cached in ~/.m2)

infra/keycloak/dist/.fetched: infra/keycloak/pom.xml
	mvn -q -B -f infra/keycloak/pom.xml package
	touch $@

keycloak: infra/keycloak/dist/.fetched ## fetch and unpack the Keycloak server for the sign-in tests (Maven Central, 177 MB)

kubernetes: ## build etcd, kube-apiserver and Kueue from the Go module proxy for the Kueue tests (cached in infra/kubernetes/bin)
	infra/kubernetes/build.sh

demo: install jars ## start Kafka, the worker and the API on embedded ClickHouse; replay a real trace
	$(BIN)/allmende demo

up: install jars ## start the platform in the background (no replay)
	$(BIN)/allmende up

down: ## stop what demo/up started
	-$(BIN)/allmende down

test: install jars keycloak kubernetes system-packages ## run all tests (starts its own Kafka and Slurm; Kafka: unless KAFKA_BOOTSTRAP_SERVERS is set)
	$(BIN)/pytest --cov --cov-report=term:skip-covered

slurm-demo: install jars system-packages ## Slurm on localhost with the plugin, hooks and agent; a mixed workload against the platform (KEEP=1: leave it running)
	$(PY) -m allmende.integrations.slurm.demo $(if $(KEEP),--keep)

system-packages: ## Debian's chromium (browser tests) and Slurm 22.05 with munge, MariaDB, Lua (tests/slurm); as root
	@if [ "$$(id -u)" != 0 ]; then echo "not root: install chromium and infra/slurm/install.sh's packages yourself"; \
	else command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y --no-install-recommends chromium); infra/slurm/install.sh; fi

test-unit: install ## only the pure-domain tests
	$(BIN)/pytest tests/unit

lint: install ## ruff (bare imports banned), mypy --strict on the package, import-linter's layers
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

schemas: install ## regenerate the JSON Schema files from the event models
	$(PY) -m allmende.schemas.export

bench: install jars ## benchmarks: end-to-end ingest (local broker), fair-share recompute, dashboard reads
	$(PY) bench/ingest.py
	$(PY) bench/fairshare.py
	$(PY) bench/dashboard.py

screenshots: install jars ## docs/screenshot-*.png: the dashboard pages on a replayed trace (headless chromium)
	$(PY) docs/screenshots.py

clean: down
	rm -rf .allmende .pytest_cache .mypy_cache .ruff_cache .coverage htmlcov build dist
