"""Run the js-etl job under spark-submit from Airflow, and return its run report as XCom.

The operator is a thin, stateless wrapper: every retry is simply another resumable run of the
job (the durable consumer holds the position, the Delta log holds what was committed), so the
operator keeps nothing between attempts.

How the pieces meet:

* NATS: the ``nats`` connection, read by :class:`~js_etl.airflow.hooks.JetStreamHook` only, is
  handed to the job as environment variables of the spark-submit process (secrets as values of
  variables the config names) — never as ``--conf`` or ``--set`` on the command line.
* Spark: the provider's ``SparkSubmitHook`` (``spark_conn_id``; its master, or ``master=``);
  or, where ``SPARK_REMOTE`` or the config's ``spark.remote`` names a Spark Connect server, no
  spark-submit: the job runs on this worker as that server's client, a Python process without
  a JVM (:class:`_ConnectClientJob`).
* Result: the job writes its run report to ``--report-file``; the operator returns it
  (XCom ``return_value``). A failed job fails the task with the job's own one-line reason (the
  last ``js-etl: ...`` line of its output); exit code 2 (fix something first) fails without
  retries, anything else (75 transient, 73 refused, 1 unexpected) is retried as configured.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, get_args

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import Asset, AssetAlias, BaseOperator, BaseOperatorLink
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
)

import js_etl.jobs
from js_etl.airflow.assets import target_asset, task_alias
from js_etl.airflow.hooks import JetStreamHook
from js_etl.airflow.job_config import load_job_config, override_list
from js_etl.config import JobConfig
from js_etl.drain.preflight import check_drain, nothing_to_drain, skipped_report
from js_etl.errors import JsEtlError, TerminalError
from js_etl.report import summary_table
from js_etl.streaming.preflight import check_stream

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.types import TaskInstanceKey

T = TypeVar("T")
Job = Literal["drain", "backfill", "stream"]
# The packaged job scripts (js_etl/jobs/) of the installed js_etl, from a wheel or a checkout.
JOBS_DIR = Path(js_etl.jobs.__file__).resolve().parent
JOB_SCRIPTS: dict[str, str] = {"drain": "drain.py", "backfill": "backfill.py",
                               "stream": "stream.py"}
# What a job imports as a Spark Connect client beside js-etl's core: the client, and the job
# extra with which it reads and commits the tables (pyproject.toml).
CONNECT_CLIENT_MODULES = ("pyspark", "pyarrow", "pandas", "deltalake", "obstore")
# The job's config beside a driver in cluster deploy mode (shipped with --files).
CLUSTER_CONFIG_NAME = "js-etl-job.yaml"
EXIT_MEANINGS = {
    2: "terminal: fix something first, not retried",
    73: "refused: another run holds the consumer",
    75: "transient: a retry may succeed",
    1: "unexpected",
}
_REASON_PREFIX = "js-etl: "
_REPORT_PREFIX = '{"job":'
SPARK_LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF", "TRACE")


class _JobOutput:
    """What the job's output says: its failure reason, the last line starting ``js-etl: ``, and
    its report, the last line starting ``{"job":``. Neither need be the very last line (py4j
    and Spark's shutdown hooks log at exit); under spark-submit the job's stderr is merged into
    its stdout."""

    def __init__(self) -> None:
        self.job_reason: str | None = None
        self.report_line: str | None = None

    def see(self, raw: object) -> None:
        line = str(raw).strip()
        if line.startswith(_REASON_PREFIX):
            self.job_reason = line
        elif line.startswith(_REPORT_PREFIX):
            self.report_line = line


class _JobSubmitHook(SparkSubmitHook):
    """``SparkSubmitHook`` plus three things the job needs (written against provider 6.3):

    * ``process_env`` goes to the spark-submit *process* only. The provider turns ``env_vars``
      into ``--conf spark.yarn.appMasterEnv.X=value`` on YARN/Kubernetes, which would put
      secrets on a command line; these never take that path.
    * the output is watched for the job's reason line and report line while the provider logs it.
    * ``master`` overrides the Spark connection's master (e.g. ``local[2]`` for tests).
    """

    def __init__(self, *, process_env: Mapping[str, str], master: str | None = None,
                 **kwargs: Any) -> None:
        self._process_env = dict(process_env)
        self._master_override = master
        self.output = _JobOutput()
        super().__init__(**kwargs)

    @property
    def master(self) -> str:
        return str(self._connection["master"])

    @property
    def deploy_mode(self) -> str:
        return str(self._connection.get("deploy_mode") or "client")

    def ship(self, files: Sequence[str]) -> None:
        """Add ``files`` (``path#name``) to ``--files``."""
        self._files = ",".join([*filter(None, [self._files]), *files])

    @property
    def returncode(self) -> int | None:
        return self._submit_sp.returncode if self._submit_sp is not None else None

    def _resolve_connection(self) -> dict[str, Any]:
        data = super()._resolve_connection()
        if self._master_override:
            data["master"] = self._master_override
        return data

    def _build_spark_common_args(self) -> list[str]:
        args = super()._build_spark_common_args()
        # The provider sets self._env from env_vars (for Popen); ours go underneath them.
        self._env = {**self._process_env, **(self._env or {})}
        return args

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        super()._process_spark_submit_log(self._watch(itr))

    def _watch(self, itr: Iterator[Any]) -> Iterator[Any]:
        for raw in itr:
            self.output.see(raw)
            yield raw


class _ConnectClientJob:
    """The job script run by this worker's Python as a Spark Connect client (the job's session
    is a client where ``SPARK_REMOTE`` or ``spark.remote`` names a server,
    :func:`js_etl.spark.session.job_session`): no spark-submit and no JVM here, the Spark work
    on the server. Its output goes to the task log line by line, watched as spark-submit's is."""

    def __init__(self, application: str, env: Mapping[str, str]) -> None:
        self.application = application
        self.env = dict(env)
        self.output = _JobOutput()
        self._process: subprocess.Popen[str] | None = None

    def run(self, args: Sequence[str], log: Any) -> int:
        """Run the job to its end; its exit code.

        Interrupted here (the task's ``execution_timeout``, a signal), it stops the job as
        :meth:`on_kill` does and follows it to its end before it lets the exception go: Airflow
        calls ``on_kill`` only once the exception has left ``execute`` (for a timeout), and a
        job nobody reads from would block on its full output pipe."""
        process = subprocess.Popen([sys.executable, self.application, *args], env=self.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   bufsize=1)
        self._process = process
        try:
            self._follow(process, log)
        except BaseException:
            self.on_kill()
            self._follow(process, log)
            raise
        finally:
            process.wait()
        return process.returncode

    def _follow(self, process: subprocess.Popen[str], log: Any) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.output.see(line)
            log.info("%s", line.rstrip("\n"))

    def on_kill(self) -> None:
        # SIGTERM: the job finishes its round, releases the consumer and exits 75.
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)


def default_spark_binary() -> str:
    """The ``spark-submit`` next to the running interpreter (pyspark's, in the venv), else the
    one on PATH."""
    beside = Path(sys.executable).with_name("spark-submit")
    return str(beside) if beside.exists() else "spark-submit"


def _pyspark_home() -> str | None:
    """The Spark home of the ``spark-submit`` beside the running interpreter (pyspark's folder),
    found without importing pyspark; None where that is not pyspark's."""
    spec = importlib.util.find_spec("pyspark")
    if not (spec and spec.origin and Path(sys.executable).with_name("spark-submit").exists()):
        return None
    home = Path(spec.origin).parent
    return str(home) if (home / "bin" / "spark-class").exists() else None


class RunReportLink(BaseOperatorLink):
    """"Run report" on the task instance: its XCom tab, where the report (``return_value``)
    is shown in full. Airflow 3.3 gives a task no way to set its own note; a link it has."""

    name = "Run report"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        from urllib.parse import quote

        from airflow.providers.common.compat.sdk import conf

        base = conf.get("api", "base_url", fallback="").rstrip("/")
        path = (f"/dags/{quote(ti_key.dag_id, safe='')}/runs/{quote(ti_key.run_id, safe='')}"
                f"/tasks/{quote(ti_key.task_id, safe='')}")
        if ti_key.map_index >= 0:
            path += f"/mapped/{ti_key.map_index}"
        return f"{base}{path}/xcom"


class JetStreamToDeltaOperator(BaseOperator):
    """Drain a JetStream durable consumer into a Delta table with spark-submit, or as a Spark
    Connect client where ``SPARK_REMOTE`` (the worker's environment or ``env_vars``) or the
    config's ``spark.remote`` names a server: then the job runs on this worker without
    spark-submit or a JVM, and ``master``, ``conf``, ``jars``, ``spark_binary`` and
    ``spark_submit_kwargs`` do not apply (Spark's settings are the server's).

    :param config_path: the job's YAML config (absolute path; templated).
    :param overrides: config overrides passed as ``--set key=value``: a dict
        (``{"run.max_messages": 10000}``) or a list of ``"key=value"`` (templated).
    :param job: ``"drain"`` (:mod:`js_etl.jobs.drain`), ``"backfill"``
        (:mod:`js_etl.jobs.backfill`) or ``"stream"`` (:mod:`js_etl.jobs.stream`: an
        AvailableNow Structured Streaming query from the checkpoint ``streaming.checkpoint``).
    :param job_args: more arguments for the job script, e.g. ``["--from-seq", "1000"]`` for a
        backfill (templated; an XComArg works too).
    :param nats_conn_id: the ``nats`` connection; it owns the config's whole ``nats`` section.
    :param spark_conn_id: the provider's Spark connection (its host is the master). When it
        does not exist the provider falls back to master ``yarn``: for local runs define
        ``AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type":"spark","host":"local[2]"}'`` or pass ``master``.
    :param master: overrides the Spark connection's master, e.g. ``"local[2]"``.
    :param conf: extra Spark conf (``--conf``; templated).
    :param jars: jars for ``--jars`` (list or comma-separated), in place of Delta's default:
        ``--packages`` that spark-submit resolves from Maven Central, or the jars of
        ``JS_ETL_JARS_DIR`` (:func:`js_etl.spark.jars.delta_artifacts`); ``""`` for none.
    :param spark_binary: default: the ``spark-submit`` next to the running Python (pyspark's),
        else ``spark-submit`` on PATH. With a ``local`` master, ``PYSPARK_PYTHON`` defaults to
        the running Python so the job imports the same js_etl.
    :param env_vars: more environment for spark-submit (templated); wins over the connection's.
    :param application: the job script; default from ``job``, the packaged
        ``js_etl/jobs/<job>.py`` of the installed js-etl.
    :param spark_submit_kwargs: anything else for ``SparkSubmitHook`` (``driver_memory``,
        ``executor_memory``, ``py_files``, ``deploy_mode`` …). ``deploy_mode="cluster"`` needs
        ``report_dir``.

    The Delta table is the task's outlet. The config is read when the task runs, never when the
    DAG is parsed, so unless ``outlets`` is given the outlet is an ``AssetAlias`` named after the
    task, ``js_etl:<dag_id>.<task_id>`` (:func:`~js_etl.airflow.assets.task_alias`; an operator
    created outside a DAG and added to one later gets none: pass ``outlets=``). The table
    actually written is attached to every alias outlet at run time, with a summary of the run as
    the event's ``extra`` — only when the run wrote messages, unless
    ``emit_empty_asset_event=True``. A static ``Asset`` outlet gets an event on every success
    (Airflow records one per static outlet; the operator cannot skip it).

    :param spark_log_level: Spark's log level in the job (``spark.log.level``): default
        ``"WARN"``, so the task log shows the job's own lines, not Spark's INFO chatter;
        ``"INFO"`` or ``None`` (Spark's default) brings it back. ``conf={"spark.log.level": ...}``
        wins.
    :param openlineage_inject_parent_job_info: pass this task as the OpenLineage parent of the
        Spark job (``spark.openlineage.parent*`` conf), as ``SparkSubmitOperator`` does; default
        the ``[openlineage] spark_inject_parent_job_info`` option. Needs the OpenLineage
        provider (and, to take effect, the OpenLineage Spark listener in the job).
    :param openlineage_inject_transport_info: likewise the task's OpenLineage transport
        (``spark.openlineage.transport.*``; default ``[openlineage]
        spark_inject_transport_info``). Note that these go on spark-submit's command line like
        any ``--conf``: an API key in the transport would be visible there (it is masked in logs).
    :param emit_empty_asset_event: also emit the table's asset event when the run wrote no
        message (default ``False``: a downstream DAG scheduled on the table does not run for
        nothing).
    :param skip_when_empty: before spark-submit, a drain's task checks in seconds what the job
        would check after its JVM started — the target paths, the connection and its
        credentials, the stream, the consumer, that no other run holds it
        (:mod:`js_etl.drain.preflight`) — and, when the consumer has nothing pending and nothing
        ack-pending, returns a report with ``stopped_because: "nothing_pending"`` instead of
        submitting (default ``True``; ``False`` submits anyway).

    Example::

        drain = JetStreamToDeltaOperator(
            task_id="drain_orders",
            config_path="/opt/etl/conf/orders.yaml",
            overrides={"run.max_seconds": "20m"},
            nats_conn_id="nats_orders",
            retries=3,
        )
        # drain.output -> {"messages_written": 1200, "delta_versions": [7], ...}
    """

    template_fields: Sequence[str] = ("config_path", "overrides", "job_args", "env_vars", "conf",
                                      "master", "application", "jars", "nats_conn_id",
                                      "spark_conn_id", "report_dir")
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "overrides": "json", "job_args": "json", "env_vars": "json", "conf": "json"}
    ui_color = "#c9e4f6"
    operator_extra_links = (RunReportLink(),)

    def __init__(
        self,
        *,
        config_path: str | os.PathLike[str],
        overrides: Mapping[str, Any] | Sequence[str] | None = None,
        job: Job = "drain",
        job_args: Sequence[str] | None = None,
        nats_conn_id: str = JetStreamHook.default_conn_name,
        spark_conn_id: str = "spark_default",
        master: str | None = None,
        conf: Mapping[str, Any] | None = None,
        jars: str | Sequence[str] | None = None,
        spark_binary: str | None = None,
        env_vars: Mapping[str, str] | None = None,
        application: str | None = None,
        spark_submit_kwargs: Mapping[str, Any] | None = None,
        emit_empty_asset_event: bool = False,
        openlineage_inject_parent_job_info: bool | None = None,
        openlineage_inject_transport_info: bool | None = None,
        spark_log_level: str | None = "WARN",
        skip_when_empty: bool = True,
        report_dir: str | None = None,
        report_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if job not in JOB_SCRIPTS:
            raise ValueError(f"job must be one of {', '.join(map(repr, get_args(Job)))}, "
                             f"got {job!r}")
        default_outlet = "outlets" not in kwargs  # default_args may hold outlets too
        super().__init__(**kwargs)
        if default_outlet and self.has_dag():
            # Named after the task, not the table: the table is only known once the config is
            # read, at run time, when it is attached to this alias.
            self.add_outlets([task_alias(self.dag_id, self.task_id)])
        self.config_path = os.fspath(config_path)
        self.overrides = overrides
        self.job = job
        self.job_args = job_args
        self.nats_conn_id = nats_conn_id
        self.spark_conn_id = spark_conn_id
        self.master = master
        self.conf = conf
        self.jars = jars
        self.spark_binary = spark_binary
        self.env_vars = env_vars
        self.application = application
        self.spark_submit_kwargs = dict(spark_submit_kwargs or {})
        self.emit_empty_asset_event = bool(emit_empty_asset_event)
        # Defaults as SparkSubmitOperator's: the [openlineage] spark_inject_* options.
        self.openlineage_inject_parent_job_info = _lineage_option(
            openlineage_inject_parent_job_info, "spark_inject_parent_job_info")
        self.openlineage_inject_transport_info = _lineage_option(
            openlineage_inject_transport_info, "spark_inject_transport_info")
        if spark_log_level is not None and spark_log_level.upper() not in SPARK_LOG_LEVELS:
            raise ValueError(f"spark_log_level must be one of {', '.join(SPARK_LOG_LEVELS)} "
                             f"or None (Spark's own logging), got {spark_log_level!r}")
        self.spark_log_level = spark_log_level
        self.skip_when_empty = bool(skip_when_empty)
        self.report_dir = report_dir
        self.report_conn_id = report_conn_id
        self._running: _JobSubmitHook | _ConnectClientJob | None = None  # for on_kill
        self._config: JobConfig | None = None  # the run's config, loaded by execute
        self._report: dict[str, Any] | None = None

    # -- execute --------------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        overrides = override_list(self.overrides)
        user_env = {str(k): str(v) for k, v in (self.env_vars or {}).items()}
        try:
            job_env = JetStreamHook(self.nats_conn_id).job_environment()
        except JsEtlError as e:  # no retry can fix the connection (missing ones included)
            raise AirflowFailException(str(e)) from None
        config_path = os.path.abspath(self.config_path)
        # The job would refuse a bad config too, but only after Spark started: check it here
        # with exactly the environment the job will see. The one read of the task: asset events
        # and lineage use this same config.
        environ = {**os.environ, **job_env, **user_env}
        config = load_job_config(config_path, overrides, environ)
        self._config = config
        if self.job == "stream":
            self._checked(check_stream, config, environ)
        if self.job == "drain" and self._nothing_to_drain(config, environ):
            report = skipped_report(config).as_dict()
            self.log.info("js-etl drain not submitted: consumer %s of stream %s has nothing "
                          "pending and nothing ack-pending (skip_when_empty=False submits "
                          "anyway)", config.source.consumer, config.source.stream)
            self._record_asset_events(context, config, report)
            self._report = report
            return report
        application = self._application()
        with tempfile.TemporaryDirectory(prefix="js-etl-") as local:
            if config.spark.remote_in(environ):
                report = self._run_connect_client(application, environ, config_path, overrides,
                                                  Path(local))
            else:
                ti = context["ti"]
                hook = self._submit_hook(job_env, user_env,
                                         name=f"js-etl-{self.job}-{ti.dag_id}.{ti.task_id}",
                                         conf=self._spark_conf(context), config=config)
                report = self._run(hook, application, config_path, overrides, Path(local))
        self.log.info("js-etl %s into %s:\n%s", self.job, report.get("target"),
                      summary_table(report))
        self._record_asset_events(context, config, report)
        self._report = report
        return report

    def _nothing_to_drain(self, config: JobConfig, environ: Mapping[str, str]) -> bool:
        """The drain's checks before Spark starts (:mod:`js_etl.drain.preflight`), here, with the
        environment the job would see: a failure fails the task as the job's would (a terminal
        one without retries), only sooner; True when the consumer has nothing to drain and
        ``skip_when_empty``."""
        _, info = self._checked(check_drain, config, environ)
        return self.skip_when_empty and nothing_to_drain(info)

    @staticmethod
    def _checked(check: Callable[[JobConfig, Mapping[str, str]], T], config: JobConfig,
                 environ: Mapping[str, str]) -> T:
        """``check(config, environ)``; its failure fails the task as the job's would: a
        terminal one without retries."""
        try:
            return check(config, environ)
        except JsEtlError as e:
            reason = f"js-etl: {type(e).__name__}: {e}"
            if isinstance(e, TerminalError):
                raise AirflowFailException(reason) from None
            raise AirflowException(reason) from None

    def _job_arguments(self, config_path: str, overrides: Sequence[str],
                       report_file: str) -> list[str]:
        """``--config FILE [--set K=V ...] --report-file PATH`` then ``job_args`` (e.g. a
        backfill's ``--from-seq N``). Secrets are never among them: the config refuses them."""
        args = ["--config", config_path]
        for item in overrides:
            args += ["--set", item]
        return [*args, "--report-file", report_file, *(str(a) for a in self.job_args or [])]

    def _spark_conf(self, context: Context) -> dict[str, Any]:
        """``conf`` plus the OpenLineage parent job and transport properties when asked for,
        computed by the OpenLineage provider exactly as for SparkSubmitOperator (the Spark
        job's OpenLineage listener, if it has one, then links its run to this task)."""
        conf = dict(self.conf or {})
        if self.spark_log_level is not None:
            # Spark's own knob (SparkContext.setLogLevel at start-up): without it a task log is
            # mostly Spark's INFO lines. A `spark.log.level` in `conf` wins.
            conf.setdefault("spark.log.level", self.spark_log_level.upper())
        if not (self.openlineage_inject_parent_job_info
                or self.openlineage_inject_transport_info):
            return conf
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_parent_job_information_into_spark_properties,
            inject_transport_information_into_spark_properties,
        )

        if self.openlineage_inject_parent_job_info:
            conf = inject_parent_job_information_into_spark_properties(conf, context)
        if self.openlineage_inject_transport_info:
            conf = inject_transport_information_into_spark_properties(conf, context)
            from airflow.sdk.log import mask_secret

            for key, value in conf.items():
                # they go on spark-submit's command line (--conf), as with SparkSubmitOperator
                if key.endswith(".auth.apiKey") or ".headers." in key:
                    mask_secret(str(value))
        return conf

    # -- OpenLineage (called by the OpenLineage provider's listener when it is installed) -------
    # Only on completion (and on failure, which falls back to this): the datasets are in the
    # config, which execute reads. No get_openlineage_facets_on_start: the listener asks for it
    # before execute, in a forked process, where it could only read the config a second time.
    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        from js_etl.airflow.lineage import OperatorLineage, operator_lineage

        if self._config is None:
            # The task failed before execute loaded the config (a bad connection, a bad config):
            # no datasets, rather than a read of a config this run never used (and no None,
            # which OpenLineage logs a warning about).
            return OperatorLineage()
        return operator_lineage(self._config, self._config.nats.servers, self._report)

    def _run(self, hook: _JobSubmitHook, application: str, config_path: str,
             overrides: Sequence[str], local: Path) -> dict[str, Any]:
        """spark-submit the job and read its report. In client deploy mode the driver runs
        here: the report is a file in ``local``, the connection is in the process's
        environment. In cluster mode the driver runs on the cluster, which has neither: the
        connection and the config travel as ``--set`` items and ``--files`` (the secrets in
        files, :meth:`JetStreamHook.cluster_handoff`), the report as a file in ``report_dir``."""
        cluster = hook.deploy_mode == "cluster"
        if cluster:
            if not self.report_dir:
                raise AirflowFailException(
                    "cluster deploy mode needs report_dir: a folder this worker and the "
                    "cluster's driver both reach (s3://…, hdfs://…, or file:// on a shared "
                    "mount), where the job leaves its run report for this task")
            report_at = f"{self.report_dir.rstrip('/')}/js-etl-report-{uuid.uuid4().hex}.json"
            handoff = JetStreamHook(self.nats_conn_id).cluster_handoff(local)
            hook.ship([*handoff.files, f"{config_path}#{CLUSTER_CONFIG_NAME}"])
            args = self._job_arguments(CLUSTER_CONFIG_NAME, [*overrides, *handoff.overrides],
                                       report_at)
        else:
            report_at = str(local / "report.json")
            args = self._job_arguments(config_path, overrides, report_at)
        hook._application_args = args
        self._running = hook
        try:
            try:
                hook.submit(application)
            except AirflowException as e:
                # The provider's error repeats the command and the output already logged
                # above: the task's failure is the job's one line (or names that output).
                raise self._failure("spark-submit", hook.returncode, hook.output, e,
                                    _read_outcome(report_at, self.report_conn_id)) from None
            except BaseException:
                # A timeout or a signal: Airflow calls on_kill only after execute has raised
                # (for a timeout), when this hook is no longer the running one.
                hook.on_kill()
                raise
            return _read_report(_read_outcome(report_at, self.report_conn_id),
                                hook.output.report_line)
        finally:
            self._running = None
            if cluster:  # client mode's goes with ``local``
                _remove_outcome(report_at, self.report_conn_id)

    def _run_connect_client(self, application: str, environ: Mapping[str, str],
                            config_path: str, overrides: Sequence[str], local: Path
                            ) -> dict[str, Any]:
        """Run the job as a Spark Connect client on this worker (:class:`_ConnectClientJob`)
        with the environment the config was checked with, and read its report, a file in
        ``local``. Spark's settings are the server's: no spark-submit argument applies."""
        if self.spark_submit_kwargs.get("deploy_mode") == "cluster":
            raise AirflowFailException(
                "deploy_mode='cluster' with a Spark Connect server (SPARK_REMOTE or "
                "spark.remote): the job runs as that server's client on this worker, with "
                "nothing to deploy; remove one of the two")
        missing = [name for name in CONNECT_CLIENT_MODULES if not _importable(name)]
        if missing:
            raise AirflowFailException(
                "a Spark Connect server is named (SPARK_REMOTE or spark.remote), so the job runs "
                "on this worker as its client, which needs pyspark (or pyspark-client) and "
                f"js-etl's job extra here: {', '.join(missing)} cannot be imported; "
                "pip install 'js-etl[job]' on the worker")
        report_at = str(local / "report.json")
        job = _ConnectClientJob(application, environ)
        self._running = job
        try:
            code = job.run(self._job_arguments(config_path, overrides, report_at), self.log)
        finally:
            self._running = None
        if code:
            raise self._failure("the job", code, job.output, None, _read_outcome(report_at, None))
        return _read_report(_read_outcome(report_at, None), job.output.report_line)

    def _submit_hook(self, job_env: Mapping[str, str], user_env: Mapping[str, str], *,
                     name: str, conf: Mapping[str, Any] | None = None,
                     config: JobConfig | None = None) -> _JobSubmitHook:
        conf = dict(self.conf or {}) if conf is None else dict(conf)
        hook = _JobSubmitHook(
            process_env=job_env,
            master=self.master,
            conn_id=self.spark_conn_id,
            conf=conf,
            **self._delta(config, conf),
            name=name,
            env_vars=dict(user_env) or None,
            spark_binary=self.spark_binary or default_spark_binary(),
            **self.spark_submit_kwargs,
        )
        if hook.deploy_mode == "cluster":
            hook._process_env = {}  # nothing of the connection reaches that driver this way
        environ = {**os.environ, **user_env}
        home = None if self.spark_binary or "SPARK_HOME" in environ else _pyspark_home()
        if home:  # pyspark's spark-submit looks for its home with the `python3` of PATH otherwise
            hook._process_env["SPARK_HOME"] = home
        if hook.master.startswith("local") and "PYSPARK_PYTHON" not in environ:
            # Driver and workers run this interpreter, which has js_etl
            # (docs/reference/spark-airflow-facts.md §3, case E).
            hook._process_env["PYSPARK_PYTHON"] = sys.executable
        return hook

    def on_kill(self) -> None:
        if self._running is not None:
            self._running.on_kill()

    # -- helpers -------------------------------------------------------------------------------
    def _application(self) -> str:
        application = self.application or str(JOBS_DIR / JOB_SCRIPTS[self.job])
        if not Path(application).is_file():
            raise AirflowFailException(
                f"job script {application} not found: the {self.job!r} job is "
                f"{JOBS_DIR / JOB_SCRIPTS[self.job]} of the installed js-etl; leave application= "
                "unset, or pass a path that exists on this worker")
        return application

    def _delta(self, config: JobConfig | None, conf: dict[str, Any]) -> dict[str, Any]:
        """The hook's arguments that bring Delta: ``jars`` as given, else Spark resolves it
        (``--packages``; S3A too for tables on S3), its Ivy settings added to ``conf``."""
        if self.jars is not None:
            jars = self.jars if isinstance(self.jars, str) else ",".join(self.jars)
            return {"jars": jars or None}
        from js_etl.delta.rules import on_object_store
        from js_etl.spark.jars import delta_artifacts

        try:
            artifacts = delta_artifacts(
                object_store=config is not None and on_object_store(config.target),
                conf={str(k): str(v) for k, v in conf.items()})
        except JsEtlError as e:
            raise AirflowFailException(str(e)) from None
        # spark-submit's --jars and --packages would replace those of conf: one list each.
        merged = artifacts.conf({k: conf.pop(k) for k in ("spark.jars", "spark.jars.packages",
                                                          "spark.jars.excludes") if k in conf})
        if artifacts.ivy_settings:
            conf["spark.jars.ivySettings"] = artifacts.ivy_settings
        return {"jars": merged["spark.jars"], "packages": merged.get("spark.jars.packages"),
                "exclude_packages": merged.get("spark.jars.excludes")}

    def _failure(self, launcher: str, code: int | None, output: _JobOutput,
                 error: AirflowException | None, outcome: dict[str, Any] | None
                 ) -> AirflowException:
        reason = output.job_reason
        if reason is None and outcome is not None and "error" in outcome:
            # A driver on the cluster: its reason came back where its report would have.
            reason, code = str(outcome["error"]), int(outcome["exit_code"])
        if reason is None:
            return AirflowException(
                f"{launcher} exited with code {code} before the js-etl job gave a reason "
                "(see its output above)" + (f": {error}" if error else ""))
        meaning = EXIT_MEANINGS.get(code or 1, "unexpected")
        self.log.error("js-etl %s failed with exit code %s (%s)", self.job, code, meaning)
        if code == 2:
            return AirflowFailException(reason)
        return AirflowException(reason)

    def _record_asset_events(self, context: Context, config: JobConfig,
                             report: Mapping[str, Any]) -> None:
        written = target_asset(config.target)
        summary = {k: report[k] for k in ("run_id", "messages_written", "dead_letters",
                                          "delta_versions", "first_seq", "last_seq")
                   if k in report}
        emit = bool(report.get("messages_written")) or self.emit_empty_asset_event
        events = context["outlet_events"]
        for outlet in self.outlets:
            if isinstance(outlet, AssetAlias):
                if emit:
                    events[outlet].add(written, extra=summary)
                else:
                    self.log.info("no asset event for %s: the run wrote no message "
                                  "(emit_empty_asset_event=True emits one anyway)", written.uri)
            elif isinstance(outlet, Asset):
                # Airflow records an event for every static Asset outlet of a successful task;
                # only an AssetAlias outlet lets the task leave it out.
                events[outlet].extra.update(summary)
                if outlet.uri != written.uri:
                    self.log.warning("the job wrote %s but the task's outlet is %s", written.uri,
                                     outlet.uri)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a finder that refuses it
        return False


def _lineage_option(value: bool | None, option: str) -> bool:
    if value is not None:
        return bool(value)
    from airflow.providers.common.compat.sdk import conf

    return conf.getboolean("openlineage", option, fallback=False)


def _report_path(location: str, conn_id: str | None) -> Any:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(location if "://" in location else f"file://{location}",
                             conn_id=conn_id)


def _read_outcome(location: str, conn_id: str | None) -> dict[str, Any] | None:
    """What the job left at ``location`` (a path, or a URI Airflow's object storage reads with
    ``conn_id``): its run report, or its failure (``error``, ``exit_code``); None if nothing."""
    try:
        return dict(json.loads(_report_path(location, conn_id).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise AirflowException(f"cannot read the job's run report {location}: {e}") from e


def _remove_outcome(location: str, conn_id: str | None) -> None:
    with contextlib.suppress(Exception):
        _report_path(location, conn_id).unlink()


def _read_report(outcome: dict[str, Any] | None, report_line: str | None) -> dict[str, Any]:
    if outcome is not None and "error" not in outcome:
        return outcome
    if report_line:  # e.g. a driver that could not write the file: the line is the same
        return dict(json.loads(report_line))
    raise AirflowException("the job exited 0 but left no run report (neither the report file "
                           "nor a report line in its output); refusing to call that a success")
