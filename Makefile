# pdd-operator: every command a developer or CI needs. `make test` and `make demo` work on a
# fresh machine: they create the venv and build the pinned control-plane binaries themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml hack/constraints.txt 2>/dev/null | sha1sum | cut -c1-12)
export PYTHONPATH := $(CURDIR)/operator
CLUSTER_DIR ?= $(CURDIR)/.tmp/cluster
NIXL_WHEEL ?= nixl-cu12==1.5.1
PYTEST := $(PY) -m pytest
# TEST_WORKERS=3: `make test` runs its modules on that many pytest-xdist workers, each with a
# control plane and fleet of its own (a session fixture per worker), a module's tests on one
# worker; the modules that run many engine processes share one worker, one after another
# (tests/conftest.py). Clean-clone runs on a 2-core machine took about 27 min with 3 or 4
# workers against 46-52 in one process, CPU-bound; a 3-worker run of 984face took 37 min and
# failed 4 tests whose pods took minutes to become Ready, one of 2d2bd22 (the pod-heavy
# modules on one worker) 39 min against 61 serial, with 2 tests that read a state before it
# was reached (both now wait for it). Off by default until three consecutive clean-clone
# runs pass.
TEST_WORKERS ?= 1
# --no-loadscope-reorder: xdist would otherwise hand out the modules with the most tests first,
# which leaves the long modules of few tests (tests/conftest.py, LONG_MODULES) for last.
XDIST := $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder,)
ONCE ?=

.PHONY: test-prebuild reliability help venv binaries generate check-generated lint unit integration nixl chart docs test demo cluster cluster-down bench e2e-kind clean images

help:
	@echo "make demo       local control plane + simulated GPU nodes + operator + example (ONCE=1 exits when Ready)"
	@echo "make test       every test tier (installs everything it needs)"
	@echo "make cluster    start the local control plane in the background (kubeconfig: $(CLUSTER_DIR)/kubeconfig)"
	@echo "make cluster-down  stop it"
	@echo "make generate   regenerate crds/, the chart's CRDs and child RBAC, manifests/ and docs/api.md"
	@echo "make bench      benchmarks (SCALE=small for a short run)"
	@echo "make images     build the operator, sidecar and router images (docker, else podman) and list them"

$(STAMP): pyproject.toml hack/constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c hack/constraints.txt -e '.[dev,nixl]'
	# The NIXL wheel declares torch; the CPU tests need only its UCX core, so no deps.
	$(PY) -m pip install -q --no-deps -c hack/constraints.txt $(NIXL_WHEEL) nixl==1.5.1
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

binaries:
	@bash hack/fetch-binaries.sh

generate: venv
	$(PY) -m pdd_operator.cli generate

check-generated: venv
	$(PY) -m pdd_operator.cli generate --check

LINT_PATHS := $(wildcard operator tests bench hack)

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy --strict operator
	$(VENV)/bin/lint-imports

unit: venv
	$(PYTEST) tests/unit -q

nixl: venv
	$(PYTEST) tests/nixl -q

integration: venv binaries
	$(PYTEST) tests/integration -q

chart: venv binaries
	$(PYTEST) tests/chart -q

# Every command README.md and docs/*.md tell a user to run, as written (tests/docs).
docs: venv binaries
	$(PYTEST) tests/docs -q

# The steps before pytest run inside the recipe, timed, so the summary pytest prints at the end
# shows their seconds beside the tiers' (tests/conftest.py reads PDD_MAKE_STEPS_MS). pytest
# has a line of its own so that `make -n test` runs none of it. No check-generated step: the
# chart tier's test_committed_files_match_the_generator runs the same `generate --check`.
test: venv binaries
	@mkdir -p .tmp && : > .tmp/make-steps; \
	for step in lint test-prebuild; do \
	  start=$$(date +%s%N); $(MAKE) --no-print-directory $$step || exit $$?; \
	  echo "$$step=$$(( ($$(date +%s%N) - start) / 1000000 ))" >> .tmp/make-steps; \
	done
	PDD_MAKE_STEPS_MS="$$(paste -sd, .tmp/make-steps)" $(PYTEST) tests -q -p no:cacheprovider $(XDIST)

# What the tiers build, built once before pytest starts, each once: the Go health tool of the
# CD health tests, and the images (the image tier and the docs tier's `make images` then find
# them built). On a fresh machine these take minutes; beside parallel workers' control planes
# they took over ten and ran into the tests' time limits, and two workers built the same images.
test-prebuild: venv
	$(PY) tests/helpers/health_tool.py >/dev/null
	bash hack/images.sh >/dev/null

demo: venv binaries
	$(PY) hack/demo.py --state-dir $(CLUSTER_DIR)-demo $(if $(ONCE),--once,)

cluster: venv binaries
	$(PY) -m pdd_localcluster up --state-dir $(CLUSTER_DIR) --background
	@echo "export KUBECONFIG=$(CLUSTER_DIR)/kubeconfig"

cluster-down:
	@test -x $(PY) && $(PY) -m pdd_localcluster down --state-dir $(CLUSTER_DIR) || true

bench: venv binaries
	$(PY) bench/run.py --scale $(or $(SCALE),full) --out bench/results

# Every Dockerfile target, tagged with the chart's appVersion; only what changed is rebuilt
# (hack/images.sh says how, and where the base image comes from without Docker Hub).
images:
	bash hack/images.sh

# Needs a Docker engine; the test skips with the reason printed where there is none.
e2e-kind: venv binaries
	PDD_E2E_KIND=1 $(PYTEST) tests/e2e -q -s -rs

# Regenerates docs/reliability.md from real runs (bad inputs, faults, rollouts, RBAC).
reliability: venv binaries
	$(PY) hack/reliability_report.py

clean: cluster-down
	rm -rf .tmp
