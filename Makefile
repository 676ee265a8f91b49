# Pointsman — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PACKAGES := shared services/collector services/picker services/simulator tools/devstack tools/quality tools/testkit
CONFIG ?= config/local.yaml

.PHONY: help install run test test-unit test-integration lint fmt bench bench-collector bench-picker bench-quality bench-quality-all clean up down sim-calibration

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): requirements/runtime.txt requirements/dev.txt $(foreach p,$(PACKAGES),$(p)/pyproject.toml)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Pointsman needs Python >= 3.11; set PYTHON=")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# --no-deps + pip check: the lock must name every package, so nothing unpinned slips in.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/dev.txt
	@# xds-protos ships an older copy of opentelemetry/proto/...: whichever installs last owns the files,
	@# so opentelemetry-proto (the OTLP exporters' and the test receiver's) goes in again, last.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
		$$(grep '^opentelemetry-proto==' requirements/runtime.txt)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation $(foreach p,$(PACKAGES),-e $(p))
	$(BIN)/python -m pip check
	touch $(STAMP)

install: $(STAMP) ## create .venv with every package pinned and the console scripts in .venv/bin

run: install ## start the local stack in the foreground (Ctrl-C stops it); STACK_ARGS=--no-docker etc.
	$(BIN)/pointsman-stack --config $(CONFIG) $(STACK_ARGS)

lint: install ## ruff (format check + lint), the layer contracts (import-linter) and mypy
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy shared/src services/collector/src services/picker/src services/simulator/src tools/devstack/src tools/quality/src tools/testkit/src

fmt: install ## format and autofix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test-unit: install ## unit tests of every package
	$(BIN)/pytest -q --ignore=tests/integration

