# ptspeed: `make run` runs the default matrix, `make test` runs the tests.
# Both set up the virtualenv first (.venv, Python >= 3.11) if it is missing or stale.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ptspeed-setup
# The host environment's PyTorch: the current release, with its torchvision, and the same
# transformers as every benchmark environment (envs/*.txt).
HOST_TORCH := torch==2.14.1 torchvision==0.29.1 transformers==4.46.3

# Container recipes and the shell scripts they run (make lint checks them).
RECIPES := $(wildcard docker/*Dockerfile*)
SHELL_SCRIPTS := docker/install.sh .ci/packages.sh .ci/podman.sh .ci/slurm.sh .ci/run

# make gpu-check: every CUDA path once, in priority order within BUDGET_S seconds (DEVICE=cpu: its
# CPU half; ENVS=host,torch-2.0: a subset of the environments present; PATHS=eager,cudagraphs: a
# subset of the paths). It runs from a plain
# checkout with whatever Python has torch: the project's .venv where it exists, else $(PYTHON).
DEVICE ?= cuda
ENVS ?=
PATHS ?=
BUDGET_S ?= 360
CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

.PHONY: setup run test test-fast lint format clean gpu-check

setup: $(STAMP)

# The host torch by pip, which follows the machine's own pip configuration (a site's index or
# wheel directory); the rest by uv, which resolves and installs them in seconds where pip takes a
# minute. Both compile to bytecode, so that no test or cell compiles modules at import time.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(HOST_TORCH) uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[workflow,dev]'
	touch $@

run: $(STAMP)
	$(BIN)/snakemake --cores all

# make test: every test that can run here (a missing GPU, cluster or image builder skips its
# tests). PYTEST_ARGS adds options, e.g. PYTEST_ARGS=--durations=25 as CI does. The tests marked
# `alone` judge the machine's load: they run first, by themselves; then the rest run on
# TEST_WORKERS processes (pytest-xdist; one test file per worker at a time, so a file's
# module-scoped runs happen once; in the order tests/conftest.py gives them, long ones first).
# TEST_WORKERS=0: all in this process, one after another.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -m "not alone" -n $(TEST_WORKERS) --maxprocesses 8 \
		--dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# make test-fast: the loop to run while editing (about a minute): every module's unit tests,
# without Snakemake runs, venv builds, downloads, real models or compiles. tests/conftest.py
# fails a test of this tier that starts Snakemake, builds a venv or opens a remote connection.
FAST_TESTS := not (slow or workflow or venv or network or browser or container or slurm \
	or crossversion or cuda)
test-fast: $(STAMP)
	PTSPEED_TEST_TIER=fast $(BIN)/python -m pytest -m "$(FAST_TESTS)" $(PYTEST_ARGS)

gpu-check:
	PYTHONPATH=src $(CHECK_PYTHON) scripts/gpu_check.py --device $(DEVICE) --envs "$(ENVS)" \
		--paths "$(PATHS)" --budget-s $(BUDGET_S)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check .
	$(BIN)/snakemake --lint
	$(BIN)/python scripts/docs.py --check
	$(BIN)/hadolint $(RECIPES)
	$(BIN)/shellcheck $(SHELL_SCRIPTS)

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/snakefmt .

clean:
	rm -rf results .snakemake .pytest_cache
