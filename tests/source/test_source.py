"""``spark.read.format("nats_jetstream")`` against a real nats-server and the session's Spark.

tests/test_spark_connect.py runs this file again with the session a Spark Connect client
(``JS_ETL_TEST_SPARK=connect``), with the same assertions; tests marked ``classic_spark`` need
the JVM's own API and run on the classic session only. A Connect DataFrame is analyzed when it is
first looked at (its schema, or an action), not by ``load()``: the error tests look at it."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
from streams import add_stream, publish_and_wait, purge_stream, wait_until

from js_etl.demo.server import LocalNatsServer, free_port
from js_etl.errors import ConfigError, PurgedRangeError, RangeError
from js_etl.jetstream import ConnectionOptions, JetStreamSession, Secret
from js_etl.jetstream.errors import AuthorizationError, NatsUnavailableError, StreamNotFoundError
from js_etl.jetstream.message import parse_headers
from js_etl.source import register
from js_etl.source.datasource import FAULT_PROPERTY, load_error, plan_read, subject_matches
from js_etl.source.options import SourceOptions
from js_etl.source.read_range import subjects_overlap

COLUMNS = ["subject", "stream", "seq", "consumer_seq", "num_delivered", "published_at",
           "headers", "data", "error"]


@pytest.fixture(scope="module")
def source(spark: Any) -> Any:
    register(spark)
    return spark


def reader(spark: Any, url: str, stream: str, **options: Any) -> Any:
    r = spark.read.format("nats_jetstream").option("servers", url).option("stream", stream)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r


def made(r: Any) -> Any:
    """``r.load()``, analyzed: a classic DataFrame is analyzed by ``load()``, a Connect one when
    first looked at (its schema here)."""
    df = r.load()
    _ = df.schema
    return df


def physical_plan(df: Any) -> str:
    """What ``explain()`` prints of ``df``'s physical plan (the same in both modes)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain()
    return out.getvalue()


def stored(js: JetStreamSession, stream: str, seq: int) -> dict[str, Any]:
    """The server's own record of one message (STREAM.MSG.GET), independent of the reader."""
    answer = js.run(js.conn.request(f"STREAM.MSG.GET.{stream}", {"seq": seq}))
    return dict(answer["message"])


def as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)  # collect() gives naive datetimes in TZ=UTC (conftest)


def to_micros(server_time: str) -> str:
    """The server's UTC time (Go's RFC3339Nano: trailing zeros of the fraction, or the whole
    fraction, dropped) as ``YYYY-MM-DDTHH:MM:SS.ffffff``, the row's precision."""
    seconds, _, fraction = server_time.removesuffix("Z").partition(".")
    return f"{seconds}.{fraction[:6].ljust(6, '0')}"


def test_to_micros_pads_what_the_server_trims():
    assert to_micros("2026-11-25T00:12:53.44872Z") == "2026-11-25T00:12:53.448720"
    assert to_micros("2026-11-25T00:12:53Z") == "2026-11-25T00:12:53.000000"
    assert to_micros("2026-11-25T00:12:53.123456789Z") == "2026-11-25T00:12:53.123456"


def test_rows_of_a_range_equal_what_was_published(source, js, names, nats_server):
    add_stream(js, names)
    messages: list[Any] = []
    for i in range(1, 61):
        headers = [("Tag", "one"), ("Tag", "two"), ("Trace", f"t-{i}")] if i % 3 == 0 else None
        subject = f"{names.prefix}.{'a' if i % 2 else 'b'}"
        messages.append((subject, b"m%d" % i, headers) if headers else (subject, b"m%d" % i))
    publish_and_wait(js, names, messages)

    df = reader(source, nats_server.url, names.stream, from_seq=5, to_seq=50, partitions=3,
                batch=7).load()
    rows = df.orderBy("seq").collect()

    assert df.columns == COLUMNS
    assert [r.seq for r in rows] == list(range(5, 51))
    for r in rows:
        truth = stored(js, names.stream, r.seq)
        assert r.subject == truth["subject"] and r.stream == names.stream
        assert r.data == base64.b64decode(truth["data"])
        assert r.error is None and r.num_delivered == 1 and r.consumer_seq is None
        published = as_utc(r.published_at).strftime("%Y-%m-%dT%H:%M:%S.%f")
        assert published == to_micros(truth["time"])  # the row keeps microseconds
        if "hdrs" in truth:
            assert r.headers == parse_headers(base64.b64decode(truth["hdrs"]))
            assert r.headers == {"Tag": ["one", "two"], "Trace": [f"t-{r.seq}"]}
        else:
            assert r.headers is None


