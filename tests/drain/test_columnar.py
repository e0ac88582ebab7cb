"""The columnar writer (js_etl/drain/writers/columnar.py) on a real nats-server, Spark and
Delta: it must write what the Spark writer writes, commit like it, and keep every rule of the round.

The exactly-once tests (test_faults.py, test_exactly_once.py, the fault schedules) run on the
writer ``target.writer=auto`` picks for their JSON tables: this one.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pytest
from drains import assert_exactly_once, config_for, events, setup_stream
from payloads import PAYLOADS
from streams import add_stream, publish_and_wait, settled

from js_etl.config import load_config
from js_etl.decode.reasons import MALFORMED
from js_etl.delta.files import WrittenFile
from js_etl.delta.keys import range_keys
from js_etl.delta.rules import table_problem
from js_etl.delta.table import (
    CommitTag,
    DeltaTarget,
    _deltalake_table,
    create_empty,
    create_table,
    files_holding_seqs,
    log_actions,
)
from js_etl.drain.run import run_drain
from js_etl.drain.writers import columnar_plan
from js_etl.errors import ConfigError, TerminalError, TransientError
from js_etl.jetstream import ConsumerConfig
from js_etl.schema import ACK_KEY_COLUMNS

pytestmark = pytest.mark.slow

SCHEMA = "id BIGINT, kind STRING, n INT, ok BOOLEAN, x DOUBLE"


def config(names: Any, url: str, table: Path, consumer: str, *extra: str) -> Any:
    return load_config(None, [
        f"nats.servers={url}", f"source.stream={names.stream}", f"source.consumer={consumer}",
        "source.create_consumer=true", f"target.path={table}", "fetch.partitions=2",
        "fetch.batch=100", "fetch.pull_timeout=2", "decode.format=json",
        f"decode.schema={SCHEMA}", *extra], environ={})


def nested(depth: int) -> bytes:
    """A good object whose ignored field nests ``depth`` arrays."""
    return b'{"id": 1, "deep": ' + b"[" * depth + b"]" * depth + b"}"


DEEP_KIND = b'{"id": 70, "kind": ' + b"[" * 400 + b"]" * 400 + b"}"
# Beyond the data source's hostile payloads: what the columnar decoder screens or falls back on.
MORE_PAYLOADS = [
    b'{\n  "id": 40,\n  "kind": "pretty"\n}',  # pretty-printed over several lines
    b'{"id": 41}\n',
    *(nested(d) for d in (100, 255, 256, 257, 900, 997, 998, 999, 1000, 1001, 5000)),
    b'{"id": 2, "deep": "' + b"[" * 2000 + b'"}',  # brackets in a string do not nest
    b'{"id": 99999999999999999999}',  # beyond BIGINT
    b'{"id": 42, "x": 1e400}',  # beyond the doubles
    b'{"id": 43, "x": ' + b"9" * 400 + b"}",  # an integer literal beyond the doubles
    b'{"id": -0, "x": -0}',
    b'{"id": 44, "n": 2147483648}',  # beyond INT
    b'{"id": 45, "n": 1.0}',
    b'{"id": 46, "ok": "true"}',
    b'{"id": 47, "kind": 7}',  # a number into a STRING
    b'{"id": 48, "kind": {"a": [1, 2]}}',  # an object into a STRING
    b'{"id": 64, "kind": {"a": "\xc3\xa9\\u00e9 \\" \\n"}}',  # ... with unicode and escapes
    b'{"id": 65, "kind": [1.50, 1e2, 0.1, true, null]}',  # numbers as written, into a STRING
    b'{"id": 66, "kind": {"a": "\\u0001\\b\\f\\t\\/\\u2028"}}',
    b'{"id": 67, "kind": {"\\u00e9": 1.0, "b": -0.0, "c": 1E+2, "d": 12345678901234567890}}',
    b'{"id": 68, "kind": [1e309, -1e400, 123456789012345678901234567890.5]}',
    b'{"id": 69, "kind": [1e-5, 1e20, 0.0009, 123.456, 1e7, 9999999.0, 0.001, -2.5e-3]}',
    b'{"id": 49, "kind": "\\ud800"}',  # a lone surrogate
    b'{"id": 50, "kind": "tab\there"}',  # a raw control character in a string
    b'{"id": 51, "id": 52}',  # a repeated key
    b'{"id": 53, "kind": "a/b=c d"}',  # not a directory name
    b'{"id": 54, "x": NaN}',
    b'{"id": 55, "x": Infinity}',
    b'{"id": 56}{"id": 57}',
    b'{"id": 58}, {"id": 59}, {"id": 60}',
    b'{"id": 61, "kind": "\xc3\xa9t\xc3\xa9"}',
    b'{"id": 62, "kind": "' + "é".encode() * 3 + b'"}',
    b'\xef\xbb\xbf{"id": 63}',  # a UTF-8 byte order mark
    # What a break-it review (2026-11-25) found the two writers doing differently, or the
    # columnar fetch task crashing on (a whole batch then stayed in no table):
    DEEP_KIND,  # deep, into a STRING
    b'{"\\ud800": 1}',  # a lone surrogate in a name the reason lists
    b'{"id": 71, "n": "x", "n": 5}',  # a repeated name, its first value of the wrong type
    b'{"a": 1, "a": 2}',  # Spark lists both: "(it has: a, a)"
    b'{"id": 72, "' + b"k" * 50_001 + b'": 1}',  # a name beyond Spark's parser's 50,000
    b'{"id": 73, "' + b"k" * 50_000 + b'": 1}',
    b'{"id": 74, "x": 1.' + b"5" * 1000 + b"}",  # 1,001 digits with a point
    b'{"id": 75, "y": 1' + b"2" * 600 + b"." + b"5" * 600 + b"}",  # ... in an ignored field
    b'{"id": 76, "x": 1.' + b"5" * 999 + b"}",  # 1,000 digits: a number
    b'{"id": 77, "kind": ""}',  # partition values Spark writes as null
    b'{"id": 78, "kind": "__HIVE_DEFAULT_PARTITION__"}',
]


def table_rows(spark: Any, path: Path, *, drop: tuple[str, ...] = ()) -> pa.Table:
    """The table's rows in seq order, its columns by name, as Arrow: compared as values (rows as
    Python would hide a repeated MAP key, its dict keeping one pair, and a year past 9999)."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(str(path))
    columns = [F.col(f"`{c}`") for c in sorted(df.columns) if c not in drop]  # `a.b`: one
    return df.select(*columns).orderBy("seq").toArrow()


