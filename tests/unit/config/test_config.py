"""Pure-logic tests of js_etl.config: no servers, no Spark."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from js_etl.config import (
    DecodeConfig,
    FetchConfig,
    JobConfig,
    NatsConfig,
    SourceConfig,
    TargetConfig,
    load_config,
)
from js_etl.demo import demo_config
from js_etl.errors import ConfigError, TerminalError

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"

# The smallest valid job, as overrides.
MINIMAL = ("source.stream=ORDERS", "source.consumer=orders_to_delta", "target.path=/lake/orders")


def load(*overrides: str, env: dict[str, str] | None = None, path: Path | None = None) -> JobConfig:
    return load_config(path, overrides=(*MINIMAL, *overrides), environ=env or {})


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


BASE_YAML = """
source:
  stream: ORDERS
  consumer: orders_to_delta
target:
  path: /lake/orders
"""


# ------------------------------------------------------------------------------- defaults, API


def test_defaults() -> None:
    cfg = load()
    assert cfg.nats.servers == ["nats://127.0.0.1:4222"]
    assert cfg.nats.name == "js-etl"
    assert cfg.nats.connect_timeout == 5.0
    assert cfg.nats.tls.ca_file is None
    assert cfg.source.create_consumer is False
    assert cfg.source.filter_subjects == []
    assert cfg.source.max_ack_pending is None
    assert (cfg.fetch.partitions, cfg.fetch.batch) == (2, 4000)
    assert cfg.fetch.max_bytes == 8_388_608
    assert cfg.fetch.partition_max_bytes == 128 * 1024**2
    assert cfg.fetch.pull_timeout == 5.0
    assert dataclasses.astuple(cfg.run) == (None, None, None, None)
    assert (cfg.decode.format, cfg.decode.schema, cfg.decode.merge_schema) == ("raw", None, False)
    assert cfg.target.partition_by == []
    assert (cfg.spark.master, cfg.spark.app_name, cfg.spark.conf) == ("local[2]", "js-etl", {})
    assert cfg.spark.remote is None


def test_default_lists_are_not_shared() -> None:
    a, b = load(), load()
    assert a.target.partition_by is not b.target.partition_by
    assert a.nats.servers is not b.nats.servers


def test_job_id_and_as_dict_is_json() -> None:
    cfg = load()
    assert cfg.job_id == "js-etl:ORDERS:orders_to_delta"
    data = cfg.as_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["fetch"]["batch"] == 4000
    assert data["nats"]["tls"] == {"ca_file": None, "cert_file": None, "key_file": None}


def test_frozen() -> None:
    cfg = load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.fetch.batch = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.source = cfg.source  # type: ignore[misc]
    assert not hasattr(cfg.fetch, "__dict__")  # slots


def test_config_error_is_terminal() -> None:
    with pytest.raises(TerminalError):
        load("fetch.batch=0")


def test_direct_construction_is_validated_and_normalised() -> None:
    fetch = FetchConfig(max_bytes="1MiB", pull_timeout="250ms")  # type: ignore[arg-type]
    assert (fetch.max_bytes, fetch.pull_timeout) == (1024 * 1024, 0.25)
    with pytest.raises(ConfigError, match=r"^fetch\.batch: expected a positive integer, got 0$"):
        FetchConfig(batch=0)
    assert NatsConfig(servers="a:1").servers == ["nats://a:1"]  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- layers


def test_yaml_load(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        BASE_YAML
        + """