@pytest.mark.classic_spark  # a Connect DataFrame is a plan the server may analyze again
def test_reading_twice_is_identical_and_the_end_is_fixed_when_the_dataframe_is_made(
        source, js, names, nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"m%d" % i) for i in range(200)])
    df = reader(source, nats_server.url, names.stream, partitions=4, batch=16).load()
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"late%d" % i) for i in range(50)])

    first = df.orderBy("seq").collect()
    second = df.orderBy("seq").collect()

    assert first == second
    assert [r.seq for r in first] == list(range(1, 201))  # not the 50 published after load()
    again = reader(source, nats_server.url, names.stream, to_seq=200, partitions=2).load()
    assert again.orderBy("seq").collect() == first


def test_a_range_pinned_by_to_seq_reads_the_same_rows_whatever_comes_later(
        source, js, names, nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"m%d" % i) for i in range(200)])
    df = reader(source, nats_server.url, names.stream, to_seq=200, partitions=4, batch=16).load()
    first = df.orderBy("seq").collect()
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"late%d" % i) for i in range(50)])
    second = df.orderBy("seq").collect()
    other = reader(source, nats_server.url, names.stream, to_seq=200, partitions=3).load()

    assert first == second == other.orderBy("seq").collect()
    assert [r.seq for r in first] == list(range(1, 201))
    assert [r.data for r in first] == [b"m%d" % i for i in range(200)]
    consumers = js.run(js.conn.request(f"CONSUMER.LIST.{names.stream}", {}))
    assert not consumers.get("consumers")  # every ephemeral consumer deleted; no durable touched


@pytest.mark.classic_spark  # the fault and the failed-task count go through the SparkContext
def test_a_task_failing_once_is_retried_with_the_same_rows(source, js, names, nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"m%d" % i) for i in range(300)])
    df = reader(source, nats_server.url, names.stream, partitions=3, batch=25).load()
    expected = df.orderBy("seq").collect()

    context = source.sparkContext
    group = f"retry-{names.prefix}"
    context.setJobGroup(group, "a read whose tasks fail once")
    context.setLocalProperty(FAULT_PROPERTY, "fail_fetch_task")
    try:
        retried = df.orderBy("seq").collect()
    finally:
        context.setLocalProperty(FAULT_PROPERTY, None)
        context.setLocalProperty("spark.jobGroup.id", None)

    assert retried == expected
    assert [r.seq for r in retried] == list(range(1, 301))
    # Every read task's first attempt failed after its first batch (local[2,2]: one retry).
    tracker = context.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in (info.stageIds if info else []):
            stage_info = tracker.getStageInfo(stage)
            failed += stage_info.numFailedTasks if stage_info else 0
    assert failed >= 3


