"""How the columnar writer creates a missing table (delta_table.create_table, deltalake; no Spark,
no server): one CREATE commit whoever else creates it at the same moment."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from js_etl.delta import table as delta_table

ROWS = StructType([StructField("stream", StringType()), StructField("seq", LongType()),
                   StructField("kind", StringType())])


def create(table: Path, column: str, start: threading.Barrier, outcomes: list[str]) -> None:
    rows = StructType([*ROWS.fields, StructField(column, StringType())])
    start.wait()
    try:
        delta_table.create_table(str(table), rows, ["kind"])
        outcomes.append("created")
    except Exception as e:  # deltalake's errors have no common base
        outcomes.append(type(e).__name__)


def test_two_creates_at_once_make_one_commit_and_the_loser_raises(tmp_path: Path) -> None:
    """deltalake retries a commit that lost its version at the next one: a lost CREATE became
    a second commit replacing the first's id, schema and partitioning (23 of 30 of these races
    with the retries on, checked). Each race must leave version 0 only."""
    for race in range(30):
        table = tmp_path / f"t{race}"
        (table / "_js_etl").mkdir(parents=True)  # as a drain's lock leaves it
        start, outcomes = threading.Barrier(2), []
        # Two jobs' first runs: the same table, their own schemas.
        threads = [threading.Thread(target=create, args=(table, f"only_{i}", start, outcomes))
                   for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert sorted(p.name for p in (table / "_delta_log").glob("*.json")) == [
            "00000000000000000000.json"], outcomes
        assert outcomes.count("created") == 1, outcomes


@pytest.mark.parametrize(("conf", "name", "by_spark"), [
    ({}, "kind", False),
    ({"spark.sql.shuffle.partitions": "2"}, "a.b-c:é", False),
    ({"spark.databricks.delta.properties.defaults.enableDeletionVectors": "true"}, "kind", True),
    ({}, "a b", True),
    ({}, "a=b", True),
])
def test_spark_creates_what_only_it_creates_as_it_would(conf, name, by_spark) -> None:
    rows = StructType([*ROWS.fields[:2], StructField(name, StringType())])
    assert delta_table.needs_spark_to_create(rows, conf) is by_spark