def committed_files(spark: Any, table: Path) -> set[str]:
    """The data files the table's current snapshot names, as local paths."""
    uris = spark.read.format("delta").load(str(table)).inputFiles()
    return {unquote(uri.removeprefix("file:")) for uri in uris}


def columnar_files(table: Path, run_id: str) -> set[str]:
    """The Parquet files a run's fetch tasks wrote (columnar_plan.ColumnarPlan.file_prefix)."""
    return {str(p) for p in table.rglob(f"part-{run_id}-r*.parquet")}


def schema_of(spark: Any, path: Path) -> list[tuple[str, str]]:
    df = spark.read.format("delta").load(str(path))
    return sorted((f.name, f.dataType.simpleString()) for f in df.schema.fields)


@pytest.mark.parametrize("partition_by", ["[]", "[to_date(published_at) AS date, kind]"])
def test_both_writers_write_the_same_rows_and_dead_letters(partition_by, spark, js, names,
                                                           nats_server, tmp_path):
    add_stream(js, names)
    good = [json.dumps({"id": i, "kind": f"k{i % 3}", "n": i, "ok": i % 2 == 0,
                        "x": i / 7}).encode() for i in range(300)]
    payloads = [*good[:150], *PAYLOADS, *MORE_PAYLOADS, *good[150:]]
    if "kind" in partition_by:  # Spark's writer cannot name a directory after 800 brackets
        payloads.remove(DEEP_KIND)  # ("Mkdirs failed"); the columnar one files it at the top
    headers = [("Tag", "one"), ("Tag", "two"), ("Trace", "t-1 é")]
    publish_and_wait(js, names, [(f"{names.prefix}.e", p, *([headers] if i % 7 == 0 else []))
                                 for i, p in enumerate(payloads)])
    reports = {}
    for writer in ("spark", "columnar"):
        reports[writer] = run_drain(spark, config(
            names, nats_server.url, tmp_path / writer, f"{names.consumer}_{writer}",
            f"target.writer={writer}", f"target.partition_by={partition_by}"))

    assert reports["columnar"].writer == "columnar" and reports["spark"].writer == "spark"
    assert reports["spark"].messages_written + reports["spark"].dead_letters == len(payloads)
    # run.max_bytes stops a run on these (the columnar writer's were 0: a break-it review).
    assert reports["columnar"].bytes == reports["spark"].bytes == sum(map(len, payloads))
    for suffix in ("", "_dead_letters"):
        spark_table, columnar_table = (tmp_path / f"{w}{suffix}" for w in ("spark", "columnar"))
        assert schema_of(spark, columnar_table) == schema_of(spark, spark_table)
        # Two consumers: their delivery sequences differ with the tasks' interleaving.
        drop = ("consumer_seq",)
        assert table_rows(spark, columnar_table, drop=drop) == table_rows(spark, spark_table,
                                                                          drop=drop)
    for writer in ("spark", "columnar"):
        info = settled(js, names.stream, f"{names.consumer}_{writer}")
        assert (info.num_pending, info.num_ack_pending) == (0, 0)


@pytest.mark.parametrize(("schema", "keep_raw", "partition_by"), [
    (SCHEMA, False, "[]"),
    (SCHEMA, True, "[to_date(published_at) AS date, kind]"),
    ("`Id` LONG, Kind STRING, flag BOOLEAN", False, "[KIND, subject, to_date(published_at) AS d]"),
    ("id INTEGER, amount DOUBLE", True, "[ID]"),
    ("`a.b` STRING, `c``d` BIGINT, id BIGINT COMMENT 'the id'", False, "[]"),
    ("id BIGINT, d DATE, t TIMESTAMP, a ARRAY<TIMESTAMP>, s STRUCT<d DATE>", False,
     "[to_date(published_at) AS day]"),
])
def test_the_columnar_writers_row_schema_is_the_spark_writers(schema, keep_raw, partition_by,
                                                              spark, tmp_path):
    """columnar_plan.row_schema works the rows' schema out without Spark's decoding; it must be the
    one Spark's writer gives its rows (Drain._empty_rows), partition columns included, and the
    table deltalake creates from it the one Spark's own first append creates."""
    from js_etl.drain.run import Drain

    cfg = load_config(None, [
        "nats.servers=nats://127.0.0.1:1", "source.stream=S", "source.consumer=c",
        f"target.path={tmp_path / 'spark'}", "decode.format=json", f"decode.schema={schema}",
        f"decode.keep_raw={str(keep_raw).lower()}", f"target.partition_by={partition_by}"],
        environ={})
    assert columnar_plan.config_problem(spark, cfg) is None
    drain = Drain(spark, cfg, cfg.nats.connection_options(environ={}))
    rows, names = drain._empty_rows()
    ours, our_names = columnar_plan.row_schema(cfg)

    assert ours == rows.schema
    delta_spark = DeltaTarget(path=str(tmp_path / "spark"))
    create_empty(delta_spark, rows, names)
    # Spark's writer names partition columns as written (KIND); Delta records the column's own.
    assert our_names == list(delta_spark.shape(spark).partition_columns)
    create_table(str(tmp_path / "deltalake"), ours, our_names)
    delta_rs = DeltaTarget(path=str(tmp_path / "deltalake"))
    assert delta_rs._snapshot_shape(spark) == delta_spark._snapshot_shape(spark)
    assert table_problem(delta_rs.shape(spark), ours, our_names) is None


