# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

## A local lounge with TensorFlow preloaded, a small training sweep over it, then stop.
demo: $(STAMP)
	$(PY) examples/demo.py

## The whole suite (lint, unit, integration with real engines, kernels and notebooks).
test: $(STAMP)
	$(PY) -m ruff check jupyter_lounge tests bench examples
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check jupyter_lounge tests bench examples
	$(PY) -m ruff format --check jupyter_lounge tests bench examples

## Launch benchmark against stock ipyparallel and Dask (several minutes; prints a table).
bench: $(STAMP)
	$(PY) bench/launch.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
