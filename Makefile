# The two commands the README promises: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-external lint typecheck unit system-deps bench demo clean native
# Hot modules compiled with mypyc at install (setup.py; pure Python when that fails): a change to one
# reinstalls, so the build never lags its source.
NATIVE_SOURCES := $(shell sed -e 's/\#.*//' native-modules.txt)

run: $(VENV)/.installed
	$(BIN)/sluice serve

# pytest-xdist workers, each test file on one worker, files with slow tests first (tests/conftest.py):
# three on CI's two cores (most tests wait on sockets and subprocesses); TEST_WORKERS=0 runs in one
# process. Figures: docs/operations.md "Running the tests".
TEST_WORKERS ?= 3

test: system-deps $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

# The tests' external-kafka variants (client round trips, processor exactly-once and scale-out under
# kill -9) against a Kafka-protocol cluster you run, e.g. Apache Kafka in KRaft mode or Redpanda:
#   make test-external SLUICE_TEST_KAFKA_BOOTSTRAP=127.0.0.1:9092
# Not part of `make test`. Without the address every variant would skip, so the target refuses to run;
# kcat checks that the address answers Metadata first, so a wrong one fails in seconds, not per test.
EXTERNAL_TESTS := tests/clients/test_clients.py tests/processors/test_exactly_once.py tests/processors/test_scale_out.py

test-external: system-deps $(VENV)/.installed-dev
	@test -n "$(SLUICE_TEST_KAFKA_BOOTSTRAP)" || { echo "test-external: set SLUICE_TEST_KAFKA_BOOTSTRAP=host:port (a Kafka or Redpanda cluster)" >&2; exit 2; }
	@kcat -b "$(SLUICE_TEST_KAFKA_BOOTSTRAP)" -L -m 10 >/dev/null || { echo "test-external: no Kafka-protocol broker answers at $(SLUICE_TEST_KAFKA_BOOTSTRAP)" >&2; exit 2; }
	SLUICE_TEST_KAFKA_BOOTSTRAP="$(SLUICE_TEST_KAFKA_BOOTSTRAP)" $(BIN)/pytest -q -n 0 -k external-kafka $(EXTERNAL_TESTS)

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

$(VENV)/.installed: pyproject.toml setup.py native-modules.txt $(NATIVE_SOURCES) $(VENV)/bin/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml setup.py native-modules.txt $(NATIVE_SOURCES) $(VENV)/bin/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $(VENV)/.installed $@

# Compile native-modules.txt into this tree (a wheel built aside, its extensions unpacked here) without
# touching which tree the virtualenv's editable install points at: for work trees run with PYTHONPATH.
native: $(VENV)/bin/python
	rm -rf build/native
	$(BIN)/pip wheel -q --no-deps -w build/native .
	$(BIN)/python -c "import glob, zipfile; z = zipfile.ZipFile(glob.glob('build/native/*.whl')[0]); \
	  [z.extract(n, '.') for n in z.namelist() if n.endswith(('.so', '.native-sha256'))]"

# The docker-compose stack as local processes (no Docker engine needed); Ctrl-C stops it.
demo: $(VENV)/.installed
	$(BIN)/sluice demo $(DEMO_ARGS)

bench: $(VENV)/.installed-dev
	bash scripts/install-system-deps.sh bench
	$(BIN)/python -m bench.run_all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build
	find broker ingest clients processors sluice \( -name '*.so' -o -name '*.native-sha256' \) -delete