def test_odd_names_partition_and_decode_alike_on_both_writers(spark, js, names, nats_server,
                                                              tmp_path):
    """partition_by KIND of a field Kind: Delta records the partition column Kind; the columnar
    writer creates, fills and commits it as Kind, and Spark's writer appends to it after (as
    the Spark writer names it, KIND). A field named `a.b` is that field on both writers, not b
    of a (Spark's decoder failed on it: a break-it review)."""
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b'{"Id": %d, "Kind": "k%d", "a.b": "v%d"}'
                                  % (i, i % 2, i)) for i in range(10)])
    tables = {writer: tmp_path / writer for writer in ("columnar", "spark")}

    for writer, table in tables.items():
        report = run_drain(spark, config(names, nats_server.url, table, f"c_{writer}",
                                         "decode.schema=Id BIGINT, Kind STRING, `a.b` STRING",
                                         "target.partition_by=[KIND]",
                                         f"target.writer={writer}"))
        assert (report.writer, report.messages_written) == (writer, 10)

    assert DeltaTarget(path=str(tables["columnar"])).shape(spark).partition_columns == ("Kind",)
    assert table_rows(spark, tables["columnar"], drop=("consumer_seq",)) == table_rows(
        spark, tables["spark"], drop=("consumer_seq",))
    rows = spark.read.format("delta").load(str(tables["columnar"]))
    assert sorted(r["a.b"] for r in rows.where("kind = 'k1'").collect()) == [
        "v1", "v3", "v5", "v7", "v9"]
    rows.write.format("delta").mode("append").partitionBy("KIND").save(str(tables["columnar"]))
    assert spark.read.format("delta").load(str(tables["columnar"])).count() == 20
    assert {p.name for p in tables["columnar"].iterdir()} >= {"Kind=k0", "Kind=k1"}


def round_rows(spark: Any, table: Path, versions: list[int]) -> list[int]:
    """How many rows each of a run's commits (``versions``, in order) added to ``table``."""
    counts = [spark.read.format("delta").option("versionAsOf", v).load(str(table)).count()
              for v in versions]
    return [n - before for n, before in zip(counts, [0, *counts], strict=False)]


def test_partition_max_bytes_counts_what_a_round_holds_the_dead_letters_for_the_columnar_writer(
        spark, js, names, nats_server, tmp_path):
    # Good rows go to the files as they come; dead letters wait in the round's checkpoint. So
    # the memory budget bounds every round of Spark's writer and of dead letters, not the
    # columnar writer's good rows.
    add_stream(js, names)
    pad = "x" * 1000
    good = [json.dumps({"id": i, "kind": pad}).encode() for i in range(100)]
    dead = [json.dumps({"id": i, "n": pad}).encode() for i in range(100)]  # a string into INT
    # A pull that ends at its deadline ends its partition's round: 10 s, not 2, on a busy box.
    small = ("fetch.batch=6", "fetch.max_bytes=8KiB", "fetch.partition_max_bytes=16KiB",
             "fetch.pull_timeout=10")
    # The most messages one round can hold on 2 partitions: each sends no pull once it holds
    # 16 KiB, counting its (at most two) pulls in flight as 8 KiB each.
    most = 2 * (16 + 8) * 1024 // len(good[0])

    publish_and_wait(js, names, [(f"{names.prefix}.e", p) for p in good])
    reports = {writer: run_drain(spark, config(
        names, nats_server.url, tmp_path / writer, f"{names.consumer}_{writer}",
        f"target.writer={writer}", *small)) for writer in ("columnar", "spark")}
    assert reports["columnar"].writer == "columnar"
    assert [(r.messages_written, r.dead_letters) for r in reports.values()] == [(100, 0)] * 2
    assert max(round_rows(spark, tmp_path / "spark", reports["spark"].delta_versions)) <= most
    # A no_wait pull is refused (408 Requests Pending, which ends the partition's round) only
    # while fewer messages are pending than the batches asked before it (nats-server
    # processNextMsgRequest): here 4 x 6, so the first round takes all but at most 24.
    first = round_rows(spark, tmp_path / "columnar", reports["columnar"].delta_versions)[0]
    assert first >= 100 - 24 > most

    publish_and_wait(js, names, [(f"{names.prefix}.e", p) for p in dead])
    report = run_drain(spark, config(names, nats_server.url, tmp_path / "columnar",
                                     f"{names.consumer}_columnar", *small))
    assert (report.writer, report.messages_written, report.dead_letters) == ("columnar", 0, 100)
    dead_rounds = round_rows(spark, tmp_path / "columnar_dead_letters",
                             report.dead_letter_versions)
    assert sum(dead_rounds) == 100 and max(dead_rounds) <= most


def test_a_columnar_round_commits_with_the_jobs_transaction_tag_and_seq_statistics(
        spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", json.dumps({"id": i}).encode())
                                 for i in range(500)])
    table = tmp_path / "t"
    job_config = config(names, nats_server.url, table, names.consumer, "fetch.partitions=1",
                        "source.max_ack_pending=200")

    report = run_drain(spark, job_config)

    assert report.writer == "columnar" and report.writer_note is None
    assert (report.rounds, report.messages_written) == (3, 500)
    target = DeltaTarget(str(table))
    assert target.job_round(spark, job_config.job_id) == (3, report.delta_versions[-1])
    tags = [CommitTag.from_json(a["commitInfo"].get("userMetadata"))
            for v in report.delta_versions for a in log_actions(spark, str(table), v)
            if "commitInfo" in a]
    assert [(t.round, t.first_seq, t.last_seq) for t in tags if t] == [
        (1, 1, 200), (2, 201, 400), (3, 401, 500)]
    # Data skipping on the files' seq statistics: a range no file covers reads no file.
    assert range_keys(spark, target, names.stream, 501, 10_000) is None
    view = target.exists_with_view(spark)[1]
    assert view is not None and view.reads_files_as_rows(("stream", "seq"))
    assert files_holding_seqs(pa.table(view.table.get_add_actions(flatten=True)), 150,
                              250).num_rows == 2
    assert sorted(range_keys(spark, target, names.stream, 150, 250).column("seq").to_pylist()
                  ) == list(range(150, 251))
    assert target.read(spark).count() == 500


def test_a_failed_write_attempts_files_are_never_committed(spark, js, names, nats_server,
                                                            tmp_path, monkeypatch):
    messages, good, bad = events(names, 600, poison_every=101)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    monkeypatch.setenv("JS_ETL_FAULT", "fail_write_task")

    # Every task's first attempt writes its files, then dies, in every round: the run ends
    # transiently (js_etl.drain.run.FAILED_PULLS).
    with pytest.raises(TransientError, match="the tasks fail after they pull"):
        run_drain(spark, config_for(names, nats_server.url, table), run_id="failedwrites")

    monkeypatch.delenv("JS_ETL_FAULT")
    written = columnar_files(table, "failedwrites")
    # The attempts' files stay unreferenced.
    assert written and not written & committed_files(spark, table)
    run_drain(spark, config_for(names, nats_server.url, table))
    assert_exactly_once(spark, js, names, table, good, bad)


