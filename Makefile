# The two commands: `make run` (the workflow on the tiny default) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# torch first, pinned, so that pip never resolves a newer (multi-GB) build; override for CUDA.
TORCH_SPEC ?= torch==2.13.0
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1

.PHONY: run test quick pull install help hwgptbench paper lock deps browser

help:
	@echo "make run   - install into $(VENV) and run the workflow (dvc repro -> snakemake)"
	@echo "make test  - install with the test extra, lint (ruff) and run the fast tests"
	@echo "make quick - the same without the tests that spawn snakemake, dvc or torchrun (e2e)"
	@echo "make pull  - fetch results from a DVC remote and mark them up to date: REMOTE=NAME, or"
	@echo "             REMOTE=URL of a published one, pulled read-only (https://..., s3://...;"
	@echo "             ENDPOINT=https://... for an S3-compatible store; docs/remotes.md)"
	@echo "make lock  - re-resolve pyproject.toml's ranges into requirements.lock (the installs' pins)"
	@echo "make deps  - write the code deps of dvc.yaml's and paper/dvc.yaml's stages from the code"
	@echo "             each stage runs (hwgptbench dvc-deps; --check only names those that differ)"
	@echo "make paper - the paper's multi-device figures and tables from the shipped tables only"
	@echo "             (results/paper/, report results/report-paper.html; resumes)"
	@echo "make hwgptbench - HW-GPT-Bench's s space: import its perplexities, measure 500 archs"
	@echo "                  here, surrogates, search, figures (docs/paper_scale.md; resumes)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"
	touch $@

# The exact versions every install resolves come from the lock (a pip constraints file written
# by `make lock`); pyproject.toml keeps ranges for users who `pip install` the package.
LOCK ?= requirements.lock
$(LOCK):
	@echo "$(LOCK) is missing: restore it (git checkout $(LOCK)) or write it with make lock"; false
# the export extra: ONNX Runtime checks and times the ONNX files the default run exports
$(VENV)/.installed: pyproject.toml $(LOCK) $(VENV)/.torch
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[export]'
	touch $@

$(VENV)/.installed-test: pyproject.toml $(LOCK) $(VENV)/.installed
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[test]'
	touch $@

# The browser test's Chromium and its driver (tests/test_explorer_browser.py): Debian's packages,
# found on the PATH, else installed with apt-get where this user is root; without them that test
# skips and says why. Checked on every `make test` (a command -v when they are there).
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's chromium and chromium-driver (the browser test)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    chromium chromium-driver >/dev/null; } \
	  || echo "apt-get could not install chromium: the browser test will skip"; \
	else echo "no chromium/chromedriver and no apt-get as root: the browser test will skip"; fi

# Resolve pyproject.toml's ranges afresh (with every extra but torchao's, which pins torch) in a
# scratch environment and write what it installed, torch aside (TORCH_SPEC pins it), sorted.
LOCK_EXTRAS := test,s3,cluster,hf,lm-eval,export
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet "$(TORCH_SPEC)"
	.lock-venv/bin/pip install --quiet -e '.[$(LOCK_EXTRAS)]'
	{ echo "# pip constraints for make install/test: written by \`make lock\`, do not edit"; \
	  .lock-venv/bin/pip freeze --exclude-editable | grep -viE '^(torch|pip|setuptools|wheel)=='\
	  | LC_ALL=C sort -f; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf .lock-venv

install: $(VENV)/.installed

run: $(VENV)/.installed
	hwgptbench unlock-stale
	dvc repro
	snakemake --report results/report.html
	@echo "figures and tables: results/*/figures/, results/*/tables/; report: results/report.html"
	hwgptbench status

# The paper's figures and tables from the tables shipped in the package: no training, measuring
# or network (docs/paper_scale.md). A DVC pipeline of its own (paper/dvc.yaml), so `make run`
# never runs it; rerun to resume an interrupted search.
paper: $(VENV)/.installed
	hwgptbench unlock-stale
	dvc repro paper/dvc.yaml
	snakemake paper --report results/report-paper.html
	@echo "figures and tables: results/paper/figures/, results/paper/tables/; report: results/report-paper.html"

# HW-GPT-Bench's published perplexities (dvc import, needs the network once) and the s space
# measured on this machine; rerun to resume (HWGPTBENCH_PARAMS: another overlay, e.g. a scale).
HWGPTBENCH_PARAMS ?= params/hwgptbench.yaml
hwgptbench: $(VENV)/.installed
	hwgptbench unlock-stale
	snakemake --configfile $(HWGPTBENCH_PARAMS) --resources dvc=1
	snakemake --configfile $(HWGPTBENCH_PARAMS) --report results/report-hwgptbench.html
	@echo "figures and tables: results/s/figures/, results/s/tables/; report: results/report-hwgptbench.html"

# REMOTE: a configured remote's name, or the URL of a published one, which hwgptbench pull adds
# to .dvc/config.local (read-only, verify = true); ENDPOINT: an S3-compatible store's endpoint.
# Both reach the recipe as environment variables, never as its text: the shell expands them as
# one quoted word each (a quote, `;` or `$` in a URL stays part of it). Make exports a variable
# set on its command line to every recipe, expanding it first (`$(shell ...)` in a URL would
# run): unexport keeps REMOTE and ENDPOINT out of every recipe's environment.
REMOTE ?=
ENDPOINT ?=
unexport REMOTE ENDPOINT
pull: export PULL_REMOTE := $(value REMOTE)
pull: export PULL_ENDPOINT := $(value ENDPOINT)
pull: $(VENV)/.installed
	hwgptbench pull $${PULL_REMOTE:+--remote "$$PULL_REMOTE"} \
	  $${PULL_ENDPOINT:+--endpoint-url "$$PULL_ENDPOINT"}

# test modules spread over TEST_WORKERS processes (pytest-xdist), one module per process, each
# on TEST_THREADS threads (two single-threaded workers on two cores: 549 -> 491 s, README), in
# the order tests/conftest.py collects them (the long modules first), not xdist's by test count
TEST_WORKERS ?= 2
TEST_THREADS ?= 1
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: $(VENV)/.installed-test browser
	ruff check .
	OMP_NUM_THREADS=$(TEST_THREADS) pytest $(XDIST)

# dvc.yaml's and paper/dvc.yaml's code deps from the code each stage's Snakemake jobs run
# (docs/workflow.md); the other deps and every comment stay as written
deps: $(VENV)/.installed
	hwgptbench dvc-deps

# the quick inner loop: every fast test but those that spawn snakemake, dvc or torchrun
quick: $(VENV)/.installed-test
	ruff check .
	OMP_NUM_THREADS=$(TEST_THREADS) pytest $(XDIST) -m 'not slow and not gpu and not e2e'
