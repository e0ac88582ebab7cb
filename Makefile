# The two commands of the README: `make demo` and `make test`. Both create (or reuse) .venv,
# install the project from its own files, and resolve Delta's jars once into .jars/.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Delta's jars from the folder `make setup` resolves, for the demo, the tests and the bench: they
# run offline (an installed js-etl lets Spark fetch Delta with --packages instead).
export JS_ETL_JARS_DIR ?= $(CURDIR)/.jars/delta

.PHONY: setup demo test test-unit test-cluster lint docs soak bench bench-cluster clean nats-cli

# The real NATS CLI for the tests that run every `nats …` command js-etl or the README prints.
# The test fixture (tests/conftest.py: nats_cli) builds it the same way when it is missing.
NATS_CLI_VERSION := v0.5.1

setup: $(STAMP)
	$(BIN)/python -m js_etl.spark.jars "$(JS_ETL_JARS_DIR)" >/dev/null

# uv (pinned in the dev extra too) installs what pip would, from its cache and in parallel.
# pyspark first, by pip: PyPI has it as an sdist only, which pip builds once into its wheel cache
# and uv would build again on every clean install, its cache growing each time. Its version is
# pyproject.toml's pin of pyspark-client, kept identical to pyspark.
PYSPARK := $(shell sed -n 's/^ *"pyspark-client==\([0-9.]*\)",.*/\1/p' pyproject.toml)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'uv==0.13.9'
	$(BIN)/python -m pip install -q 'pyspark==$(PYSPARK)'
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev,airflow,docs]'
	touch $@

demo: setup
	$(BIN)/js-etl demo

# TEST_WORKERS pytest-xdist workers, each its own nats-server and SparkSession; an idle worker
# takes tests another has not started (tests/conftest.py puts the longest files first). Three on
# the 2-core box: much of a test's time is spent waiting on servers and subprocesses.
TEST_WORKERS ?= 3
# Lint and the docs site run beside the tests (their output follows the tests'); either failing
# fails `make test`. `make lint` alone answers in seconds.
test: setup
	@$(MAKE) --no-print-directory lint docs > $(VENV)/checks.log 2>&1 & checks=$$!; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not bench_cluster"; tests=$$?; \
	wait $$checks; checked=$$?; cat $(VENV)/checks.log; \
	if [ $$checked -ne 0 ]; then echo "make test: lint or the docs site failed (above)"; fi; \
	[ $$tests -eq 0 ] && [ $$checked -eq 0 ]

# Pure-logic tests only (tests/unit: no nats-server, no JVM): seconds, for quick feedback.
test-unit: setup
	$(BIN)/python -m pytest tests/unit

# Only the tests against a 3-node nats-server cluster and a Spark standalone cluster (tests/cluster,
# marker `cluster`); `make test` runs them too, all but the real run of `python -m tools.bench --cluster`.
test-cluster: setup
	$(BIN)/python -m pytest -m cluster tests/cluster

# The documentation site (mkdocs.yml) into site/, warnings as errors; part of `make test`.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# Types and lint, both configured in pyproject.toml; part of `make test`.
lint: setup
	$(BIN)/python -m ruff check js_etl tests jobs dags tools
	$(BIN)/python -m mypy
	$(BIN)/lint-imports

# Many randomized fault schedules (tests/support/schedules.py): each prints its seed and verdict, then
# "N passed, M failed". Replay one: JS_ETL_SCHEDULE_SEED=<seed> $(BIN)/python -m pytest
# tests/drain/test_fault_schedules.py. `make soak SEEDS="1 2 3"` runs those seeds instead; `S3=1`
# puts the tables in an S3 store (SeaweedFS) the soak starts.
SCHEDULES ?= 10
SEEDS ?=
soak: setup
	$(BIN)/python tests/support/schedules.py soak --schedules $(SCHEDULES) $(foreach s,$(SEEDS),--seed $(s)) $(if $(S3),--s3)

# The performance page's benchmark (tens of minutes here), four results files from which
# docs/performance.md and its charts are generated: js-etl against a simple peer, and as a Spark
# Connect client, on local and S3 tables, flat and rich schemas, 256 B and 4 KiB
# (docs/performance.json); js-etl against the client limit with 1, 2 and 4 fetch partitions
# (docs/performance-partitions.json); memory against backlog (docs/performance-memory.json);
# the Structured Streaming job against the drain (docs/performance-stream.json).
# `python -m tools.bench` runs other workloads.
bench: setup
	$(BIN)/python -m tools.bench --target local,s3 --schema flat,rich --messages 200000,50000 \
		--size 256,4096 --legs simple_peer,js_etl,js_etl_connect --repeat 3 \
		--json docs/performance.json
	$(BIN)/python -m tools.bench --partitions 1,2,4 --messages 200000,50000 --size 256,4096 \
		--legs client_limit,js_etl --repeat 2 --json docs/performance-partitions.json
	$(BIN)/python -m tools.bench --memory-check --json docs/performance-memory.json
	$(BIN)/python -m tools.bench --target local,s3 --messages 200000,50000 --size 256,4096 \
		--legs js_etl,js_etl_stream --repeat 2 --json docs/performance-stream.json
	$(BIN)/python -m tools.bench.page

# The drain job by spark-submit on a Spark standalone cluster with 1, 2 and 4 one-core executors
# against local[1], local[2], local[4] on the same 20,000 x 1 KiB messages (docs/benchmarks.md).
bench-cluster: setup
	$(BIN)/python -m tools.bench --cluster 1,2,4

nats-cli: .tools/bin/nats

.tools/bin/nats:
	GOBIN=$(CURDIR)/.tools/bin go install github.com/nats-io/natscli/nats@$(NATS_CLI_VERSION)
	touch .tools/bin/.nats-$(NATS_CLI_VERSION)

clean:
	rm -rf .demo spark-warehouse metastore_db derby.log .pytest_cache