def test_a_round_holding_rows_the_table_has_goes_through_the_spark_writer(
        spark, js, names, nats_server, tmp_path):
    """A second consumer of the same stream into the same table: its rounds fetch sequences
    the table holds, which must be acked and not written again; the rest of each round is read
    back from the files its tasks wrote and appended by Spark, and those files removed."""
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", json.dumps({"id": i}).encode())
                                 for i in range(400)])
    table = tmp_path / "t"
    first = run_drain(spark, config(names, nats_server.url, table, f"{names.consumer}_a",
                                    "run.max_messages=150"))
    assert (first.writer, first.messages_written) == ("columnar", 150)

    second = run_drain(spark, config(names, nats_server.url, table, f"{names.consumer}_b"))

    assert (second.messages_written, second.already_committed) == (250, 150)
    seqs = sorted(r.seq for r in DeltaTarget(str(table)).read(spark).select("seq").collect())
    assert seqs == list(range(1, 401))
    # The first run's files are committed; the second run's, read into Spark's append, removed.
    assert columnar_files(table, first.run_id) <= committed_files(spark, table)
    assert not columnar_files(table, second.run_id)
    info = settled(js, names.stream, f"{names.consumer}_b")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


def test_dead_letters_travel_as_task_files_removed_after_the_round_on_either_commit(
        spark, js, names, nats_server, tmp_path):
    """A columnar round's tasks write their dead letters to files of their own, which the
    columnar commit commits as they are, and which a round that goes through the Spark writer
    (here a second and a third consumer's, whose rounds hold sequences both tables have) reads
    back and removes — each message once in its table, no task file left over."""
    add_stream(js, names)
    payloads = [json.dumps({"id": i}).encode() if i % 7 else b'{"id": "bad"}'
                for i in range(300)]
    publish_and_wait(js, names, [(f"{names.prefix}.e", p) for p in payloads])
    table = tmp_path / "t"
    bad = {i + 1 for i in range(300) if not i % 7}  # their stream sequences

    first = run_drain(spark, config(names, nats_server.url, table, f"{names.consumer}_a",
                                    "run.max_messages=150"))
    second = run_drain(spark, config(names, nats_server.url, table, f"{names.consumer}_b"))

    assert first.writer == "columnar"
    assert (first.messages_written + first.dead_letters, first.already_committed) == (150, 0)
    assert second.already_committed == 150
    assert (first.dead_letters + second.dead_letters,
            first.messages_written + second.messages_written) == (len(bad), 300 - len(bad))
    dead = spark.read.format("delta").load(f"{table}_dead_letters")
    assert sorted(r.seq for r in dead.select("seq").collect()) == sorted(bad)
    assert {(r.error is not None, bytes(r.data)) for r in dead.collect()} == {
        (True, b'{"id": "bad"}')}
    rows = sorted(r.seq for r in DeltaTarget(str(table)).read(spark).select("seq").collect())
    assert rows == sorted(set(range(1, 301)) - bad)
    # The first run's dead-letter files are the dead-letter table's (committed as they are);
    # the second's, read back into Spark's append, removed.
    dead_table = Path(f"{table}_dead_letters")
    assert set() < columnar_files(dead_table, first.run_id) <= committed_files(spark, dead_table)
    assert not columnar_files(dead_table, second.run_id)
    assert not columnar_files(table, second.run_id)
    # A third consumer's round holds only sequences the tables have: nothing is written, and
    # its tasks' files are removed all the same.
    third = run_drain(spark, config(names, nats_server.url, table, f"{names.consumer}_c"))
    assert (third.messages_written, third.dead_letters, third.already_committed) == (0, 0, 300)
    assert not columnar_files(table, third.run_id)
    for name in ("b", "c"):
        info = settled(js, names.stream, f"{names.consumer}_{name}")
        assert (info.num_pending, info.num_ack_pending) == (0, 0)


def test_a_columnar_round_with_dead_letters_is_one_spark_job_deltalake_appends_them(
        spark, js, names, nats_server, tmp_path):
    """The dead letters of a columnar round go into their table by deltalake, from the tasks'
    files, as Spark's append would put them: the new table created with Spark's protocol,
    schema and partitioning, each round's commit tagged and recorded as the job's round. With
    both tables there, a round is one Spark job: the fetch (the append was one more, 1.1 s of a
    warm 800-message round)."""
    messages, good, bad = events(names, 400, poison_every=40)
    setup_stream(js, names, messages, max_ack_pending=200)
    table = tmp_path / "table"
    dead = DeltaTarget(f"{table}_dead_letters")
    job_config = config_for(names, nats_server.url, table, "run.max_messages=200")

    first = run_drain(spark, job_config)
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    second = run_drain(spark, replace(job_config, run=replace(job_config.run, max_messages=None)))
    jobs = set(tracker.getJobIdsForGroup(None)) - before

    assert (first.writer, second.writer) == ("columnar", "columnar")
    assert second.rounds == 1 and len(jobs) == 1, (second.rounds, jobs)
    assert_exactly_once(spark, js, names, table, good, bad)
    spark_made = DeltaTarget(str(tmp_path / "spark_made"))
    create_empty(spark_made, spark.createDataFrame([], columnar_plan.dead_letter_schema()), [])
    assert dead._snapshot_shape(spark) == spark_made._snapshot_shape(spark)
    tags = [CommitTag.from_json(a["commitInfo"].get("userMetadata"))
            for v in (*first.dead_letter_versions, *second.dead_letter_versions)
            for a in log_actions(spark, str(dead), v) if "commitInfo" in a]
    assert [(t.job, t.round) for t in tags if t] == [(job_config.job_id, 1),
                                                     (job_config.job_id, 2)]
    assert dead.job_round(spark, job_config.job_id) == (2, second.dead_letter_versions[-1])
    assert {r.error for r in dead.read(spark).collect()} == {MALFORMED}