nats:
  servers: [nats://a:4222, b:4223]
  tls: {ca_file: /etc/ca.pem}
fetch: {batch: 250, max_bytes: 4MiB}
decode: {format: json, schema: "id BIGINT"}
spark:
  conf: {spark.sql.shuffle.partitions: 8, spark.sql.adaptive.enabled: true}
""",
    )
    cfg = load_config(path, environ={})
    assert cfg.nats.servers == ["nats://a:4222", "nats://b:4223"]
    assert cfg.nats.tls.ca_file == "/etc/ca.pem"
    assert (cfg.fetch.batch, cfg.fetch.max_bytes) == (250, 4 * 1024 * 1024)
    assert cfg.decode.schema == "id BIGINT"
    assert cfg.spark.conf == {
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
    }


def test_no_file_everything_from_env_and_flags() -> None:
    cfg = load_config(
        None,
        overrides=["target.table=bronze.orders"],
        environ={"JS_ETL__SOURCE__STREAM": "ORDERS", "JS_ETL__SOURCE__CONSUMER": "c1"},
    )
    assert cfg.source.stream == "ORDERS"
    assert cfg.source.consumer == "c1"
    assert cfg.target.table == "bronze.orders"


def test_empty_yaml_file_and_empty_section(tmp_path: Path) -> None:
    assert load(path=write(tmp_path, "")).fetch.batch == 4000
    assert load(path=write(tmp_path, "nats:\nfetch:\n", "b.yaml")).fetch.batch == 4000


def test_env_overrides_yaml_and_set_overrides_env(tmp_path: Path) -> None:
    path = write(tmp_path, BASE_YAML + "fetch: {batch: 10, partitions: 3}\n")
    env = {"JS_ETL__FETCH__BATCH": "20", "JS_ETL__FETCH__PARTITIONS": "4"}
    cfg = load_config(path, environ=env)
    assert (cfg.fetch.batch, cfg.fetch.partitions) == (20, 4)
    cfg = load_config(path, overrides=["fetch.batch=30"], environ=env)
    assert (cfg.fetch.batch, cfg.fetch.partitions) == (30, 4)


def test_env_nested_and_lowercased_and_prefix_only() -> None:
    env = {
        "JS_ETL__NATS__TLS__CA_FILE": "/ca.pem",
        "JS_ETL_FETCH__BATCH": "not-ours",  # single underscore: not the prefix
        "FETCH__BATCH": "not-ours",
        "PATH": "/usr/bin",
    }
    cfg = load(env=env)
    assert cfg.nats.tls.ca_file == "/ca.pem"
    assert cfg.fetch.batch == 4000


def test_env_whole_section_then_key() -> None:
    env = {"JS_ETL__FETCH": "{batch: 5, partitions: 7}", "JS_ETL__FETCH__BATCH": "6"}
    cfg = load(env=env)
    assert (cfg.fetch.batch, cfg.fetch.partitions) == (6, 7)


def test_does_not_mutate_inputs(tmp_path: Path) -> None:
    env = {"JS_ETL__FETCH__BATCH": "5"}
    overrides = ["fetch.batch=6", *MINIMAL]
    load_config(None, overrides=overrides, environ=env)
    assert env == {"JS_ETL__FETCH__BATCH": "5"}
    assert overrides == ["fetch.batch=6", *MINIMAL]


def test_os_environ_is_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JS_ETL__FETCH__BATCH", "77")
    assert load_config(None, overrides=MINIMAL).fetch.batch == 77


def test_single_override_string_is_one_override() -> None:
    with pytest.raises(ConfigError, match=r"source\.stream is required"):
        load_config(None, overrides="fetch.batch=5", environ={})


# ------------------------------------------------------------------------------- value parsing


@pytest.mark.parametrize(
    ("override", "attr", "expected"),
    [
        ("fetch.batch=500", ("fetch", "batch"), 500),
        ("source.create_consumer=true", ("source", "create_consumer"), True),
        ("source.create_consumer=no", ("source", "create_consumer"), False),
        ("source.filter_subjects=[a.>, b.>]", ("source", "filter_subjects"), ["a.>", "b.>"]),
        ("source.filter_subjects=a.>,b.>", ("source", "filter_subjects"), ["a.>", "b.>"]),
        ("source.filter_subjects=>", ("source", "filter_subjects"), [">"]),
        ("source.filter_subjects=*.created", ("source", "filter_subjects"), ["*.created"]),
        ("source.filter_subjects=", ("source", "filter_subjects"), []),
        ("source.max_ack_pending=-1", ("source", "max_ack_pending"), -1),
        ("source.max_deliver=null", ("source", "max_deliver"), None),
        ("nats.tls.ca_file=/x", ("nats", "tls", "ca_file"), "/x"),
        ("nats.name=1.10", ("nats", "name"), "1.10"),  # strings stay verbatim, not YAML floats
        ("nats.connect_timeout=2", ("nats", "connect_timeout"), 2.0),
        ("run.max_seconds=1.5", ("run", "max_seconds"), 1.5),
        ("target.partition_by=to_date(ts) AS date, concat(a, b) AS k", ("target", "partition_by"),
         ["to_date(ts) AS date", "concat(a, b) AS k"]),
        ("spark.conf={spark.sql.shuffle.partitions: 4}", ("spark", "conf"),
         {"spark.sql.shuffle.partitions": "4"}),
        ("spark.conf.spark.sql.shuffle.partitions=4", ("spark", "conf"),
         {"spark.sql.shuffle.partitions": "4"}),
        ("decode.format=text", ("decode", "format"), "text"),
    ],
)  # fmt: skip
def test_set_values_are_parsed(override: str, attr: tuple[str, ...], expected: object) -> None:
    value: object = load(override)
    for name in attr:
        value = getattr(value, name)
    assert value == expected
    assert type(value) is type(expected)


def test_string_key_keeps_yaml_looking_text() -> None:
    cfg = load("nats.user=yes", "nats.password_env=NATS_PASSWORD")
    assert cfg.nats.user == "yes"


def test_spark_conf_entries_merge_across_layers(tmp_path: Path) -> None:
    path = write(tmp_path, BASE_YAML + "spark: {conf: {a.b: '1', c.d: '2'}}\n")
    cfg = load_config(
        path,
        overrides=["spark.conf.c.d=3", "spark.conf.e.f=false"],
        environ={"JS_ETL__SPARK__CONF__G.H": "4"},
    )
    assert cfg.spark.conf == {"a.b": "1", "c.d": "3", "e.f": "false", "g.h": "4"}


def test_spark_conf_entry_null_removes_it(tmp_path: Path) -> None:
    path = write(tmp_path, BASE_YAML + "spark: {conf: {a.b: '1', c.d: '2'}}\n")
    cfg = load_config(path, overrides=["spark.conf.a.b=null"], environ={})
    assert cfg.spark.conf == {"c.d": "2"}


def test_spark_conf_values_stay_verbatim() -> None:
    cfg = load("spark.conf.spark.executor.memory=1.10g", "spark.conf.x.y=1.10")
    assert cfg.spark.conf == {"spark.executor.memory": "1.10g", "x.y": "1.10"}


def test_servers_comma_separated_and_normalised() -> None:
    cfg = load(env={"JS_ETL__NATS__SERVERS": "nats://a:4222, b:4222,tls://c:4443,wss://d:443/ws"})
    assert cfg.nats.servers == ["nats://a:4222", "nats://b:4222", "tls://c:4443", "wss://d:443/ws"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1024", 1024),
        ("1KiB", 1024),
        ("512KiB", 512 * 1024),
        ("8MiB", 8 * 1024**2),
        ("8 mib", 8 * 1024**2),
        ("1MB", 1_000_000),
        ("2KB", 2000),
        ("1.5MiB", 1536 * 1024),
    ],
)
def test_byte_units(value: str, expected: int) -> None:
    assert load(f"fetch.max_bytes={value}").fetch.max_bytes == expected


def test_byte_units_unbounded_keys() -> None:
    cfg = load("run.max_bytes=1GiB", "fetch.partition_max_bytes=1GB")
    assert (cfg.run.max_bytes, cfg.fetch.partition_max_bytes) == (1024**3, 10**9)
    assert load("run.max_bytes=100B").run.max_bytes == 100


@pytest.mark.parametrize(
    ("value", "expected"),
    [("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("250ms", 0.25), ("7", 7.0), ("0.5", 0.5),
     ("2 S", 2.0)],
)
def test_duration_units(value: str, expected: float) -> None:
    cfg = load(f"fetch.pull_timeout={value}", f"source.ack_wait={value}")
    assert cfg.fetch.pull_timeout == expected
    assert cfg.source.ack_wait == expected


# ------------------------------------------------------------------------------- type errors


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fetch.batch=abc", r"^fetch\.batch: expected a positive integer, got 'abc' \(from --set fetch\.batch\)$"),
        ("fetch.batch=0", r"^fetch\.batch: expected a positive integer, got 0"),
        ("fetch.batch=true", r"^fetch\.batch: expected a positive integer, got True"),
        ("fetch.batch=2.5", r"^fetch\.batch: expected a positive integer, got 2\.5"),
        ("fetch.partitions=-1", r"^fetch\.partitions: expected a positive integer"),
        ("source.max_ack_pending=0", r"^source\.max_ack_pending: expected -1 \(unlimited\) or a positive integer, got 0"),
        ("source.max_deliver=-2", r"^source\.max_deliver: expected -1 \(unlimited\)"),
        ("source.min_pending=0", r"^source\.min_pending: expected a positive integer"),
        ("fetch.max_bytes=512", r"^fetch\.max_bytes: expected a byte size from 1KiB to 48MiB, e\.g\. 8MiB, got 512; .*slow consumer"),
        ("fetch.max_bytes=64MiB", r"^fetch\.max_bytes: .*got '64MiB'"),
        ("fetch.max_bytes=8XB", r"^fetch\.max_bytes: expected a byte size"),
        ("fetch.max_bytes=1.0000001KiB", r"^fetch\.max_bytes: expected a byte size"),
        ("run.max_bytes=0", r"^run\.max_bytes: expected a positive byte size"),
        ("fetch.pull_timeout=0", r"^fetch\.pull_timeout: expected a positive duration"),
        ("fetch.pull_timeout=5d", r"^fetch\.pull_timeout: expected a positive duration.*got '5d'"),
        ("nats.connect_timeout=true", r"^nats\.connect_timeout: expected a positive duration"),
        ("run.max_seconds=-1", r"^run\.max_seconds: expected a positive duration"),
        ("source.create_consumer=1", r"^source\.create_consumer: expected true or false, got 1"),
        ("decode.format=xml", r"^decode\.format: expected one of 'raw', 'text', 'json', got 'xml'"),
        ("nats.name=[a, b]", r"^nats\.name: expected a non-empty string, got \['a', 'b'\]"),
        ("target.partition_by={a: 1}", r"^target\.partition_by: expected a list of Spark SQL expressions"),
        ("source.filter_subjects=[a, 1]", r"^source\.filter_subjects: expected a list of subject filters"),
        ("source.filter_subjects=orders.>.x", r"^source\.filter_subjects: expected subject filters.*got 'orders\.>\.x'"),
        ("source.filter_subjects=orders..x", r"^source\.filter_subjects: .*got 'orders\.\.x'"),
        ("nats.servers=http://a:80", r"^nats\.servers: expected server URLs like nats://host:4222.*got 'http://a:80'"),
        ("nats.servers=localhost", r"^nats\.servers: .*got 'localhost'"),
        ("nats.servers=a:99999", r"^nats\.servers: .*got 'a:99999'"),
        ("nats.servers=[]", r"^nats\.servers: expected a list of server URLs"),
        ("spark.conf=[a]", r"^spark\.conf: expected a mapping of Spark conf keys"),
        ("spark.conf={a: [1]}", r"^spark\.conf: expected a mapping"),
        ("fetch=3", r"^fetch: expected a mapping of settings, got 3"),
    ],
)  # fmt: skip
def test_type_errors_name_key_expectation_and_value(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(override)


def test_type_error_names_env_origin() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^fetch\.batch: .*got 'x' \(from env JS_ETL__FETCH__BATCH\)$",
    ):
        load(env={"JS_ETL__FETCH__BATCH": "x"})


def test_type_error_names_file_origin(tmp_path: Path) -> None:
    path = write(tmp_path, BASE_YAML + "fetch: {batch: '12'}\n")
    with pytest.raises(ConfigError, match=rf"^fetch\.batch: .*got '12' \(from {path}\)$"):
        load_config(path, environ={})


def test_yaml_true_is_not_an_int(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"fetch\.partitions: expected a positive integer, got True",
    ):
        load_config(write(tmp_path, BASE_YAML + "fetch: {partitions: true}\n"), environ={})


def test_credentials_in_server_url_are_refused_without_echo() -> None:
    with pytest.raises(ConfigError, match=r"^nats\.servers: credentials in server URLs") as err:
        load("nats.servers=nats://bob:hunter2@a:4222")
    assert "hunter2" not in str(err.value)


def test_env_name_fields_never_echo_value() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^nats\.token_env: expected the name of an environment variable",
    ) as err:
        load("nats.token_env=s3cr3t-t0ken!")
    assert "s3cr3t" not in str(err.value)


@pytest.mark.parametrize("name", ["", " ", "my stream", "a.b", "a*", "a>"])
def test_jetstream_names(name: str) -> None:
    with pytest.raises(ConfigError, match=r"^source\.(stream|consumer)"):
        load_config(
            None,
            overrides=[*MINIMAL, f"source.stream={name}"],
            environ={},
        )


def test_jetstream_name_error_text() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^source\.consumer: expected a JetStream name .*got 'a\.b'",
    ):
        load("source.consumer=a.b")


@pytest.mark.parametrize("group", ["bad group", "x" * 17, "a.b"])
def test_priority_group_pattern(group: str) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^source\.priority_group: expected a priority group name",
    ):
        load(f"source.priority_group={group}")


def test_priority_group_ok() -> None:
    cfg = load(
        "source.priority_group=jobs_A=/-1", "source.min_pending=10", "source.min_ack_pending=2"
    )
    assert (cfg.source.priority_group, cfg.source.min_pending) == ("jobs_A=/-1", 10)


# ------------------------------------------------------------------------------- unknown keys


def test_unknown_key_suggests_closest() -> None:
    with pytest.raises(
        ConfigError, match=r"^unknown key 'source\.consumr' \(did you mean 'source\.consumer'\?\)"
    ):
        load("source.consumr=x")


def test_unknown_key_in_yaml_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, BASE_YAML + "fetch:\n  max_byte: 1MiB\n")
    with pytest.raises(
        ConfigError, match=rf"unknown key 'fetch\.max_byte' \(did you mean 'fetch\.max_bytes'\?\) \(from {path}\)"
    ):
        load_config(path, environ={})


def test_unknown_section_suggests_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'sourc' \(did you mean 'source'\?\)"):
        load_config(write(tmp_path, "sourc:\n  stream: X\n"), environ={})


def test_unknown_env_key() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'fetch\.bacth' \(did you mean 'fetch\.batch'\?\) \(from env JS_ETL__FETCH__BACTH\)",
    ):
        load(env={"JS_ETL__FETCH__BACTH": "3"})


def test_unknown_key_without_close_match_lists_valid_keys() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'run\.zzzzzzzz' \(valid keys in run: max_messages, max_bytes",
    ):
        load("run.zzzzzzzz=1")


def test_key_below_a_value_is_unknown() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'fetch\.batch\.x'"):
        load("fetch.batch.x=1")
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'fetch\.batch\.qqqqqqqqqqqqqqqqq' \(valid keys in fetch: partitions",
    ):
        load("fetch.batch.qqqqqqqqqqqqqqqqq=1")


def test_empty_env_key_is_unknown() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^unknown key '' \(valid keys in the top level: nats, source.*\(from env JS_ETL__\)$",
    ):
        load(env={"JS_ETL__": "{fetch: {batch: 1}}"})
    with pytest.raises(ConfigError, match=r"^unknown key 'fetch\.\.batch'"):
        load(env={"JS_ETL__FETCH____BATCH": "1"})


# ------------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    ("key", "fix"),
    [
        ("token", r"use nats\.token_env \(name of an environment variable\) or nats\.token_file"),
        ("password", r"use nats\.password_env \(name of an environment variable\) or nats\.password_file"),
        ("nkey_seed", r"use nats\.nkey_seed_file"),
        ("seed", r"use nats\.nkey_seed_file"),
    ],
)
def test_secret_literals_refused_everywhere(tmp_path: Path, key: str, fix: str) -> None:
    message = rf"^nats\.{key}: secrets are never read from config; {fix}"
    with pytest.raises(ConfigError, match=message) as err:
        load(f"nats.{key}=SUPERSECRET")
    assert "SUPERSECRET" not in str(err.value)
    with pytest.raises(ConfigError, match=message) as err:
        load(env={f"JS_ETL__NATS__{key.upper()}": "SUPERSECRET"})
    assert "SUPERSECRET" not in str(err.value)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(write(tmp_path, BASE_YAML + f"nats:\n  {key}: SUPERSECRET\n"), environ={})
    assert "SUPERSECRET" not in str(err.value)


def test_exact_token_message() -> None:
    with pytest.raises(ConfigError) as err:
        load("nats.token=x")
    assert str(err.value).startswith(
        "nats.token: secrets are never read from config; "
        "use nats.token_env (name of an environment variable) or nats.token_file"
    )


# ------------------------------------------------------------------------------- required


@pytest.mark.parametrize("key", ["stream", "consumer"])
def test_required_source_names(key: str) -> None:
    overrides = [o for o in MINIMAL if not o.startswith(f"source.{key}=")]
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides=overrides, environ={})
    assert str(err.value) == (
        f"source.{key} is required (set it in the YAML, JS_ETL__SOURCE__{key.upper()} "
        f"or --set source.{key}=NAME)"
    )


def test_null_means_default(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "source: {stream: S, consumer: c}\n"
        "fetch: {batch: 10}\n"
        "target: {path: /p, partition_by: [a]}\n",
    )
    cfg = load_config(path, overrides=["fetch.batch=null", "target.partition_by=~"], environ={})
    assert (cfg.fetch.batch, cfg.target.partition_by) == (4000, [])
    cfg = load_config(path, environ={"JS_ETL__TARGET__PATH": "", "JS_ETL__TARGET__TABLE": "t"})
    assert (cfg.target.path, cfg.target.table) == (None, "t")
    with pytest.raises(ConfigError, match=r"^fetch\.batch: expected a positive integer, got null$"):
        FetchConfig(batch=None)  # type: ignore[arg-type]


def test_required_cannot_be_nulled_by_a_later_layer() -> None:
    with pytest.raises(ConfigError, match=r"^source\.stream is required"):
        load("source.stream=")


# ------------------------------------------------------------------------------- decode rules


def test_json_requires_schema() -> None:
    with pytest.raises(
        ConfigError,
        match=r"decode\.format is 'json' but decode\.schema is not set",
    ):
        load("decode.format=json")


def test_json_with_schema_ok() -> None:
    cfg = load(
        "decode.format=json", "decode.schema=id BIGINT, kind STRING", "decode.merge_schema=true"
    )
    assert cfg.decode == DecodeConfig(
        format="json", schema="id BIGINT, kind STRING", merge_schema=True
    )


def test_schema_requires_json() -> None:
    with pytest.raises(
        ConfigError,
        match=r"decode\.schema is set but decode\.format is 'text'.*decode\.format",
    ):
        load("decode.format=text", "decode.schema=id BIGINT")


def test_merge_schema_requires_json() -> None:
    with pytest.raises(
        ConfigError,
        match=r"decode\.merge_schema is true but decode\.format is 'raw'",
    ):
        load("decode.merge_schema=true")


# ------------------------------------------------------------------------------- target rules


def test_target_needs_path_or_table() -> None:
    with pytest.raises(ConfigError, match=r"target\.path or target\.table is required"):
        load_config(None, overrides=MINIMAL[:2], environ={})


def test_target_path_and_table_exclusive() -> None:
    with pytest.raises(
        ConfigError,
        match=r"target\.path and target\.table are both set; keep exactly one",
    ):
        load("target.table=bronze.orders")


def test_dead_letter_path_and_table_exclusive() -> None:
    with pytest.raises(
        ConfigError, match=r"target\.dead_letter_path and target\.dead_letter_table are both set"
    ):
        load("target.dead_letter_path=/dl", "target.dead_letter_table=dl")


def test_dead_letter_must_differ_from_target() -> None:
    with pytest.raises(ConfigError, match=r"target\.dead_letter_path is the same as target\.path"):
        load("target.dead_letter_path=/lake/orders/")


@pytest.mark.parametrize(
    ("settings", "path", "table"),
    [
        ({"path": "/lake/orders/"}, "/lake/orders_dead_letters", None),
        ({"path": "/lake/orders", "dead_letter_path": "/dl"}, "/dl", None),
        ({"path": "/lake/orders", "dead_letter_table": "bronze.dl"}, None, "bronze.dl"),
        ({"table": "bronze.orders"}, None, "bronze.orders_dead_letters"),
        ({"table": "bronze.orders", "dead_letter_path": "/dl"}, "/dl", None),
    ],
)
def test_resolved_dead_letters(
    settings: dict[str, str], path: str | None, table: str | None
) -> None:
    target = TargetConfig(**settings)
    assert target.resolved_dead_letter_path == path
    assert target.resolved_dead_letter_table == table


# ------------------------------------------------------------------------------- credentials


@pytest.mark.parametrize(
    "creds",
    [
        (),
        ("nats.creds_file=/c.creds",),
        ("nats.nkey_seed_file=/s.nk",),
        ("nats.token_env=NATS_TOKEN",),
        ("nats.token_file=/t",),
        ("nats.user=etl", "nats.password_env=NATS_PASSWORD"),
        ("nats.user=etl", "nats.password_file=/p"),
    ],
)
def test_single_credential_kind_ok(creds: tuple[str, ...]) -> None:
    load(*creds)


@pytest.mark.parametrize(
    ("creds", "message"),
    [
        (("nats.creds_file=/c", "nats.token_env=T"), r"nats\.creds_file and nats\.token_env are both set; use one credential kind"),
        (("nats.nkey_seed_file=/s", "nats.creds_file=/c"), r"nats\.creds_file and nats\.nkey_seed_file are both set; use one"),
        (("nats.token_file=/t", "nats.user=u", "nats.password_env=P"), r"nats\.token_file and nats\.user are both set; use one"),
        (("nats.token_env=T", "nats.token_file=/t"), r"nats\.token_env and nats\.token_file are both set; .*keep one"),
        (("nats.user=u", "nats.password_env=P", "nats.password_file=/p"), r"nats\.password_env and nats\.password_file are both set"),
        (("nats.password_env=P",), r"nats\.password_env is set without nats\.user; set nats\.user"),
        (("nats.password_file=/p",), r"nats\.password_file is set without nats\.user"),
        (("nats.user=u",), r"nats\.user is set without a password; set nats\.password_env or nats\.password_file"),
    ],
)  # fmt: skip
def test_credential_combinations(creds: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(*creds)


def test_three_credential_kinds() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^nats\.creds_file, nats\.nkey_seed_file and nats\.token_env are all set; use one",
    ):
        load("nats.creds_file=/c", "nats.nkey_seed_file=/s", "nats.token_env=T")


def test_tls_cert_and_key_together() -> None:
    with pytest.raises(
        ConfigError,
        match=r"nats\.tls\.cert_file is set without nats\.tls\.key_file",
    ):
        load("nats.tls.cert_file=/c.pem")
    with pytest.raises(
        ConfigError,
        match=r"nats\.tls\.key_file is set without nats\.tls\.cert_file",
    ):
        load("nats.tls.key_file=/k.pem")
    cfg = load("nats.tls.cert_file=/c.pem", "nats.tls.key_file=/k.pem")
    assert (cfg.nats.tls.cert_file, cfg.nats.tls.key_file) == ("/c.pem", "/k.pem")


# ------------------------------------------------------------------------------- other combinations


@pytest.mark.parametrize("key", ["min_pending", "min_ack_pending"])
def test_min_pending_requires_priority_group(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"source\.{key} requires source\.priority_group"):
        load(f"source.{key}=5")


def test_partition_max_bytes_at_least_max_bytes() -> None:
    with pytest.raises(
        ConfigError,
        match=r"fetch\.partition_max_bytes \(4MiB\) is smaller than fetch\.max_bytes \(8MiB\)",
    ):
        load("fetch.partition_max_bytes=4MiB")
    assert load("fetch.partition_max_bytes=8MiB").fetch.partition_max_bytes == 8 * 1024**2


# ------------------------------------------------------------------------------- files and flags


def test_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=rf"cannot read config file {missing}: No such file"):
        load_config(missing, environ={})


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"cannot read config file {tmp_path}"):
        load_config(tmp_path, environ={})


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  stream: [unclosed\n")
    with pytest.raises(
        ConfigError,
        match=rf"^invalid YAML in {path} at line \d+, column \d+",
    ) as err:
        load_config(path, environ={})
    assert "\n" not in str(err.value)


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, BASE_YAML + "source:\n  create_consumer: true\n")
    with pytest.raises(
        ConfigError,
        match=rf"invalid YAML in {path} at line \d+.*duplicate key 'source'",
    ):
        load_config(path, environ={})


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_mapping(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"^{path}: the top level must be a mapping"):
        load_config(path, environ={})


@pytest.mark.parametrize("bad", ["fetch.batch", "=5", ""])
def test_set_without_equals(bad: str) -> None:
    with pytest.raises(
        ConfigError,
        match=r"expected --set section\.key=value, e\.g\. --set fetch\.batch=500",
    ):
        load(bad)


def test_messages_are_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        load("nats.name='a\nb'", "fetch.batch=x\ny")
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------- shipped examples


@pytest.mark.parametrize("path", [CONF_DIR / "example.yaml", demo_config()],
                         ids=["example.yaml", "demo.yaml"])
def test_shipped_examples_load(path: Path) -> None:
    cfg = load_config(path, environ={})
    assert cfg.decode.format == "json" and cfg.decode.schema
    assert cfg.target.partition_by == ["to_date(published_at) AS date"]


def test_the_production_example_is_accepted_as_shipped() -> None:
    """conf/production.yaml: TLS, a .creds file and an S3 table, and no secret in the file."""
    cfg = load_config(CONF_DIR / "production.yaml", environ={})
    assert all(s.startswith("tls://") for s in cfg.nats.servers) and len(cfg.nats.servers) == 3
    assert (cfg.nats.creds_file, cfg.nats.tls.ca_file) == (
        "/run/secrets/nats/orders-etl.creds", "/etc/ssl/nats/ca.pem")
    assert cfg.target.path == "s3://lake/bronze/orders"
    assert cfg.target.resolved_dead_letter_path == "s3://lake/bronze/orders_dead_letters"


def test_demo_yaml_contents() -> None:
    cfg = load_config(
        demo_config(), overrides=["nats.servers=127.0.0.1:14222"], environ={}
    )
    assert cfg.job_id == "js-etl:DEMO:demo_drain"
    assert cfg.source.create_consumer is True
    assert cfg.decode.schema == "id BIGINT, kind STRING, amount DOUBLE, ts STRING"
    assert cfg.target.path == ".demo/events"
    assert cfg.target.resolved_dead_letter_path == ".demo/events_dead_letters"
    assert (cfg.fetch.partitions, cfg.fetch.batch) == (2, 1000)
    assert cfg.nats.servers == ["nats://127.0.0.1:14222"]


def test_example_yaml_values() -> None:
    cfg = load_config(CONF_DIR / "example.yaml", environ={})
    assert (cfg.source.stream, cfg.source.consumer) == ("ORDERS", "orders_to_delta")
    assert cfg.nats.token_env is None  # shown commented out
    assert "token_env: NATS_TOKEN" in (CONF_DIR / "example.yaml").read_text()
    assert cfg.source == dataclasses.replace(cfg.source)  # re-validation is idempotent
    assert isinstance(cfg.source, SourceConfig)


@pytest.mark.parametrize("partition_by", [
    "[kind, KIND]",
    "[to_date(published_at) AS day, to_date(published_at) AS DAY]",
    "[kind, lower(subject) AS Kind]",
])
def test_a_partition_column_named_twice_is_refused(partition_by: str) -> None:
    """Delta refuses the table (Spark's create), or deltalake writes it and then cannot read it
    back (a break-it review): refused before anything is fetched or created."""
    with pytest.raises(ConfigError, match=r"^target\.partition_by names the column .* twice"):
        load("decode.format=json", "decode.schema=id BIGINT, kind STRING",
             f"target.partition_by={partition_by}")


def test_the_configuration_page_names_every_key() -> None:
    """docs/configuration.md has a row for every key a job config takes."""
    import typing
    from pathlib import Path

    from js_etl.config.model import JobConfig

    def keys(section: type, prefix: str = "") -> list[str]:
        hints = typing.get_type_hints(section)
        return [key for f in dataclasses.fields(section)
                for key in (keys(hints[f.name], f"{prefix}{f.name}.")
                            if dataclasses.is_dataclass(hints[f.name]) else [prefix + f.name])]

    page = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    every = keys(JobConfig)
    assert len(every) > 40 and "spark.remote" in every
    assert [key for key in every if f"`{key}`" not in page] == []


@pytest.mark.parametrize("url", [
    "http://h:15002/;token=s3cret", "sc://h:port/;token=s3cret", "sc://h:99999/;token=s3cret",
    "sc://[::1/;token=s3cret", "sc:///;token=s3cret", "sc://h:0/;token=s3cret"])
def test_a_spark_remote_that_is_no_connect_url_is_refused_without_showing_it(url):
    with pytest.raises(ConfigError, match=r"^spark\.remote: not a Spark Connect URL") as refused:
        load(f"spark.remote={url}")
    assert "s3cret" not in str(refused.value)


def test_a_spark_remote_is_kept_as_written_and_takes_connects_default_port():
    from js_etl.config.values import connect_address

    assert load("spark.remote=sc://h/;token=t").spark.remote == "sc://h/;token=t"
    assert connect_address("sc://h/;token=t") == ("h", 15002)
    assert connect_address("sc://[::1]:15003") == ("::1", 15003)
