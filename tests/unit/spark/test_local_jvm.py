"""Which JVM options local Spark starts with (js_etl.spark.session.local_jvm_options), and when
a drain's settings say it will use the columnar writer
(js_etl.drain.writers.columnar_plan.expects_columnar): pure logic.
tests/spark/test_local_spark_jvm.py starts the JVMs."""

from __future__ import annotations

import pytest

from js_etl.config import load_config
from js_etl.drain.writers.columnar_plan import expects_columnar
from js_etl.spark.session import local_jvm_options

JSON_JOB = ("source.stream=S", "source.consumer=c", "target.path=/lake/t", "decode.format=json",
            "decode.schema=id BIGINT, kind STRING, amount DOUBLE, ok BOOLEAN, n INT",
            "target.partition_by=[to_date(published_at) AS date, kind]")


def job(*overrides: str) -> bool:
    return expects_columnar(load_config(None, (*JSON_JOB, *overrides), environ={}))


def test_a_plain_json_job_expects_the_columnar_writer() -> None:
    assert job()
    assert job("decode.schema=`id` long, kind string, n integer")
    assert job("decode.schema=id BIGINT, at TIMESTAMP, d DATE, l TIMESTAMP_NTZ",
               "target.partition_by=[]")
    assert job("decode.schema=id BIGINT, kind STRING, amount DOUBLE, ok BOOLEAN, n INT, "
               "p DECIMAL(18,4), tags ARRAY<STRING>, c STRUCT<id BIGINT, `a b` STRUCT<x "
               "DATE>>, m MAP<STRING, ARRAY<DEC>> NOT NULL COMMENT 'm'")
    # Spark reads a TIMESTAMP without an offset in the session's zone, the decoder in UTC.
    assert not job("decode.schema=id BIGINT, at TIMESTAMP", "target.partition_by=[]",
                   "spark.conf.spark.sql.session.timeZone=Europe/Paris")


@pytest.mark.parametrize("override", [
    "target.writer=spark",
    "decode.unknown_fields=dead_letter",
    "decode.schema=id BIGINT, at FLOAT, kind STRING",  # a type it does not write
    "decode.schema=id BIGINT, c STRUCT<at BINARY>, kind STRING",
    "decode.schema=id BIGINT, kind STRING, n SMALLINT",
    "decode.schema=id BIGINT, kind STRING, m MAP<INT, STRING>",
    "decode.schema=id BIGINT, kind STRING, c STRUCT<>",
    "decode.schema=id BIGINT, kind STRING, c STRUCT<f FLOAT>",
    "decode.schema=id BIGINT, kind STRING, at TIMESTAMP, n INT COLLATE x",  # not sure: Spark's
    "target.partition_by=[amount]",  # DOUBLE partitions are Spark's writer's
    "target.partition_by=[year(published_at) AS y]",
    "spark.conf.spark.sql.session.timeZone=Europe/Paris",
])
def test_settings_the_columnar_writer_cannot_take_expect_spark(override: str) -> None:
    assert not job(override)


@pytest.mark.parametrize("settings, columnar", [
    ((), True),  # raw, the default format
    (("decode.format=text",), True),
    (("decode.format=raw", "target.partition_by=[to_date(published_at) AS d]"), True),
    (("decode.format=text", "target.partition_by=[length(text) AS n]"), False),
    (("decode.format=raw", "target.writer=spark"), False),
])
def test_raw_and_text_jobs_expect_the_columnar_writer(settings, columnar) -> None:
    assert expects_columnar(load_config(None, ("source.stream=S", "source.consumer=c",
                                               "target.path=/lake/t", *settings),
                                        environ={})) is columnar


def test_local_spark_uses_the_serial_collector_and_c1_only_for_the_columnar_writer() -> None:
    assert local_jvm_options(columnar=False, environ={}).split() == [
        "-Duser.timezone=UTC", "-XX:+UseSerialGC"]
    assert local_jvm_options(columnar=True, environ={}).split() == [
        "-Duser.timezone=UTC", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


def test_the_users_extra_java_options_replace_js_etls() -> None:
    from js_etl.spark.session import local_builder

    options = local_builder("local[1]", "x", {"spark.driver.extraJavaOptions": "-Dx=1"})._options
    assert options["spark.driver.extraJavaOptions"] == "-Dx=1"


@pytest.mark.parametrize("variable", ["SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
                                      "JDK_JAVA_OPTIONS"])
def test_a_collector_or_compiler_chosen_elsewhere_is_left_alone(variable: str) -> None:
    # Two collectors stop the JVM from starting: "Multiple garbage collectors selected".
    options = local_jvm_options(columnar=True, environ={
        variable: "-Xss4m -XX:+UseG1GC -XX:-TieredCompilation"})
    assert options == "-Duser.timezone=UTC"
    assert local_jvm_options(columnar=True, environ={}, conf={
        "spark.driver.defaultJavaOptions": "-XX:+UseParallelGC"}).split() == [
        "-Duser.timezone=UTC", "-XX:TieredStopAtLevel=1"]


@pytest.mark.parametrize(("writer", "columnar"), [("auto", True), ("spark", False)])
def test_js_etl_drain_starts_local_spark_for_the_writer_it_expects(monkeypatch, tmp_path, writer,
                                                                   columnar):
    import js_etl.spark.session as session
    from js_etl import cli
    from js_etl.drain import preflight

    class Started(Exception):
        pass

    def job_session(spark_config, *, spark_submit, columnar=False, object_store=False):
        raise Started(spark_submit, columnar, object_store)

    monkeypatch.setattr(session, "job_session", job_session)
    monkeypatch.setattr(preflight, "check_drainable", lambda config, options: None)  # no NATS
    config = load_config(None, (*JSON_JOB, f"target.path={tmp_path / 't'}",
                                f"target.writer={writer}"), environ={})
    with pytest.raises(Started) as started:
        cli._drain(config, None, False)
    assert started.value.args == (False, columnar, False)
    # A table on S3: the session gets S3A too (its packages, when Spark resolves Delta).
    on_s3 = load_config(None, (*JSON_JOB, "target.path=s3://bucket/t",
                               f"target.writer={writer}"), environ={})
    with pytest.raises(Started) as started:
        cli._drain(on_s3, None, False)
    assert started.value.args == (False, columnar, True)


def test_a_pyspark_of_another_line_than_deltas_jars_fails_in_one_line(monkeypatch):
    import pyspark

    from js_etl.errors import TerminalError
    from js_etl.spark.session import pyspark_session

    assert pyspark_session().__name__ == "SparkSession"
    monkeypatch.setattr(pyspark, "__version__", "4.3.0")
    with pytest.raises(TerminalError, match=r"^js-etl runs on Spark 4\.2\.x \(pyspark>=4\.2\.0,"
                                            r"<4\.3\), the line of its Delta jars; this is "
                                            r"pyspark 4\.3\.0$"):
        pyspark_session()
