"""Hostile input (issue 17): no silent loss, no wrong exit code, no echoed secret.

JSON payloads are checked at the Decoder level and end to end through real drains (real
nats-server, real Spark and Delta); consumers a drain cannot serve, config that would lose or
misplace data, and bad paths are refused before anything is fetched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from payloads import PAYLOAD_SCHEMA, PAYLOADS, TRAILING
from streams import add_stream, publish_and_wait, settled

from js_etl.config import load_config
from js_etl.decode.spark import Decoder, with_partition_columns
from js_etl.drain.run import run_drain
from js_etl.errors import ConfigError, TerminalError
from js_etl.jetstream.errors import (
    ConsumerConfigError,
    ConsumerNotFoundError,
    StreamNotFoundError,
)

BIN = Path(sys.executable).parent


def fetched_rows(spark: Any, payloads: list[bytes]) -> Any:
    """A DataFrame shaped like a fetched round (RAW_DDL), one row per payload, seq = index."""
    from js_etl.schema import RAW_DDL

    rows = []
    for i, payload in enumerate(payloads, start=1):
        try:
            payload.decode("utf-8")
            utf8 = True
        except UnicodeDecodeError:
            utf8 = False
        rows.append(("s.x", "S", i, i, 1, None, None, bytearray(payload), utf8))
    return spark.createDataFrame(rows, RAW_DDL)


def outcome(spark: Any, decoder: Decoder, payloads: list[bytes]) -> dict[bytes, Any]:
    flagged = decoder.flag(fetched_rows(spark, payloads)).orderBy("seq").collect()
    return {payloads[r.seq - 1]: r for r in flagged}


# --- the Decoder -------------------------------------------------------------------------------
def test_decoder_gives_every_hostile_payload_its_reason(spark):
    result = outcome(spark, Decoder("json", PAYLOAD_SCHEMA), list(PAYLOADS))

    assert {payload: row.error for payload, row in result.items()} == PAYLOADS
    for payload, row in result.items():
        if row.error is None:
            assert row.data is None  # good rows hold only their parsed fields
        else:
            assert bytes(row.data) == payload  # dead letters keep the raw bytes


def test_decoder_rows_hold_exactly_the_good_payloads(spark):
    decoder = Decoder("json", PAYLOAD_SCHEMA)
    flagged = decoder.flag(fetched_rows(spark, list(PAYLOADS)))
    rows = decoder.rows(flagged).orderBy("seq").collect()
    dead = decoder.dead_letters(flagged).collect()

    assert [r.id for r in rows] == [1, 2, 3, None, None, 20]
    assert len(rows) + len(dead) == len(PAYLOADS)  # every payload lands exactly once


def test_unknown_fields_dead_letter_refuses_unnamed_and_repeated_fields(spark):
    decoder = Decoder("json", PAYLOAD_SCHEMA, unknown_fields="dead_letter")
    result = outcome(spark, decoder, [b'{"id": 1, "kind": "k"}', b'{"id": 3, "extra": [1, 2]}',
                                      b'{"id": 4, "id": 5}', b"{}"])

    assert [r.error for r in result.values()] == [
        None,
        ("JSON object has fields decode.schema does not name: extra (decode.unknown_fields is "
         "dead_letter)"),
        "JSON object repeats a field (only one of its values could be kept)",
        None,
    ]


def test_keep_raw_keeps_every_good_payload_in_the_row(spark):
    decoder = Decoder("json", PAYLOAD_SCHEMA, keep_raw=True)
    payloads = [b'{"id": 1, "kind": "k"}', b'{"foo": 1}', b'{"id": 3, "extra": true}',
                b'{"id":7}garbage']
    flagged = decoder.flag(fetched_rows(spark, payloads))
    rows = decoder.rows(flagged).orderBy("seq").collect()

    assert rows[0].__fields__[-3:] == ["id", "kind", "data"]
    assert [(r.id, bytes(r.data)) for r in rows] == [
        (1, payloads[0]), (None, payloads[1]), (3, payloads[2])]
    assert decoder.dead_letters(flagged).first().error == TRAILING  # still one value only


def test_invalid_ddl_names_the_reason(spark):
    with pytest.raises(ConfigError) as err:
        Decoder("json", "id NOTATYPE, name")
    message = str(err.value)
    assert message.startswith("decode.schema is not valid Spark DDL ('id NOTATYPE, name'): ")
    assert message.split("): ", 1)[1].strip()  # the reason is not empty


@pytest.mark.parametrize("schema", ["id BIGINT, Subject STRING", "SEQ BIGINT",
                                    "id BIGINT, Data BINARY", "id BIGINT, ID STRING"])
def test_schema_fields_clashing_by_case_are_refused(spark, schema):
    with pytest.raises(ConfigError, match="case"):
        Decoder("json", schema)
    with pytest.raises(ConfigError, match="case"):  # and already when the config loads
        load_config(None, ["source.stream=S", "source.consumer=c", "target.path=/t",
                           "decode.format=json", f"decode.schema={schema}"], environ={})


def test_partition_expression_named_like_an_existing_column_is_refused(spark):
    base = ["source.stream=S", "source.consumer=c", "target.path=/t"]
    json_date = [*base, "decode.format=json", "decode.schema=id BIGINT, date STRING"]
    with pytest.raises(ConfigError, match="'date'.*already has a column 'date'"):
        load_config(None, [*json_date, "target.partition_by=[to_date(published_at) AS date]"],
                    environ={})
    with pytest.raises(ConfigError, match="already has a column 'stream'"):
        load_config(None, [*base, "target.partition_by=[to_date(published_at) AS Stream]"],
                    environ={})
    # Partitioning by the JSON field itself, or under a new name, is fine.
    load_config(None, [*json_date, "target.partition_by=[date]"], environ={})
    load_config(None, [*json_date, "target.partition_by=[to_date(published_at) AS day]"],
                environ={})

    df = spark.createDataFrame([(1, "2020-01-01")], "id BIGINT, date STRING")
    with pytest.raises(ConfigError, match="already has 'date'"):
        with_partition_columns(df, ["current_date() AS date"])
    assert with_partition_columns(df, ["date"])[1] == ["date"]


@pytest.mark.parametrize("setting", ["decode.keep_raw=true", "decode.unknown_fields=dead_letter"])
def test_json_only_settings_are_refused_for_other_formats(setting):
    with pytest.raises(ConfigError, match="applies only to json"):
        load_config(None, ["source.stream=S", "source.consumer=c", "target.path=/t",
                           "decode.format=raw", setting], environ={})


def test_tls_settings_with_a_plain_websocket_url_are_refused():
    with pytest.raises(ConfigError, match="use wss://"):
        load_config(None, ["source.stream=S", "source.consumer=c", "target.path=/t",
                           "nats.servers=ws://127.0.0.1:8080", "nats.tls.ca_file=/ca.pem"],
                    environ={})


# --- end to end through real drains ------------------------------------------------------------
def drain_config(names: Any, nats_server: Any, tmp_path: Path, *extra: str) -> Any:
    return load_config(None, [
        f"nats.servers={nats_server.url}", f"source.stream={names.stream}",
        f"source.consumer={names.consumer}", "source.create_consumer=true",
        f"target.path={tmp_path / 'table'}", "fetch.partitions=2", "fetch.batch=100",
        "fetch.pull_timeout=2", "decode.format=json", f"decode.schema={PAYLOAD_SCHEMA}", *extra,
    ], environ={})


def test_drain_lands_each_payload_once_as_a_row_or_a_dead_letter(spark, js, names, nats_server,
                                                                 tmp_path):
    add_stream(js, names)
    payloads = list(PAYLOADS)
    publish_and_wait(js, names, [(f"{names.prefix}.e", p) for p in payloads])

    report = run_drain(spark, drain_config(names, nats_server, tmp_path))

    good = [i + 1 for i, p in enumerate(payloads) if PAYLOADS[p] is None]
    table = spark.read.format("delta").load(str(tmp_path / "table"))
    assert sorted(r.seq for r in table.select("seq").collect()) == good
    assert sorted(r.id for r in table.select("id").collect() if r.id is not None) == [1, 2, 3, 20]
    dead = spark.read.format("delta").load(str(tmp_path / "table_dead_letters")).collect()
    assert {r.seq: (bytes(r.data), r.error) for r in dead} == {
        i + 1: (p, PAYLOADS[p]) for i, p in enumerate(payloads) if PAYLOADS[p] is not None}
    assert (report.messages_written, report.dead_letters) == (len(good), len(payloads) - len(good))
    info = settled(js, names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)  # acked only after the commits


def test_drain_keeps_raw_payloads_in_rows_with_keep_raw(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    payloads = [b'{"id": 1, "kind": "k"}', b'{"foo": 1}']
    publish_and_wait(js, names, [(f"{names.prefix}.e", p) for p in payloads])

    report = run_drain(spark, drain_config(names, nats_server, tmp_path, "decode.keep_raw=true"))

    assert (report.messages_written, report.dead_letters) == (2, 0)
    rows = spark.read.format("delta").load(str(tmp_path / "table")).orderBy("seq").collect()
    assert [bytes(r.data) for r in rows] == payloads


def test_drain_refuses_a_headers_only_consumer_before_fetching(spark, js, names, nats_server,
                                                               tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b'{"id": 1}', [("K", "v")])])
    js.run(js.conn.request(f"CONSUMER.CREATE.{names.stream}.{names.consumer}", {
        "stream_name": names.stream, "action": "create",
        "config": {"durable_name": names.consumer, "ack_policy": "explicit",
                   "headers_only": True}}))

    with pytest.raises(ConsumerConfigError) as err:
        run_drain(spark, drain_config(names, nats_server, tmp_path))

    assert isinstance(err.value, TerminalError)
    assert "headers only" in str(err.value)
    assert (f"`nats consumer edit {names.stream} {names.consumer} --no-headers-only -f`"
            in str(err.value))
    info = js.consumer_info(names.stream, names.consumer)
    assert info.delivered.stream_seq == 0 and info.num_pending == 1  # nothing was fetched
    assert not (tmp_path / "table").exists()


def test_drain_refuses_a_schema_clash_before_fetching(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b'{"id": 1, "Subject": "x"}')])
    config = drain_config(names, nats_server, tmp_path)
    # A config that bypassed load_config's check still fails in the drain, before any pull.
    clashing = config.__class__(**{**{f: getattr(config, f) for f in (
        "nats", "source", "fetch", "run", "target", "spark")},
        "decode": _unchecked_decode("id BIGINT, Subject STRING")})

    with pytest.raises(ConfigError, match="Subject"):
        run_drain(spark, clashing)

    with pytest.raises(ConsumerNotFoundError):  # not even created: nothing was fetched
        js.consumer_info(names.stream, names.consumer)


def _unchecked_decode(schema: str) -> Any:
    from js_etl.config import DecodeConfig

    checked = DecodeConfig(format="json", schema="id BIGINT")
    object.__setattr__(checked, "schema", schema)
    return checked


# --- missing stream or consumer: named -----------------------------------------------------------
def test_missing_stream_and_consumer_are_named(js, names):
    with pytest.raises(StreamNotFoundError) as err:
        js.stream_info(names.stream)
    assert str(err.value) == f"stream not found: '{names.stream}' (code 404, err_code 10059)"
    with pytest.raises(StreamNotFoundError, match=f"stream not found: '{names.stream}'"):
        js.consumer_info(names.stream, names.consumer)
    add_stream(js, names)
    with pytest.raises(ConsumerNotFoundError) as err:
        js.consumer_info(names.stream, names.consumer)
    assert str(err.value) == (f"consumer not found: '{names.consumer}' on stream "
                              f"'{names.stream}' (code 404, err_code 10014)")


# --- secrets are never echoed --------------------------------------------------------------------
SECRET = "s3cr3tT0KEN_value"


@pytest.mark.parametrize("setting", [
    f"nats.token_file={SECRET}", f"nats.token_env={SECRET}",
    f"nats.password_file={SECRET}", f"nats.password_env={SECRET}",
    f"nats.creds_file={SECRET}", f"nats.nkey_seed_file={SECRET}",
])
def test_a_secret_pasted_as_a_path_or_variable_name_is_never_echoed(setting):
    key = setting.split("=")[0]
    user = ["nats.user=u"] if "password" in key else []
    config = load_config(None, ["source.stream=S", "source.consumer=c", "target.path=/t",
                                setting, *user], environ={})

    with pytest.raises(ConfigError) as err:  # before any connection, and before Spark starts
        config.nats.connection_options(environ={}).check()

    assert key in str(err.value) and SECRET not in str(err.value)


# --- exit codes of the js-etl command ------------------------------------------------------------
def js_etl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(BIN / "js-etl"), *args], capture_output=True, text=True,
                          timeout=300, env=env, check=False)


@pytest.mark.parametrize("where", ["under a regular file", "in /proc"])
def test_unwritable_target_path_exits_2_naming_it_before_spark(nats_server, tmp_path, where):
    (tmp_path / "a-file").write_text("not a directory\n")
    path = tmp_path / "a-file" / "table" if where == "under a regular file" else \
        Path("/proc/js-etl-test-table")
    result = js_etl("drain", "--set", f"nats.servers={nats_server.url}",
                    "--set", "source.stream=S", "--set", "source.consumer=c",
                    "--set", f"target.path={path}")

    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"js-etl: ConfigError: target.path {path}: ")
    assert "Spark" not in result.stderr and "py4j" not in result.stderr  # refused before Spark


def test_schema_clash_by_case_exits_2_before_anything_is_fetched(js, names, nats_server,
                                                                  tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", json.dumps({"id": 1}).encode())])
    result = js_etl("drain", "--set", f"nats.servers={nats_server.url}",
                    "--set", f"source.stream={names.stream}",
                    "--set", f"source.consumer={names.consumer}",
                    "--set", "source.create_consumer=true",
                    "--set", f"target.path={tmp_path / 'table'}", "--set", "decode.format=json",
                    "--set", "decode.schema=id BIGINT, Subject STRING")

    assert result.returncode == 2, result.stderr
    assert "Subject" in result.stderr.strip().splitlines()[-1]
    with pytest.raises(ConsumerNotFoundError):
        js.consumer_info(names.stream, names.consumer)