def test_a_round_without_dead_letters_does_not_read_their_table_after_its_commit(
        spark, js, names, nats_server, tmp_path, monkeypatch):
    """A columnar round's +TERMs come from reading the dead-letter table after the commit. A
    round that wrote none has none to send: the range was checked empty before the commit and
    the lock keeps the job's other runs out, so that read could only find another job's rows.
    It is skipped (one table read a round: a py4j path lookup and a log replay)."""
    from js_etl.drain.writers import columnar as writer_module

    messages, good, bad = events(names, 200, poison_every=40)
    messages += [(f"{names.prefix}.e", json.dumps({"id": i}).encode()) for i in range(200, 400)]
    good += list(range(201, 401))
    setup_stream(js, names, messages, max_ack_pending=200)
    table = tmp_path / "table"
    reads: list[tuple[int, int]] = []
    original = writer_module.range_keys

    def range_keys_spy(spark: Any, target: Any, stream: str, first: int, last: int, *,
                       with_error: bool = False) -> Any:
        if with_error:
            reads.append((first, last))
        return original(spark, target, stream, first, last, with_error=with_error)

    monkeypatch.setattr(writer_module, "range_keys", range_keys_spy)
    report = run_drain(spark, config_for(names, nats_server.url, table, "fetch.partitions=1",
                                         "fetch.partition_max_messages=200"))

    assert (report.writer, report.rounds, report.dead_letters) == ("columnar", 2, len(bad))
    assert reads == [(1, 200)]  # round 1's dead letters; round 2 (201..400) wrote none
    assert_exactly_once(spark, js, names, table, good, bad)


def test_a_round_whose_rows_commit_fails_after_its_dead_letters_keeps_their_files(
        spark, js, names, nats_server, tmp_path, monkeypatch):
    """The dead letters' files are committed as they are, before the rows': a round that fails
    between the two commits must not remove them (the dead-letter table would name missing
    files), and the next run's fence +TERMs them as committed; the rows are written once."""
    messages, good, bad = events(names, 200, poison_every=20)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    original = DeltaTarget.commit_files

    def rows_commit_fails(self: Any, spark: Any, directory: str, *args: Any) -> int:
        if self.path == str(table):
            raise TransientError("the rows' commit failed")
        return original(self, spark, directory, *args)

    monkeypatch.setattr(DeltaTarget, "commit_files", rows_commit_fails)
    with pytest.raises(TransientError, match="the rows' commit failed"):
        run_drain(spark, config_for(names, nats_server.url, table, "fetch.partitions=1"))
    monkeypatch.setattr(DeltaTarget, "commit_files", original)
    dead = DeltaTarget(f"{table}_dead_letters").read(spark)
    assert sorted(r.seq for r in dead.select("seq").collect()) == bad  # every file readable

    report = run_drain(spark, config_for(names, nats_server.url, table))
    assert report.reacked_at_start == len(bad)
    assert_exactly_once(spark, js, names, table, good, bad)


def test_a_dead_letter_table_with_a_check_constraint_gets_sparks_append(
        spark, js, names, nats_server, tmp_path):
    """A commit of the tasks' files checks no rows: the dead letters of a dead-letter table
    with a rule on rows go through Spark's append, which enforces it, and nothing is acked."""
    messages, _, _ = events(names, 100, poison_every=10)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    dead = f"{table}_dead_letters"
    spark.createDataFrame([], columnar_plan.dead_letter_schema()).write.format("delta").save(dead)
    spark.sql(f"ALTER TABLE delta.`{dead}` ADD CONSTRAINT no_json CHECK (error IS NULL)")

    with pytest.raises(Exception, match="CHECK constraint no_json"):
        run_drain(spark, config_for(names, nats_server.url, table))
    assert DeltaTarget(dead).read(spark).count() == 0
    info = js.consumer_info(names.stream, names.consumer)
    assert info.ack_floor.stream_seq == 0  # nothing of the round acked


def drain_with_both_writers(spark: Any, names: Any, url: str, tmp_path: Path,
                            *settings: str) -> dict[str, Any]:
    """Drain the test's stream with Spark's writer and with ``auto``, each through its own
    consumer into its own tables (``tmp_path/spark``, ``tmp_path/auto``): ``auto`` must pick the
    columnar writer, with no note, and both must write and dead-letter as many messages."""
    reports = {writer: run_drain(spark, config(
        names, url, tmp_path / writer, f"{names.consumer}_{writer}", *settings,
        f"target.writer={writer}")) for writer in ("spark", "auto")}
    assert (reports["auto"].writer, reports["auto"].writer_note) == ("columnar", None)
    assert ((reports["auto"].messages_written, reports["auto"].dead_letters)
            == (reports["spark"].messages_written, reports["spark"].dead_letters))
    return reports


def assert_same_tables(spark: Any, tmp_path: Path) -> None:
    """The tables of :func:`drain_with_both_writers` hold the same schema and rows (the delivery
    sequence aside: two consumers); a dead-letter table Spark never made is empty or missing on
    the columnar side."""
    for suffix in ("", "_dead_letters"):
        spark_table, columnar_table = (tmp_path / f"{w}{suffix}" for w in ("spark", "auto"))
        if not spark_table.exists():
            assert not (columnar_table / "_delta_log").exists() or DeltaTarget(
                str(columnar_table)).read(spark).count() == 0
            continue
        assert schema_of(spark, columnar_table) == schema_of(spark, spark_table)
        drop = ("consumer_seq",)
        assert table_rows(spark, columnar_table, drop=drop) == table_rows(spark, spark_table,
                                                                          drop=drop)


# Partitioned and not, each on one format: the formats share the writer's partitioning.
@pytest.mark.parametrize("fmt, partition_by", [
    ("raw", "[subject, to_date(published_at) AS day]"), ("text", "[]")])
def test_both_writers_write_the_same_raw_and_text_rows(fmt, partition_by, spark, js, names,
                                                       nats_server, tmp_path):
    """raw and text drains on the columnar writer: the same rows, dead letters (text: a payload
    that is not UTF-8) and counts as Spark's writer, for payloads of every kind of bytes."""
    add_stream(js, names)
    payloads = [b"", b"plain", "é ü ✓".encode(), b"\xff\xfe not utf-8", b"\x00\x01\x02",
                *PAYLOADS, *(b"m%d" % i for i in range(200))]
    headers = [("Tag", "one"), ("Tag", "two")]
    publish_and_wait(js, names, [(f"{names.prefix}.{'a' if i % 2 else 'b'}", p,
                                  *([headers] if i % 5 == 0 else []))
                                 for i, p in enumerate(payloads)])
    reports = drain_with_both_writers(spark, names, nats_server.url, tmp_path,
                                      f"decode.format={fmt}", "decode.schema=null",
                                      f"target.partition_by={partition_by}")
    assert ([(r.messages_written, r.dead_letters, r.bytes) for r in reports.values()]
            == [(reports["spark"].messages_written, reports["spark"].dead_letters,
                 sum(map(len, payloads)))] * 2)
    assert reports["spark"].dead_letters == (
        sum(not _utf8(p) for p in payloads) if fmt == "text" else 0)
    assert_same_tables(spark, tmp_path)
    for writer in ("spark", "auto"):
        info = settled(js, names.stream, f"{names.consumer}_{writer}")
        assert (info.num_pending, info.num_ack_pending) == (0, 0)


