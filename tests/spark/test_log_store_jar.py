"""The wheel ships js-etl's Delta log store compiled (no JDK or Maven needed where it runs): the
jar must be what its Java source builds."""

from __future__ import annotations

from js_etl.spark.jars import LOG_STORE_JAR, build_log_store


def test_the_shipped_log_store_jar_is_built_from_the_shipped_source(tmp_path):
    rebuilt = tmp_path / "js-etl-log-store.jar"
    build_log_store(rebuilt)  # javac --release 17 against Delta's storage jar
    assert rebuilt.read_bytes() == LOG_STORE_JAR.read_bytes(), (
        "the log store's source changed: rebuild its jar with "
        "`JS_ETL_JARS_DIR=.jars/delta python -m js_etl.spark.jars --build-log-store`")