.PHONY: prometheus
PROMETHEUS_DEB := 2.42.0+ds-5+deb12u1
prometheus: ## Debian's prometheus (PROMETHEUS_DEB) for the dashboard checks, installed when missing (root, apt)
	@# The package's postinst would start a daemon on :9090, the picker's metrics port in config/local.yaml:
	@# a policy-rc.d answering 101 holds it for the install, and a daemon started anyway is stopped and
	@# disabled. No recommends: prometheus-node-exporter would take :9100, the collector's port.
	@if ! command -v prometheus >/dev/null && { [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; }; then \
		echo "make prometheus: no prometheus on PATH, and no root apt-get to install it: the dashboard tests will fail" >&2; fi
	command -v prometheus >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || { \
		policy=/usr/sbin/policy-rc.d; made=; \
		[ -e $$policy ] || { printf '#!/bin/sh\nexit 101\n' >$$policy && chmod +x $$policy && made=1; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			prometheus=$(PROMETHEUS_DEB); status=$$?; \
		[ -z "$$made" ] || rm -f $$policy; \
		if [ -d /run/systemd/system ]; then systemctl disable --now prometheus.service || true; \
		elif [ -x /etc/init.d/prometheus ]; then /etc/init.d/prometheus stop >/dev/null 2>&1 || true; fi; \
		exit $$status; }

test-integration: install prometheus ## integration tests through real Redis, simulator pods, collector, picker and Envoy
	$(BIN)/pytest -q tests/integration

test: lint test-unit test-integration ## lint + unit + integration tests

FUZZ_SECONDS ?= 60
FUZZ_CORPUS ?= /tmp/pointsman-fuzz
FUZZ_TARGETS := frames hpack body http1
.PHONY: fuzz
fuzz: install ## atheris on the native server's frame, HPACK and body parsers and the collector's HTTP/1.1 parser, FUZZ_SECONDS (60) each; crashes land in FUZZ_CORPUS
	@# A crash file goes in bench/fuzz/crashes/ named TARGET-what (the unit tests replay each); a
	@# target's seeds, if any, are in bench/fuzz/seeds/TARGET (read, never written).
	@for target in $(FUZZ_TARGETS); do \
		seeds=$(CURDIR)/bench/fuzz/seeds/$$target; [ -d $$seeds ] || seeds=; \
		mkdir -p $(FUZZ_CORPUS)/$$target && cd $(FUZZ_CORPUS) && \
		$(CURDIR)/$(BIN)/python $(CURDIR)/bench/fuzz/targets.py $$target $(FUZZ_CORPUS)/$$target $$seeds \
			-max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 || exit 1; \
		cd $(CURDIR); \
	done

bench: install ## only the in-process cost of one decision: schedule, director, ext_proc stream (bench/results/decision_cost.json); the others are bench-*
	$(BIN)/python bench/decision_cost.py

.PHONY: soak
SOAK_MODE ?= steady
SOAK_LOAD ?= 1.5,3,3
soak: install ## not in CI: SOAK_MINUTES (10) at 80% of one picker's capacity through Envoy; RSS, tasks, streams, connections, errors (bench/results/soak.*). SOAK_MODE=overload: flow control on, SOAK_LOAD (1.5,3,3: 3x twice, its RSS judged against its first run) times the slowed pods' capacity (measured straight at the pods), SOAK_MINUTES (2) each (bench/results/soak-overload.*)
ifeq ($(SOAK_MODE),overload)
	$(BIN)/python bench/soak_overload.py --loads $(SOAK_LOAD) --minutes $(or $(SOAK_MINUTES),2) $(SOAK_ARGS)
else
	$(BIN)/python bench/soak.py --minutes $(or $(SOAK_MINUTES),10) $(SOAK_ARGS)
endif

bench-collector: install ## the collector's CPU, scrapes/s and metric age at 200 pods (bench/results/collector.json)
	$(BIN)/python bench/collector.py

SCENARIO ?= bench/scenarios/multi-lora.yaml
bench-quality: install ## routing quality in virtual time: SCENARIO=FILE (default multi-lora), QUICK=1 for a short run
	$(BIN)/pointsman-quality $(if $(QUICK),--quick) $(SCENARIO)

bench-quality-all: install ## routing quality, every scenario in bench/scenarios/ (reports in bench/results/)
	$(BIN)/pointsman-quality bench/scenarios/*.yaml

BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: requirements/bench.txt
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/bench.txt
	$(BENCH_VENV)/bin/python -m pip check
	touch $@

bench-picker: install $(BENCH_VENV)/.installed ## picker behind Envoy vs Envoy alone vs vllm-router (bench/results/picker.json)
	@# wrk drives the closed loops; where it cannot be installed (not root, no apt) the bench falls back to
	@# its Python client and says so in the json.
	command -v wrk >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq wrk; } || true
	$(BIN)/python bench/picker.py $(BENCH_PICKER_ARGS)

.PHONY: bench-live
PERF_VENV := .venv-perf
# inference-perf needs Python >= 3.12: the first of these that is one (pyenv's shims fail unless selected).
PERF_PYTHON ?= $(firstword $(foreach p,python3.12 python3.13 $(sort $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3)),$(shell $(p) -c 'import sys; sys.version_info >= (3, 12) and print(sys.executable)' 2>/dev/null)))
$(PERF_VENV)/.installed: requirements/perf.txt
	@test -n "$(PERF_PYTHON)" || { echo "inference-perf needs Python >= 3.12: set PERF_PYTHON=" >&2; exit 1; }
	test -x $(PERF_VENV)/bin/python || $(PERF_PYTHON) -m venv $(PERF_VENV)
	$(PERF_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/perf.txt
	$(PERF_VENV)/bin/python -m pip check
	touch $@

bench-live: install $(BENCH_VENV)/.installed $(PERF_VENV)/.installed ## the scenario live (Redis, sim pods, collector, picker, Envoy; inference-perf) vs virtual time (bench/results/live-*.json)
	$(BIN)/python bench/live.py $(BENCH_LIVE_ARGS)

sim-calibration: install ## the simulator's profiles against the published vLLM figures, check by check
	$(BIN)/python -m pointsman_sim.calibration

# The chart's files/ are copies (a chart cannot read outside its folder, and symlinks break where a
# checkout has none): DEST=SOURCE, and a deploy test fails while a copy differs from its source.
CHART := deploy/helm/pointsman
CHART_FILES := \
	files/dashboards=deploy/grafana/dashboards \
	files/gateway-ca.yaml=deploy/k8s/components/picker-mtls/gateway-ca.yaml \
	files/picker-certificate.yaml=deploy/k8s/base/picker-certificate.yaml \
	files/picker-tls-proxy-mtls.yaml=deploy/k8s/components/picker-mtls/picker-tls-proxy.yaml \
	files/picker-tls-proxy.yaml=deploy/k8s/base/picker-tls-proxy.yaml \
	files/usage.lua=deploy/envoy/usage.lua
# The same for kustomize, which reads nothing outside a kustomization's directory (DEST from the top).
K8S_FILES := \
	deploy/k8s/overlays/envoy-gateway/usage.lua=deploy/envoy/usage.lua
.PHONY: chart-files
chart-files: ## copy the files the Helm chart's files/ and the kustomizations ship from their sources (after editing them)
	@for pair in $(CHART_FILES); do \
		dest=$(CHART)/$${pair%%=*}; src=$${pair#*=}; rm -rf $$dest; cp -R $$src $$dest; echo "$$dest <- $$src"; \
	done
	@for pair in $(K8S_FILES); do \
		dest=$${pair%%=*}; src=$${pair#*=}; cp $$src $$dest; echo "$$dest <- $$src"; \
	done

up: ## docker compose: build the images, start the whole stack, wait until every service is healthy
	docker compose up --build --detach --wait
	@echo "gateway: http://localhost:8080   grafana: http://localhost:3000   prometheus: http://localhost:9090"

down: ## docker compose: stop and remove the stack
	docker compose down --remove-orphans

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) $(BENCH_VENV) .mypy_cache .ruff_cache .pytest_cache
	rm -rf $(PERF_VENV)