RICH_SCHEMA = ("id BIGINT, t TIMESTAMP, l TIMESTAMP_NTZ, d DATE, m DECIMAL(18,4), "
               "s STRUCT<id: BIGINT, name: STRING, a: STRUCT<city: STRING, x: DOUBLE>>")


def _rich(i: int) -> bytes:
    """A good payload of RICH_SCHEMA, its times in the plain ISO form and others Spark reads."""
    stamp = [f"2026-11-28T10:{i % 60:02d}:{i % 59:02d}.{i}Z",
             f"2026-11-28 10:{i % 60:02d}:{i % 59:02d}+05:30", f"2026-11-{i % 30 + 1:02d}T23:59:59",
             "2026-11-28T10:00:00.123456-08:00", "2026", "2026-11-28T10:00",
             "2026-11-28T10:00:00 Europe/Oslo", "1582-10-10T00:00:00Z"][i % 8]
    price = [b"%d.%04d" % (i, i), b'"%d.5"' % i, b"-0.0", b"1e2", b'".5"'][i % 5]
    return (b'{"id":%d,"t":"%s","l":"2026-11-28 10:%02d:00.%d","d":"%s","m":%s,"s":{"id":%d,'
            b'"name":"c\\u00e9-%d","other":[1,{"q":null}],"a":%s}}' % (
                i, stamp.encode(), i % 60, i, [b"2026-11-%02d" % (i % 30 + 1), b"1999-12-31",
                                    b"2024-02-29", b"0001-01-01"][i % 4],
                price, i, i, [b'{"city":"Oslo","x":%d.25}' % i, b"null", b"{}"][i % 3]))