def test_published_at_predicate_is_pushed_to_the_server(source, js, names, monitored):
    server, delivered = monitored
    with JetStreamSession(ConnectionOptions(servers=(server.url,))) as mjs:
        add_stream(mjs, names)
        publish_and_wait(mjs, names, [(f"{names.prefix}.old", b"o%d" % i) for i in range(900)])
        publish_and_wait(mjs, names, [(f"{names.prefix}.new", b"n%d" % i) for i in range(100)])
        start = to_micros(stored(mjs, names.stream, 901)["time"])
    everything = reader(source, server.url, names.stream, name=f"{names.prefix}-all").load()
    expected = sorted(r.seq for r in everything.collect()
                      if as_utc(r.published_at).strftime("%Y-%m-%dT%H:%M:%S.%f") >= start)
    assert delivered(f"{names.prefix}-all") >= 1000

    df = (reader(source, server.url, names.stream, name=f"{names.prefix}-pushed").load()
          .where(f"published_at >= '{start}'"))
    plan = physical_plan(df)
    seqs = sorted(r.seq for r in df.collect())

    assert seqs == expected == list(range(901, 1001))
    assert "Filter (" not in plan, plan  # no Spark Filter node above the scan: it was pushed
    assert delivered(f"{names.prefix}-pushed") < 200  # the 100 rows and a few API replies
    # Times past those the server compares (64-bit nanoseconds: 1677 to 2262), which it wraps
    # (a start in 2300 found the first message): after, and before, every message.
    far = reader(source, server.url, names.stream, name=f"{names.prefix}-far").load()
    assert far.where("published_at >= '2300-01-01'").count() == 0
    assert far.where("published_at < '1600-01-01'").count() == 0
    assert far.where("published_at > '1600-01-01'").count() == 1000


def test_seq_and_subject_predicates_are_pushed(source, js, names, monitored):
    server, delivered = monitored
    with JetStreamSession(ConnectionOptions(servers=(server.url,))) as mjs:
        add_stream(mjs, names)
        publish_and_wait(mjs, names, [(f"{names.prefix}.{'a' if i % 10 else 'b'}.x", b"%d" % i)
                                      for i in range(1, 1001)])
    by_seq = (reader(source, server.url, names.stream, name=f"{names.prefix}-seq").load()
              .where("seq BETWEEN 400 AND 409"))
    by_subject = (reader(source, server.url, names.stream, name=f"{names.prefix}-subj").load()
                  .where(f"subject = '{names.prefix}.b.x' AND seq > 500"))

    assert sorted(r.seq for r in by_seq.collect()) == list(range(400, 410))
    assert sorted(r.seq for r in by_subject.collect()) == list(range(510, 1001, 10))
    for df in (by_seq, by_subject):
        plan = physical_plan(df)
        assert "Filter (" not in plan, plan
    assert delivered(f"{names.prefix}-seq") < 40
    assert delivered(f"{names.prefix}-subj") < 100  # 50 rows of 500 sequences

    # LIKE 'a.b.%' is pushed as the server-side filter a.b.>; IN narrows the range, Spark
    # re-checks it.
    liked = (reader(source, server.url, names.stream, name=f"{names.prefix}-like").load()
             .where(f"subject LIKE '{names.prefix}.b.%'"))
    listed = (reader(source, server.url, names.stream, name=f"{names.prefix}-in").load()
              .where("seq IN (100, 105, 120)"))
    assert sorted(r.seq for r in liked.collect()) == list(range(10, 1001, 10))
    assert sorted(r.seq for r in listed.collect()) == [100, 105, 120]
    assert delivered(f"{names.prefix}-like") < 200  # 100 rows of 1000
    assert delivered(f"{names.prefix}-in") < 60  # seqs 100..120
    # The plan check can fail: a predicate the reader cannot take stays a Spark Filter.
    kept = reader(source, server.url, names.stream).load().where("length(data) > 2")
    assert "Filter (" in physical_plan(kept)


def test_a_purge_between_load_and_action_only_removes_rows(source, js, names, nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"m%d" % i) for i in range(100)])
    df = reader(source, nats_server.url, names.stream, partitions=2).load()
    before = df.orderBy("seq").collect()
    purge_stream(js, names.stream, keep=30)

    after = df.orderBy("seq").collect()

    assert [r.seq for r in after] == list(range(71, 101))
    assert after == before[70:]  # the same rows, fewer of them: nothing changed or duplicated


@pytest.mark.parametrize("option, value, reason", [
    ("password", "hunter2", "password_env"),
    ("token", "s3cr3t", "token_env"),
    ("nkey_seed", "SUAxxx", "nkey_seed_file"),
    ("creds", "-----BEGIN NATS USER JWT-----", "creds_file"),
])
def test_secrets_in_options_are_refused_with_the_reason(source, js, names, nats_server, option,
                                                       value, reason):
    add_stream(js, names)
    with pytest.raises(Exception) as raised:
        made(reader(source, nats_server.url, names.stream, **{option: value}))
    error = load_error(raised.value)
    assert isinstance(error, ConfigError)
    assert "visible in query plans, the Spark UI and logs" in str(error)
    assert reason in str(error) and value not in str(error)


