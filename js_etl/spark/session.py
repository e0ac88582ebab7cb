"""Starting Spark for js-etl: the one place a SparkSession is configured and started.

Library code configures a builder and returns it (:func:`configure_delta`,
:func:`local_builder`); it never starts a session as a side effect (the Delta Python API's own
habit). The entry points that do need a session — the CLI and spark-submit jobs
(:func:`job_session`), the demo, the bench and the tests (:func:`local_session`) — start it here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from js_etl.config.values import Invalid, connect_address
from js_etl.errors import ConfigError, TerminalError, TransientError
from js_etl.spark.jars import LOG_STORE_CLASS, SparkArtifacts, delta_artifacts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from js_etl.config import SparkConfig


DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Spark's commits to S3 with a conditional PUT, safe beside any other writer (jars.py).
    "spark.delta.logStore.s3a.impl": LOG_STORE_CLASS,
    "spark.delta.logStore.s3.impl": LOG_STORE_CLASS,
}


def configure_delta(builder: SparkSession.Builder, artifacts: SparkArtifacts | None,
                    conf: Mapping[str, str] | None = None) -> SparkSession.Builder:
    """Add Delta to a session builder: its ``artifacts`` (jars, or packages Spark resolves;
    :func:`~js_etl.spark.jars.delta_artifacts`) after any the session's ``conf`` names, the
    extension and the catalog.

    ``artifacts=None`` leaves ``spark.jars`` alone: under spark-submit it holds the ``--jars``
    list, and setting it to ``""`` here wiped it, so executors on a cluster got no Delta
    classes (tests/cluster/test_spark_submit_jars.py).
    """
    for key, value in {**(artifacts.conf(conf) if artifacts else {}), **DELTA_CONF}.items():
        builder = builder.config(key, value)
    return builder


# Where a JVM option may come from besides spark.driver.extraJavaOptions: the JVM refuses to
# start with two garbage collectors chosen ("Multiple garbage collectors selected", Java 17).
_JVM_OPTION_SOURCES = ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
                       "JDK_JAVA_OPTIONS")
_CHOOSES_GC = re.compile(r"-XX:[+]Use\w*GC\b")
_CHOOSES_JIT = re.compile(r"-XX:[+-]?Tiered")


def local_jvm_options(*, columnar: bool, conf: Mapping[str, str] | None = None,
                      environ: Mapping[str, str] | None = None) -> str:
    """The driver JVM's options for local Spark (the JVM that also runs the executor).

    * ``-XX:+UseSerialGC``: with Java 17's default G1 the JVM kept committing heap towards its
      maximum while the heap in use stayed flat, so a drain's memory grew with its backlog; with
      the serial collector it grew far less, and no drain was slower.
    * ``-XX:TieredStopAtLevel=1`` (C1 only) when the drain will use the columnar writer
      (:func:`js_etl.drain.writers.columnar_plan.expects_columnar`): the JVM then only
      coordinates, and its compiler threads took most of its CPU. Not for Spark's writer: its
      rows run through the JVM, which is slower without C2's code.

    The measurements: docs/design/local-spark.md.

    Neither is added where the environment (``environ``, default os.environ) or the session's
    ``spark.driver.defaultJavaOptions`` (in ``conf``) already picks a collector or a compiler
    level: two collectors stop the JVM from starting. A ``spark.driver.extraJavaOptions`` in
    ``conf`` replaces these options altogether. Under spark-submit the JVM is started before
    js-etl runs: these are local Spark's only."""
    environ = os.environ if environ is None else environ
    elsewhere = " ".join([*(environ.get(name, "") for name in _JVM_OPTION_SOURCES),
                          (conf or {}).get("spark.driver.defaultJavaOptions", "")])
    options = ["-Duser.timezone=UTC"]
    if not _CHOOSES_GC.search(elsewhere):
        options.append("-XX:+UseSerialGC")
    if columnar and not _CHOOSES_JIT.search(elsewhere):
        options.append("-XX:TieredStopAtLevel=1")
    return " ".join(options)