def test_both_writers_write_good_rich_payloads_alike(spark, js, names, nats_server, tmp_path):
    """Batches of good payloads with dates, timestamps, decimals and nested structs: the columnar
    writer decodes them with one pyarrow parse each (js_etl.decode.json_batch, checked here on
    the whole set), and must write what Spark's writer writes."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    from js_etl.decode.json_batch import decode_json_batch

    add_stream(js, names)
    payloads = [_rich(i) for i in range(240)]
    kind = to_arrow_type(spark.createDataFrame([], RICH_SCHEMA).schema, timezone="UTC")
    assert decode_json_batch(pa.array(payloads, pa.binary()), kind, keep_raw=False) is not None
    publish_and_wait(js, names, [(f"{names.prefix}.e", p) for p in payloads])
    reports = drain_with_both_writers(spark, names, nats_server.url, tmp_path,
                                      f"decode.schema={RICH_SCHEMA}")
    assert (reports["spark"].messages_written, reports["spark"].dead_letters) == (240, 0)
    assert_same_tables(spark, tmp_path)
    assert "timestampNtz" in DeltaTarget(str(tmp_path / "auto")).shape(spark).features


def _utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_the_writer_is_chosen_before_the_first_round_and_reported(spark, js, names, nats_server,
                                                                  tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b'{"id": 1}')] * 5)

    def drain(table: str, consumer: str, *extra: str) -> Any:
        return run_drain(spark, config(names, nats_server.url, tmp_path / table, consumer,
                                       *extra))

    unknown = drain("unknown", "c1", "decode.unknown_fields=dead_letter")
    assert (unknown.writer, unknown.messages_written) == ("spark", 5)
    assert unknown.writer_note == "decode.unknown_fields is dead_letter"
    forced = drain("forced", "c2", "target.writer=spark")
    assert (forced.writer, forced.writer_note) == ("spark", "target.writer is spark")
    small = drain("small", "c3", "decode.schema=id BIGINT, n SMALLINT")
    assert small.writer == "spark" and "does not decode as Spark does" in small.writer_note

    # A table with a NOT NULL column: Delta's writer enforces it, the columnar one would not.
    strict = tmp_path / "strict"
    spark.sql(f"CREATE TABLE delta.`{strict}` (subject STRING, stream STRING, seq BIGINT, "
              "consumer_seq BIGINT, num_delivered BIGINT, published_at TIMESTAMP, "
              "headers MAP<STRING, ARRAY<STRING>>, id BIGINT NOT NULL, kind STRING, n INT, "
              "ok BOOLEAN, x DOUBLE) USING delta")
    not_null = drain("strict", "c4")
    assert (not_null.writer, not_null.writer_note) == ("spark", "the table has NOT NULL columns")
    assert not_null.messages_written == 5

    # deltalake reads %20 as an escape: it would commit into, and read, "a b" (a break-it review).
    drain("a b", "c6")
    percent = drain("a%20b", "c7")
    assert (percent.writer, percent.messages_written) == ("spark", 5)
    assert "holds '%'" in (percent.writer_note or "")
    assert spark.read.format("delta").load(str(tmp_path / "a%20b")).count() == 5
    assert spark.read.format("delta").load(str(tmp_path / "a b")).count() == 5

    # A column name Spark's create refuses fails the run as on the Spark writer, with Delta's
    # error; deltalake's create would take it (a break-it review).
    with pytest.raises(Exception, match="DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES"):
        drain("spaced", "c8", "decode.schema=id BIGINT, `a b` STRING")
    assert not (tmp_path / "spaced" / "_delta_log").exists()

    with pytest.raises(ConfigError, match="target.writer is columnar, but decode.unknown_fields "
                                          "is dead_letter"):
        drain("refused", "c5", "decode.unknown_fields=dead_letter", "target.writer=columnar")
    assert not (tmp_path / "refused" / "_delta_log").exists()


def test_a_stale_round_is_refused_not_committed(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b'{"id": 1}')] * 3)
    table = tmp_path / "t"
    job_config = config(names, nats_server.url, table, names.consumer)
    run_drain(spark, job_config)
    target = DeltaTarget(str(table))
    version = target.job_round(spark, job_config.job_id)[1]
    data_file = Path(sorted(committed_files(spark, table))[0])
    again = WrittenFile(str(data_file.relative_to(table)), data_file.stat().st_size, {}, 0,
                        '{"numRecords":3}', 3)
    tag = CommitTag(job_config.job_id, "run", 1, "$JS.ACK.x.y", 1, 3)
    with pytest.raises(TerminalError, match="already holds round 1"):
        target.commit_files(spark, str(table), [again], replace(tag, round=1))
    assert target.job_round(spark, job_config.job_id)[1] == version
    assert target.read(spark).count() == 3


def test_range_keys_reads_the_files_spark_wrote_under_escaped_partition_values(spark, tmp_path):
    """Delta's log holds a file's path escaped as a URI ("a%20b" on disk is "a%2520b" there):
    the columnar read-back must find Spark's files, or a round's held rows would go unseen."""
    table = tmp_path / "t"
    rows = [("S", seq, seq, 1, kind) for seq, kind in ((1, "a/b=c d%x"), (2, "plain"), (3, None))]
    (spark.createDataFrame(rows, "stream STRING, seq BIGINT, consumer_seq BIGINT, "
                                 "num_delivered BIGINT, kind STRING")
     .write.format("delta").partitionBy("kind").save(str(table)))

    target = DeltaTarget(path=str(table))
    view = _deltalake_table(target.location(spark))
    assert view is not None and view.reads_files_as_rows(("stream", *ACK_KEY_COLUMNS))
    keys = range_keys(spark, target, "S", 1, 3)  # read from the files the log names

    assert keys is not None and sorted(keys.column("seq").to_pylist()) == [1, 2, 3]
    assert range_keys(spark, target, "S", 4, 9) is None  # no file's seq range overlaps
    assert range_keys(spark, target, "T", 1, 3).num_rows == 0  # another stream's rows


def test_a_parked_message_keeps_its_payload(spark, js, names, nats_server, tmp_path):
    """Delivered more often than source.max_deliver, a good payload is a dead letter with its
    bytes: once it is TERMed, that row is its only copy (the columnar writer's had none: a
    break-it review)."""
    add_stream(js, names)
    payloads = [json.dumps({"id": i}).encode() for i in range(5)]
    publish_and_wait(js, names, [(f"{names.prefix}.e", p) for p in payloads])
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=300, max_ack_pending=1000)))
    # Delivered once and never acked (a crashed client): the run's fence NAKs them back.
    assert len(js.pull(js.puller(names.stream, names.consumer), 5).messages) == 5

    report = run_drain(spark, config(names, nats_server.url, tmp_path / "t", names.consumer,
                                     "source.max_deliver=1"))

    assert (report.writer, report.dead_letters, report.bytes) == ("columnar", 5, 45)
    dead = spark.read.format("delta").load(str(tmp_path / "t_dead_letters")).orderBy("seq")
    assert [(r.error, bytes(r.data)) for r in dead.collect()] == [
        ("poison: delivered 2 times (more than source.max_deliver 1)", p) for p in payloads]


def test_a_check_constraint_added_during_the_run_is_never_bypassed(
        spark, js, names, nats_server, tmp_path, monkeypatch):
    """Another writer adds a CHECK constraint after the round was planned, just before its
    commit: the columnar writer, which does not check rows, must not commit (it did: a
    break-it review); the next run writes with Spark, which enforces it."""
    messages, _, _ = events(names, 200)
    setup_stream(js, names, messages, max_ack_pending=100)
    table = tmp_path / "table"
    original = DeltaTarget.commit_files
    calls = []

    def commit_files(self: Any, *args: Any) -> int:
        calls.append(1)
        if len(calls) == 2:
            spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT small CHECK (id < 100)")
        return original(self, *args)

    monkeypatch.setattr(DeltaTarget, "commit_files", commit_files)
    job_config = config_for(names, nats_server.url, table, "fetch.partitions=1")
    with pytest.raises(TransientError, match="changed during the run"):
        run_drain(spark, job_config)
    monkeypatch.setattr(DeltaTarget, "commit_files", original)

    rows = DeltaTarget(str(table)).read(spark)
    assert rows.count() == 100 and rows.where("id >= 100").count() == 0
    with pytest.raises(Exception, match="CHECK constraint small"):
        run_drain(spark, job_config)  # Spark's writer now: it refuses the rows the table forbids
    assert rows.where("id >= 100").count() == 0


def test_a_column_invariant_chooses_spark_which_enforces_it(spark, js, names, nats_server,
                                                            tmp_path):
    """Reader 1 / writer 2 allows column invariants (schema metadata), which Delta's writer
    enforces and the columnar one would not (a break-it review)."""
    from pyspark.sql.types import StructField, StructType

    from js_etl.decode.spark import Decoder
    from js_etl.schema import RAW_DDL

    messages, _, _ = events(names, 20)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    decoder = Decoder("json", "id BIGINT")
    rows = decoder.rows(decoder.flag(spark.createDataFrame([], RAW_DDL)))
    invariant = {"delta.invariants": json.dumps({"expression": {"expression": "id < 10"}})}
    schema = StructType([StructField(f.name, f.dataType, f.nullable,
                                     invariant if f.name == "id" else f.metadata)
                         for f in rows.schema.fields])
    spark.createDataFrame([], schema).write.format("delta").save(str(table))

    with pytest.raises(Exception, match="id < 10"):
        run_drain(spark, config_for(names, nats_server.url, table))
    assert DeltaTarget(str(table)).read(spark).where("id >= 10").count() == 0


def test_a_fallback_round_reads_its_files_back_under_a_glob_like_path(spark, js, names,
                                                                     nats_server, tmp_path):
    """Spark reads a path as a glob: a table directory named t[1] matched nothing (a break-it
    review)."""
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", json.dumps({"id": i}).encode())
                                 for i in range(300)])
    table = tmp_path / "t[1]"
    run_drain(spark, config(names, nats_server.url, table, f"{names.consumer}_a",
                            "run.max_messages=100"))

    second = run_drain(spark, config(names, nats_server.url, table, f"{names.consumer}_b"))

    assert (second.messages_written, second.already_committed) == (200, 100)
    seqs = sorted(r.seq for r in DeltaTarget(str(table)).read(spark).select("seq").collect())
    assert seqs == list(range(1, 301))


def test_deltalake_checkpoints_are_read_by_spark(spark, js, names, nats_server, tmp_path):
    """deltalake writes a checkpoint every delta.checkpointInterval commits: Spark's snapshot,
    the job's round (txn), the fence's seq range, data skipping and a Spark round after them
    hold (a break-it review's probe, kept)."""
    messages, good, _ = events(names, 600)
    setup_stream(js, names, messages, max_ack_pending=100)
    table = tmp_path / "table"

    def job_config(*extra: str) -> Any:
        return config_for(names, nats_server.url, table, "fetch.partitions=1", *extra)

    run_drain(spark, job_config("run.max_rounds=1"))
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.checkpointInterval'='2')")
    second = run_drain(spark, job_config("run.max_rounds=3"))

    assert second.writer == "columnar"
    assert list((table / "_delta_log").glob("*.checkpoint.parquet"))
    target = DeltaTarget(str(table))
    assert target.job_round(spark, job_config().job_id)[0] == 4
    assert target.last_round_seqs(spark, job_config().job_id) == (301, 400)
    assert range_keys(spark, target, names.stream, 10_000, 20_000) is None
    assert run_drain(spark, job_config("target.writer=spark")).messages_written == 200
    assert sorted(r.seq for r in target.read(spark).select("seq").collect()) == good


def test_a_table_without_a_checkpoint_interval_is_checkpointed_every_10_versions_as_spark_would(
        spark, js, names, nats_server, tmp_path, monkeypatch, caplog):
    """deltalake alone would checkpoint such a table every 100 versions; Spark's writer does
    every 10, and every reader replays the commits since the last one. Spark's snapshot, the
    job's round and the fence's range read through the checkpoint js-etl wrote. A checkpoint
    only shortens reading the log: one that fails leaves the committed round whole, and its
    acks go out."""
    from deltalake import DeltaTable

    messages, good, _ = events(names, 1000)
    setup_stream(js, names, messages, max_ack_pending=100)
    table = tmp_path / "table"

    def job_config(*extra: str) -> Any:
        return config_for(names, nats_server.url, table, "fetch.partitions=1",
                          "fetch.partition_max_messages=50", *extra)

    report = run_drain(spark, job_config("run.max_messages=600"))

    assert (report.writer, report.rounds) == ("columnar", 12)
    log_dir = table / "_delta_log"
    checkpoint = "00000000000000000010.checkpoint.parquet"
    assert sorted(p.name for p in log_dir.glob("*.checkpoint.parquet")) == [checkpoint]
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 10
    target = DeltaTarget(str(table))
    job_id = job_config().job_id
    assert target.job_round(spark, job_id) == (12, 12)
    assert target.last_round_seqs(spark, job_id) == (551, 600)

    def create_checkpoint(self: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(DeltaTable, "create_checkpoint", create_checkpoint)
    report = run_drain(spark, job_config())

    assert report.rounds == 8  # versions 13..20: the one at 20 is not checkpointed
    assert sorted(p.name for p in log_dir.glob("*.checkpoint.parquet")) == [checkpoint]
    assert "could not checkpoint" in caplog.text and "disk full" in caplog.text
    assert target.job_round(spark, job_id) == (20, 20)
    assert_exactly_once(spark, js, names, table, good, [])


@pytest.mark.parametrize("writer", ["auto", "spark"])
def test_a_new_catalog_table_is_drained_by_its_first_run(writer, spark, js, names, nats_server,
                                                         tmp_path):
    """The first run of a catalog table that does not exist yet locked in the table's future
    directory, and Delta refused to create the table there, on both writers (a break-it
    review); the table is now created before the lock."""
    messages, good, bad = events(names, 300, poison_every=50)
    setup_stream(js, names, messages)
    database = f"db_{names.consumer}"
    spark.sql(f"CREATE DATABASE {database} LOCATION '{tmp_path / 'warehouse'}'")
    table = f"{database}.orders"
    job_config = load_config(None, [
        f"nats.servers={nats_server.url}", f"source.stream={names.stream}",
        f"source.consumer={names.consumer}", f"target.table={table}", "decode.format=json",
        "decode.schema=id BIGINT", "fetch.pull_timeout=1",
        "target.partition_by=[to_date(published_at) AS date]", f"target.writer={writer}"],
        environ={})
    try:
        report = run_drain(spark, job_config)

        assert report.writer == ("columnar" if writer == "auto" else "spark")
        assert sorted(r.seq for r in spark.table(table).select("seq").collect()) == good
        assert sorted(r.seq for r in spark.table(f"{table}_dead_letters")
                      .select("seq").collect()) == bad
        info = settled(js, names.stream, names.consumer)
        assert (info.num_pending, info.num_ack_pending) == (0, 0)
    finally:
        spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")


@pytest.mark.parametrize("feature", ["deletion_vectors", "change_data_feed"])
def test_a_table_with_deletion_vectors_or_a_change_data_feed_takes_the_columnar_writer(
        feature, spark, js, names, nats_server, tmp_path):
    """Tables with table features an append leaves alone (js_etl.delta.rules.
    APPEND_SAFE_FEATURES): the columnar writer commits to them. With deletion vectors, a row
    another writer deleted in place stays deleted; with a change data feed, the drain's rows are
    the feed's inserts."""
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", json.dumps({"id": i}).encode())
                                 for i in range(300)])
    table = tmp_path / "t"
    first = run_drain(spark, config(names, nats_server.url, table, names.consumer,
                                    "run.max_messages=100"))
    assert first.messages_written == 100
    prop = {"deletion_vectors": "delta.enableDeletionVectors",
            "change_data_feed": "delta.enableChangeDataFeed"}[feature]
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('{prop}' = 'true')")
    if feature == "deletion_vectors":
        spark.sql(f"DELETE FROM delta.`{table}` WHERE seq = 7")  # in place: a deletion vector
    version = DeltaTarget(str(table)).job_round(spark, "")[1]

    second = run_drain(spark, config(names, nats_server.url, table, names.consumer))

    assert (second.writer, second.writer_note, second.messages_written) == ("columnar", None, 200)
    seqs = sorted(r.seq for r in DeltaTarget(str(table)).read(spark).select("seq").collect())
    assert seqs == [s for s in range(1, 301) if not (feature == "deletion_vectors" and s == 7)]
    if feature == "change_data_feed":
        changes = spark.read.format("delta").option("readChangeFeed", "true") \
            .option("startingVersion", version + 1).load(str(table))
        assert sorted(r.seq for r in changes.where("_change_type = 'insert'").collect()) == \
            list(range(101, 301))
    info = settled(js, names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
