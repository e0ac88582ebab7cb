"""What a session or spark-submit gets for Delta (js_etl.spark.jars.delta_artifacts)."""

from __future__ import annotations

from js_etl.spark.jars import (
    DELTA_ARTIFACT,
    IVY_SETTINGS,
    LOG_STORE_JAR,
    S3A_ARTIFACTS,
    delta_artifacts,
)


def test_without_a_jars_folder_spark_resolves_delta_and_s3a_only_for_object_stores(monkeypatch):
    monkeypatch.delenv("JS_ETL_JARS_DIR", raising=False)
    local = delta_artifacts()
    assert (local.jars, local.packages, local.excludes) == ((str(LOG_STORE_JAR),),
                                                            (DELTA_ARTIFACT,), ())
    assert local.submit_args() == ["--jars", str(LOG_STORE_JAR), "--packages", DELTA_ARTIFACT,
                                   "--conf", f"spark.jars.ivySettings={IVY_SETTINGS}"]
    s3 = delta_artifacts(object_store=True)
    assert s3.packages == (DELTA_ARTIFACT, *S3A_ARTIFACTS)
    assert s3.excludes == ("software.amazon.awssdk:bundle",)
    # A session's own Ivy settings win; its own jars and packages come first, ours after.
    own = delta_artifacts(conf={"spark.jars.ivySettings": "/etc/ivy.xml"})
    assert own.ivy_settings is None
    assert own.conf({"spark.jars.packages": "org.example:lib:1", "spark.jars": "/a.jar"}) == {
        "spark.jars": f"/a.jar,{LOG_STORE_JAR}",
        "spark.jars.packages": f"org.example:lib:1,{DELTA_ARTIFACT}"}


def test_a_jars_folder_replaces_the_resolution(monkeypatch, tmp_path):
    (tmp_path / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"")
    monkeypatch.setenv("JS_ETL_JARS_DIR", str(tmp_path))
    folder = delta_artifacts(object_store=True)
    assert folder.jars == (str(tmp_path / "delta-spark_4.2_2.13-4.4.0.jar"), str(LOG_STORE_JAR))
    assert (folder.packages, folder.ivy_settings) == ((), None)


def test_an_empty_jars_folder_is_a_terminal_error_naming_it(monkeypatch, tmp_path):
    import pytest

    from js_etl.errors import TerminalError

    monkeypatch.setenv("JS_ETL_JARS_DIR", str(tmp_path))
    with pytest.raises(TerminalError, match=f"no jars in {tmp_path} \\(JS_ETL_JARS_DIR\\)"):
        delta_artifacts()