def test_credentials_come_from_a_file_never_from_an_option_value(source, names, tmp_path):
    token = f"tok-{names.prefix}"
    with LocalNatsServer(tmp_path / "nats",
                         config_text=f'authorization {{ token: "{token}" }}\n') as server:
        options = ConnectionOptions(servers=(server.url,), token=Secret(token))
        with JetStreamSession(options) as tjs:
            add_stream(tjs, names)
            publish_and_wait(tjs, names, [(f"{names.prefix}.x", b"m%d" % i) for i in range(20)])
        right, wrong = tmp_path / "token", tmp_path / "wrong"
        right.write_text(token)
        wrong.write_text("not-the-token")
        for file in (right, wrong):
            file.chmod(0o600)

        # The options name only the file: the token is read where the connection is made.
        rows = reader(source, server.url, names.stream, token_file=right).load().collect()

        assert sorted(r.data for r in rows) == sorted(b"m%d" % i for i in range(20))
        with pytest.raises(Exception) as raised:
            made(reader(source, server.url, names.stream, token_file=wrong, connect_timeout=2))
        assert isinstance(load_error(raised.value), AuthorizationError), str(raised.value)[-400:]


def test_a_pasted_seed_in_a_file_option_is_refused_without_echoing_it(source, js, names,
                                                                       nats_server):
    seed = "SUA" + "A" * 55
    with pytest.raises(Exception) as raised:
        made(reader(source, nats_server.url, names.stream, nkey_seed_file=seed))
    error = load_error(raised.value)
    assert isinstance(error, ConfigError) and seed not in str(error)


def test_errors_are_one_clear_line_when_the_dataframe_is_made(source, js, names, nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"m%d" % i) for i in range(10)])
    purge_stream(js, names.stream, keep=5)
    cases = [
        (dict(stream="NO_SUCH_STREAM"), StreamNotFoundError, "stream 'NO_SUCH_STREAM' not found"),
        (dict(servers=f"nats://127.0.0.1:{free_port()}", connect_timeout=1),
         NatsUnavailableError, ""),
        (dict(from_seq="abc"), RangeError, "option from_seq must be a stream sequence"),
        (dict(batchsize=5), ConfigError, "did you mean 'batch'"),
        (dict(decode="xml"), ConfigError, "option decode"),
        (dict(decode="json"), ConfigError, "schema"),
        (dict(from_time="yesterday"), ConfigError, "option from_time"),
        (dict(start="newest"), ConfigError, "option start must be earliest or latest"),
        (dict(filter_subjects=f"{names.prefix}.x,{names.prefix}x.>"), ConfigError,
         f"filter_subjects {names.prefix}x.>: no subject of stream {names.stream}"),  # a typo
    ]
    for options, kind, text in cases:
        options = {"servers": nats_server.url, "stream": names.stream, **options}
        r = source.read.format("nats_jetstream")
        for key, value in options.items():
            r = r.option(key, str(value))
        with pytest.raises(Exception) as raised:
            made(r)  # not deep in a task: creating (analyzing) the DataFrame fails
        error = load_error(raised.value)
        assert isinstance(error, kind), (options, str(raised.value)[-400:])
        assert text in str(error) and "\n" not in str(error)

    # A range no batch read can take is where a stream starts waiting (the same options make
    # spark.readStream's DataFrame): it fails when the read is planned, still in one line.
    for options, kind, text in [
        (dict(from_seq=2), PurgedRangeError, "start at from_seq=6"),
        (dict(from_seq=20), RangeError, "ends at seq 10"),
        (dict(max_messages_per_batch=5), ConfigError, "is for spark.readStream"),
    ]:
        df = made(reader(source, nats_server.url, names.stream, **options))
        with pytest.raises(Exception) as raised:
            df.collect()
        error = load_error(raised.value)
        assert isinstance(error, kind), (options, str(raised.value)[-400:])
        assert text in str(error) and "\n" not in str(error)


