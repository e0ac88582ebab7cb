# The two commands of the README: `make demo` and `make test`. Both create (or reuse) .venv,
# install the project from its own files, and resolve Delta's jars once into .jars/.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test soak bench clean

setup: $(STAMP)
	$(BIN)/python -m js_etl.spark.jars >/dev/null

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,airflow]'
	touch $@

demo: setup
	$(BIN)/js-etl demo

test: setup
	$(BIN)/python -m pytest

# Many randomized fault schedules (tests/schedules.py): each prints its seed and verdict, then
# "N passed, M failed". Replay one: JS_ETL_SCHEDULE_SEED=<seed> $(BIN)/python -m pytest
# tests/test_fault_schedules.py. `make soak SEEDS="1 2 3"` runs those seeds instead.
SCHEDULES ?= 10
SEEDS ?=
soak: setup
	$(BIN)/python tests/schedules.py soak --schedules $(SCHEDULES) $(foreach s,$(SEEDS),--seed $(s))

# Full-size benchmark (a few minutes): js-etl against the bare pull+ack loop and a simple peer.
bench: setup
	$(BIN)/js-etl bench

clean:
	rm -rf .demo spark-warehouse metastore_db derby.log .pytest_cache
