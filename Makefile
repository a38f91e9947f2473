# The two commands a user needs: `make demo` and `make test`. Both set up .venv on first use.
.PHONY: setup demo test check lint format clean

VENV := .venv
BIN := $(VENV)/bin
DEMO_TABLE ?= data/digits
# The suite on 4 xdist workers (2 cores: tests wait on JVMs, subprocesses and paused stores much
# of the time); each xdist group of tests/conftest.py (HEAVY, HEAVY_IO, SPARK_CLUSTER and
# default_model) runs on one of them, one test at a time, beside the rest. A plain
# `pytest tests/x.py` runs in one process; add -n 4 --dist loadgroup to it to run in parallel.
# A crashed worker ends the run (its test fails either way): pytest-xdist 3.8 gave a replacement
# worker no work under loadgroup and waited for it, until CI's time limit.
PYTEST_ARGS ?= -n 4 --dist loadgroup --max-worker-restart=0

# The venv (scripts/setup_env.sh) and, beside it in the background (scripts/setup.sh), Debian's
# Chromium for the report test when it is missing, Azurite (npm, Azure Storage's emulator) for the
# Azure tests, and Debian's Prometheus and Pushgateway for the monitoring tests.
setup:
	@bash scripts/setup.sh

# Ingest scikit-learn's digits into a local Delta table (once), train the digits recipe on it,
# log and register it in ./mlflow.db.
demo: setup
	$(BIN)/keras-dl ingest sklearn-digits --to $(DEMO_TABLE) --mode ignore
	$(BIN)/python -m recipes.digits --set data.table=$(DEMO_TABLE)

# The import contracts (.importlinter: data flows one way), then the whole suite.
test: setup
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The quick tier for daily work: the import contracts and the tests not marked slow (no
# multi-process Horovod job, no full training), on the same workers.
check: setup
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check keras_dl keras_dl_petastorm_hook.py keras_dl_keras_hook.py recipes benchmarks tests
	$(BIN)/ruff format --check keras_dl keras_dl_petastorm_hook.py keras_dl_keras_hook.py recipes benchmarks tests

format: setup
	$(BIN)/ruff check --fix keras_dl keras_dl_petastorm_hook.py keras_dl_keras_hook.py recipes benchmarks tests
	$(BIN)/ruff format keras_dl keras_dl_petastorm_hook.py keras_dl_keras_hook.py recipes benchmarks tests

clean:
	rm -rf $(VENV) runs mlflow.db mlartifacts data spark-warehouse