def test_decode_json_and_text_keep_undecodable_payloads_with_the_reason(source, js, names,
                                                                        nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, [
        (f"{names.prefix}.x", json.dumps({"id": 1, "kind": "a"}).encode()),
        (f"{names.prefix}.x", b"hello"),
        (f"{names.prefix}.x", b'{"id": "x"}'),
        (f"{names.prefix}.x", b"\xff\xfe"),
        (f"{names.prefix}.x", b'{"id": 7}garbage'),
    ])
    rows = (reader(source, nats_server.url, names.stream, decode="json",
                   schema="id BIGINT, kind STRING").load().orderBy("seq").collect())
    assert [(r.id, r.kind, r.data, r.error) for r in rows] == [
        (1, "a", None, None),
        (None, None, b"hello", "payload is not JSON"),
        (None, None, b'{"id": "x"}', "JSON does not match decode.schema (id BIGINT, kind STRING)"),
        (None, None, b"\xff\xfe", "payload is not valid UTF-8"),
        (None, None, b'{"id": 7}garbage',
         "data after the JSON value: a payload must be exactly one JSON value"),
    ]
    raw_kept = (reader(source, nats_server.url, names.stream, decode="json", keep_raw="true",
                       schema="id BIGINT, kind STRING").load().where("seq = 1").collect())
    assert [(r.id, r.data, r.error) for r in raw_kept] == [
        (1, json.dumps({"id": 1, "kind": "a"}).encode(), None)]  # keep_raw: good rows keep it
    text = reader(source, nats_server.url, names.stream, decode="text").load()
    assert text.columns[7:] == ["text", "data", "error"]
    bad = text.where("error IS NOT NULL").collect()
    assert [(r.seq, r.text, r.data) for r in bad] == [(4, None, b"\xff\xfe")]


def test_a_filter_on_the_subjects_a_transform_stores_is_not_refused(js, names, nats_server):
    """A stream with a subject transform stores its messages under subjects its config does not
    list: a filter on those is right, and cannot be checked against the config."""
    js.run(js.admin.add_stream(names.stream, [f"{names.prefix}in.>"], subject_transform={
        "src": f"{names.prefix}in.>", "dest": f"{names.prefix}out.>"}))
    publish_and_wait(js, names, [(f"{names.prefix}in.x", b"{}")])
    plan = plan_read(SourceOptions.parse({"servers": nats_server.url, "stream": names.stream,
                                          "filter_subjects": f"{names.prefix}out.x"}))
    assert (plan.lo, plan.hi, plan.filter_subjects) == (1, 1, (f"{names.prefix}out.x",))


def test_subject_filters_follow_nats_wildcards():
    assert subject_matches("a.b", "a.*") and subject_matches("a.b.c", "a.>")
    assert not subject_matches("a", "a.>") and not subject_matches("a.b.c", "a.*")
    assert subject_matches("a.*", "a.*") and not subject_matches("a.>", "a.*")
    assert subjects_overlap("a.*", "a.b") and subjects_overlap("a.>", "*.b.c")
    assert subjects_overlap(">", "a") and not subjects_overlap("a", "a.>")
    assert not subjects_overlap("a.*", "a.b.c") and not subjects_overlap("a.b", "a.c")


# --- a server whose monitoring port counts what it delivered to each connection --------------
@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Any:
    port = free_port()
    server = LocalNatsServer(tmp_path_factory.mktemp("nats-monitored"),
                             config_text=f"http: 127.0.0.1:{port}\n")
    server.start()

    def delivered(name: str) -> int:
        """Messages the server sent to the (closed) connections named ``name``."""
        def closed() -> list[dict[str, Any]]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/connz?state=closed&limit=4096",
                                        timeout=5) as answer:
                return [c for c in json.load(answer).get("connections") or []
                        if c.get("name") == name]
        found = wait_until(closed, bool, timeout=30)
        return sum(int(c.get("out_msgs", 0)) for c in found)

    try:
        yield server, delivered
    finally:
        server.stop()
