# The two commands the README promises: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test lint typecheck unit system-deps bench demo clean

run: $(VENV)/.installed
	$(BIN)/sluice serve

test: system-deps $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

system-deps:
	bash scripts/install-system-deps.sh

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); bash scripts/install-system-deps.sh venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml $(VENV)/bin/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/bin/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $(VENV)/.installed $@

# The docker-compose stack as local processes (no Docker engine needed); Ctrl-C stops it.
demo: $(VENV)/.installed
	$(BIN)/sluice demo $(DEMO_ARGS)

bench: $(VENV)/.installed-dev
	bash scripts/install-system-deps.sh bench
	$(BIN)/python -m bench.run_all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
