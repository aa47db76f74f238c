# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-local lint labext-test chromium bench clean

# `pip install -e` also builds the JupyterLab extension (labextension/, with jlpm and
# Node.js), so a change to its sources reinstalls; the built one is removed first, as the
# build hook skips the build where one exists (pyproject.toml's skip-if-exists).
$(STAMP): pyproject.toml labextension/package.json labextension/yarn.lock \
		$(wildcard labextension/src/*.ts) $(wildcard labextension/style/*)
	rm -rf jupyter_lounge/labextension
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

## A local lounge with TensorFlow preloaded, a small training sweep over it, then stop.
demo: $(STAMP)
	$(PY) examples/demo.py

## The whole suite (lint, unit, integration with real engines, kernels and notebooks, and a
## real 3-node Slurm testbed in network namespaces, brought up here and taken down after);
## the fast tests (marked fast: seconds, no engine) run before the testbed comes up.
test: $(STAMP) chromium
	$(PY) -m ruff check jupyter_lounge tests bench examples
	$(MAKE) --no-print-directory labext-test
	$(PY) -m pytest -m fast
	tests/infra/reup --fresh 3 8 > .testbed.env
	set -a; . ./.testbed.env; set +a; $(PY) -m pytest -m "not fast"; rc=$$?; tests/infra/down; exit $$rc

## The same suite without the testbed (Slurm tests skip, saying why).
test-local: $(STAMP)
	$(MAKE) --no-print-directory labext-test
	$(PY) -m pytest

## The sidebar's browser tests drive Debian's Chromium (Playwright cannot download browsers).
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

## The sidebar's unit tests (jest; the model and format code of labextension/src).
labext-test: $(STAMP)
	cd labextension && $(CURDIR)/$(VENV)/bin/jlpm install && $(CURDIR)/$(VENV)/bin/jlpm test

lint: $(STAMP)
	$(PY) -m ruff check jupyter_lounge tests bench examples
	$(PY) -m ruff format --check jupyter_lounge tests bench examples

## Launch benchmarks against stock ipyparallel and Dask (several minutes; print tables).
bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) bench/launch.py
	$(PY) bench/secure_launch.py
	$(PY) bench/map_rate.py
	tests/infra/reup 3 8 > .testbed.env
	set -a; . ./.testbed.env; set +a; $(PY) bench/sync.py || { tests/infra/down; exit 1; }
	set -a; . ./.testbed.env; set +a; $(PY) bench/slurm_launch.py; rc=$$?; $(PY) bench/ssh_launch.py || rc=$$?; tests/infra/down; exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
	rm -rf jupyter_lounge/labextension labextension/node_modules labextension/lib \
		labextension/tsconfig.tsbuildinfo labextension/.yarn