def local_builder(master: str = "local[2]", app_name: str = "js-etl",
                  conf: Mapping[str, str] | None = None, *, columnar: bool = False,
                  object_store: bool = False) -> SparkSession.Builder:
    """A builder for js-etl on local Spark: Delta (S3A too for ``object_store`` tables), UTC, no
    UI, workers on this interpreter forked from :mod:`js_etl.drain.worker_daemon`, the JVM
    options of :func:`local_jvm_options` (``columnar``: for a drain on the columnar writer)."""
    session_class = pyspark_session()

    # Workers must run this venv's Python, or they import a different (or no) js_etl.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (session_class.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               # Delta rebuilds table state with 50 tasks by default: seconds wasted on 2 cores.
               .config("spark.databricks.delta.snapshotPartitions", "2")
               .config("spark.driver.extraJavaOptions",
                       local_jvm_options(columnar=columnar, conf=conf))
               .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
               # Fresh Python workers start with the fetch tasks' modules imported.
               .config("spark.python.daemon.module", "js_etl.drain.worker_daemon"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return configure_delta(builder, delta_artifacts(object_store=object_store, conf=conf), conf)


def local_session(master: str = "local[2]", app_name: str = "js-etl",
                  conf: Mapping[str, str] | None = None, *, log_level: str | None = None,
                  columnar: bool = False, object_store: bool = False) -> SparkSession:
    """Start (or reuse) local Spark from :func:`local_builder`; ``log_level`` (e.g. ``"ERROR"``)
    quiets Spark's own logging for tools whose output is meant to be read (demo, bench, tests).

    >>> spark = local_session("local[2]", "my-notebook", log_level="ERROR")
    """
    spark = local_builder(master, app_name, conf, columnar=columnar,
                          object_store=object_store).getOrCreate()
    _delta_python(spark)
    if log_level is not None:
        spark.sparkContext.setLogLevel(log_level)
    return spark


def job_session(spark_config: SparkConfig, *, spark_submit: bool, columnar: bool = False,
                object_store: bool = False) -> SparkSession:
    """The session of a ``js-etl drain|backfill`` run: a Spark Connect client where
    ``SPARK_REMOTE`` or ``spark.remote`` names a server (:func:`connect_session`; the variable
    wins), local Spark from the config's
    ``spark.*`` section (``columnar``: for a drain on the columnar writer; ``object_store``:
    tables on S3), or, under spark-submit, the session spark-submit prepared."""
    session_class = pyspark_session()
    remote = spark_config.remote_in(os.environ)
    if remote:
        return connect_session(remote, spark_config)
    if not spark_submit:
        return local_session(spark_config.master, spark_config.app_name, spark_config.conf,
                             columnar=columnar, object_store=object_store)
    builder = session_class.builder.appName(spark_config.app_name)
    for key, value in spark_config.conf.items():
        builder = builder.config(key, value)
    # Under spark-submit the JVM is already running: Delta must come with its --packages or
    # --jars (docs/running.md); configure_delta only adds the extension and catalog settings.
    spark = configure_delta(builder, None).getOrCreate()
    _require_delta(spark)
    _delta_python(spark)
    return spark


def connect_session(url: str, spark_config: SparkConfig) -> SparkSession:
    """A Spark Connect client of the server at ``url`` (``sc://host:port``, as ``SPARK_REMOTE``
    names it). The server brings Spark, Delta (its jars, extension and catalog) and js-etl's
    Python packages for its workers; of the config's ``spark.conf`` only the ``spark.sql.*``
    settings apply, to this client's session (the rest are the server's)."""
    _answers(url)
    spark = pyspark_session().builder.remote(url).getOrCreate()
    for key, value in spark_config.conf.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    return spark


def _answers(url: str) -> None:
    """Fail in seconds, in one line, where no Spark Connect server can answer at ``url``:
    pyspark's client retries a refused connection for minutes before it says so."""
    try:
        address = connect_address(url)
    except Invalid as e:
        raise ConfigError(f"SPARK_REMOTE or spark.remote: {e.detail}") from None
    try:
        socket.create_connection(address, timeout=10).close()
    except OSError as e:  # down, restarting, or the wrong address: a later run may find it
        raise TransientError(f"no Spark Connect server answers at {address[0]}:{address[1]} "
                             f"({e.strerror or e}): start it, or correct SPARK_REMOTE or "
                             "spark.remote") from None


# The Spark line Delta's jars (js_etl.spark.jars.DELTA_ARTIFACT) are built for.
SPARK_LINE = "4.2"


def pyspark_session() -> Any:
    """pyspark's ``SparkSession`` class, once pyspark is known to be there and of the Spark line
    Delta's jars serve: a mismatch fails here in one line, not in the JVM's class loading."""
    try:
        import pyspark
        from pyspark.sql import SparkSession
    except ImportError:
        raise TerminalError("pyspark is not installed: pip install 'js-etl[spark]' for Spark on "
                            "this machine, or run the job where Spark 4.2 is "
                            "(spark-submit)") from None
    if not pyspark.__version__.startswith(SPARK_LINE + "."):
        raise TerminalError(f"js-etl runs on Spark {SPARK_LINE}.x (pyspark>={SPARK_LINE}.0,"
                            f"<4.3), the line of its Delta jars; this is pyspark "
                            f"{pyspark.__version__}")
    return SparkSession


def _delta_python(spark: SparkSession) -> None:
    """Make Delta's Python API (``import delta``) importable: Spark puts the jar of
    ``--packages`` on the path, and pip's ``delta-spark`` provides it; else it is read from
    Delta's jar in ``spark.jars``, which carries it (a platform's pyspark beside js-etl[job])."""
    if importlib.util.find_spec("delta") is not None:
        return
    for jar in (spark.conf.get("spark.jars", "") or "").split(","):
        path = jar.removeprefix("file:")
        if Path(path).name.startswith("delta-spark_") and Path(path).is_file():
            sys.path.append(path)
            return


def _require_delta(spark: SparkSession) -> None:
    from py4j.protocol import Py4JError

    try:  # the class Delta's Python API wraps; the JVM lacks it without Delta's jars
        spark_jvm(spark).java.lang.Class.forName("io.delta.tables.DeltaTable", False,
                                                 spark_jvm(spark).Thread.currentThread()
                                                 .getContextClassLoader())
    except Py4JError:
        raise TerminalError("Delta classes are not on the driver's classpath: give spark-submit "
                            "Delta, e.g. spark-submit $(js-etl spark-args) — see "
                            "docs/running.md 'Running a drain'") from None


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client (``SparkSession.builder.remote``,
    ``SPARK_REMOTE``): it has no SparkContext, RDDs or py4j view of the JVM."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def core_setting(spark: SparkSession, key: str, default: str) -> str:
    """A Spark core setting (``spark.speculation``) as the driver's SparkContext holds it, the
    one its scheduler reads: through py4j on a classic session (three calls rather than a copy
    of the whole conf); over Spark Connect, the server's session conf, which starts as a copy of
    its SparkContext's."""
    if is_connect(spark):
        return str(spark.conf.get(key, default))
    return str(spark.sparkContext._jsc.sc().conf().get(key, default))


def driver_property(spark: SparkSession, name: str) -> str:
    """A Java system property of the Spark driver's JVM (the server's, over Spark Connect)."""
    if is_connect(spark):
        # A literal: reflect takes no parameter marker (UNBOUND_SQL_PARAMETER, pyspark 4.2.0).
        literal = "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"
        row = spark.sql(f"SELECT reflect('java.lang.System', 'getProperty', {literal})").first()
        return str(row[0]) if row is not None else ""
    return str(java_class(spark, "java.lang.System").getProperty(name))


def spark_jvm(spark: SparkSession) -> Any:
    """The driver's py4j view of the JVM: Delta's and Hadoop's Java API where PySpark has none
    (DeltaLog snapshots, Hadoop FileSystem reads). Classic Spark only; Spark Connect has none."""
    view = spark._jvm
    if view is None:
        raise TerminalError("this SparkSession has no JVM (Spark Connect?): js-etl needs a "
                            "classic Spark driver")
    return view


def java_class(spark: SparkSession, name: str) -> Any:
    """The JVM's class ``name`` (fully qualified) for py4j calls. Spelled as attributes
    (``jvm.org.apache.hadoop.fs.Path``) py4j asks the JVM about every dot: five calls before
    the one that is wanted; a ``JavaClass`` asks nothing until it is called. A run makes many
    such calls (docs/design/driver-reads.md)."""
    from py4j.java_gateway import JavaClass

    return JavaClass(name, spark_jvm(spark)._gateway_client)


def hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """``path`` as a Hadoop ``Path`` and the ``FileSystem`` that serves it, so the driver reads
    and writes any store Spark can (file:, hdfs://, s3a://, abfss://) without a Spark job."""
    hpath = java_class(spark, "org.apache.hadoop.fs.Path")(path)
    return hpath, hpath.getFileSystem(spark._jsc.hadoopConfiguration())


def hadoop_read_text(spark: SparkSession, path: str) -> str:
    """A small UTF-8 file, read whole on the driver through :func:`hadoop_path` (no Spark job).
    Raises Py4JJavaError (FileNotFoundException) where it is missing."""
    hpath, fs = hadoop_path(spark, path)
    stream = fs.open(hpath)
    try:
        return str(java_class(spark, "org.apache.commons.io.IOUtils").toString(stream, "UTF-8"))
    finally:
        stream.close()


def configure_s3a(spark: SparkSession, environ: Mapping[str, str] | None = None) -> None:
    """Point Spark's S3A connector (Hadoop's, for ``s3a://`` and ``s3://`` paths) at the store
    the ``AWS_*`` variables name, the ones deltalake and obstore read (js_etl.delta.store): one
    configuration for every writer. Set on the running session's Hadoop configuration, at the
    start of each run, so the variables of the run's process count; a variable that is not set
    leaves the session's own setting (``spark.hadoop.fs.s3a.*``) alone."""
    if is_connect(spark):
        return  # a Spark Connect server's Hadoop configuration is the server's, not the client's
    env = os.environ if environ is None else environ
    conf = spark._jsc.hadoopConfiguration()
    if conf.get("fs.s3.impl") is None:  # else the platform's own s3:// (EMRFS on EMR) stays
        conf.set("fs.s3.impl", "org.apache.hadoop.fs.s3a.S3AFileSystem")
        conf.set("fs.AbstractFileSystem.s3.impl", "org.apache.hadoop.fs.s3a.S3A")
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:  # a store of its own (not AWS's endpoints): its buckets are paths
        conf.set("fs.s3a.endpoint", endpoint)
        conf.set("fs.s3a.path.style.access", "true")
        conf.set("fs.s3a.connection.ssl.enabled", str(endpoint.startswith("https:")).lower())
    settings = {"fs.s3a.endpoint.region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
                "fs.s3a.access.key": env.get("AWS_ACCESS_KEY_ID"),
                "fs.s3a.secret.key": env.get("AWS_SECRET_ACCESS_KEY"),
                "fs.s3a.session.token": env.get("AWS_SESSION_TOKEN")}
    for key, value in settings.items():
        if value:
            conf.set(key, value)
    if settings["fs.s3a.session.token"]:
        conf.set("fs.s3a.aws.credentials.provider",
                 "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")


def lossy_s3_log_store(spark: SparkSession, location: str) -> str | None:
    """Why Spark's Delta commits to the S3 table at ``location`` could replace another
    writer's commit, or None. Delta's default log store for S3 (``S3SingleDriverLogStore``)
    checks that a version's log file is missing, then PUTs it without a condition: a commit
    another process makes in between is overwritten, and lost."""
    scheme = location.split(":", 1)[0].lower()
    store = (spark.conf.get(f"spark.delta.logStore.{scheme}.impl", None)
             or spark.conf.get("spark.delta.logStore.class", None))
    if store and not store.endswith("S3SingleDriverLogStore"):
        return None
    return (f"Spark's Delta writer would commit to {location} through "
            f"{store or 'its default S3SingleDriverLogStore'}, which can overwrite another "
            f"writer's commit: set spark.delta.logStore.{scheme}.impl={LOG_STORE_CLASS} (a "
            "session js-etl configures has it), or a log store safe for several writers")
