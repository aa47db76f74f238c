# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-local lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

## A local lounge with TensorFlow preloaded, a small training sweep over it, then stop.
demo: $(STAMP)
	$(PY) examples/demo.py

## The whole suite (lint, unit, integration with real engines, kernels and notebooks, and a
## real 3-node Slurm testbed in network namespaces, brought up here and taken down after).
test: $(STAMP)
	$(PY) -m ruff check jupyter_lounge tests bench examples
	tests/infra/reup 3 8 > .testbed.env
	set -a; . ./.testbed.env; set +a; $(PY) -m pytest; rc=$$?; tests/infra/down; exit $$rc

## The same suite without the testbed (Slurm tests skip, saying why).
test-local: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check jupyter_lounge tests bench examples
	$(PY) -m ruff format --check jupyter_lounge tests bench examples

## Launch benchmarks against stock ipyparallel and Dask (several minutes; print tables).
bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) bench/launch.py
	tests/infra/reup 3 8 > .testbed.env
	set -a; . ./.testbed.env; set +a; $(PY) bench/slurm_launch.py; rc=$$?; $(PY) bench/ssh_launch.py || rc=$$?; tests/infra/down; exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
