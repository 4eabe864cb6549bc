# The two commands: `make run` (the workflow on the tiny default) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# torch first, pinned, so that pip never resolves a newer (multi-GB) build; override for CUDA.
TORCH_SPEC ?= torch==2.13.0
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1

.PHONY: run test pull install help hwgptbench

help:
	@echo "make run   - install into $(VENV) and run the workflow (dvc repro -> snakemake)"
	@echo "make test  - install with the test extra, lint (ruff) and run the fast tests"
	@echo "make pull  - fetch results from the DVC remote and mark them up to date"
	@echo "make hwgptbench - HW-GPT-Bench's s space: import its perplexities, measure 500 archs"
	@echo "                  here, surrogates, search, figures (docs/paper_scale.md; resumes)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	hwgptbench unlock-stale
	dvc repro
	snakemake --report results/report.html
	@echo "figures and tables: results/*/figures/, results/*/tables/; report: results/report.html"

# HW-GPT-Bench's published perplexities (dvc import, needs the network once) and the s space
# measured on this machine; rerun to resume (HWGPTBENCH_PARAMS: another overlay, e.g. a scale).
HWGPTBENCH_PARAMS ?= params/hwgptbench.yaml
hwgptbench: $(VENV)/.installed
	hwgptbench unlock-stale
	snakemake --configfile $(HWGPTBENCH_PARAMS) --resources dvc=1
	snakemake --configfile $(HWGPTBENCH_PARAMS) --report results/report-hwgptbench.html
	@echo "figures and tables: results/s/figures/, results/s/tables/; report: results/report-hwgptbench.html"

pull: $(VENV)/.installed
	hwgptbench pull

# test modules spread over TEST_WORKERS processes (pytest-xdist), one module per process, each
# on TEST_THREADS threads (two single-threaded workers on two cores: 549 -> 491 s, README)
TEST_WORKERS ?= 2
TEST_THREADS ?= 1
test: $(VENV)/.installed-test
	ruff check .
	OMP_NUM_THREADS=$(TEST_THREADS) pytest -n $(TEST_WORKERS) --dist loadfile
