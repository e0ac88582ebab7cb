"""The ``js-etl`` command.

    js-etl drain  --config FILE [--set KEY=VALUE ...] [--report-file PATH]
    js-etl status --config FILE [--set KEY=VALUE ...]
    js-etl backfill --config FILE (--from-seq N | --from-time T) [--to-seq M | --to-time U]
                  [--set KEY=VALUE ...] [--report-file PATH]
    js-etl rewind --config FILE --to-seq N [--yes]
    js-etl demo   [--messages N] [--keep]
    js-etl spark-args [--s3]     (Delta for spark-submit: spark-submit $(js-etl spark-args) ...)

``js_etl/jobs/drain.py`` runs the same ``drain`` under ``spark-submit``. Exit codes: 0 success,
2 a terminal error (fix something first), 73 refused (another run holds the consumer), 75 a
transient error (retry later), 1 anything unexpected. The last stderr line of a failure is one
line saying why; the last stdout line of a success is the run report as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from js_etl.config import JobConfig, load_config
from js_etl.errors import JsEtlError, TransientError
from js_etl.report import RunReport, StopReason, TerminalProgress, progress_for

log = logging.getLogger("js_etl")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # A usage error ends like every other failure, with one "js-etl: ..." reason line (the
        # Airflow operator shows it, and exit 2 is not retried).
        self.print_usage(sys.stderr)
        self.exit(2, f"js-etl: UsageError: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="js-etl", description="Drain NATS JetStream durable consumers into Delta tables.",
        epilog="exit codes: 0 success, 2 fix something first, 73 another run holds the "
        "consumer, 75 try again later (NATS or an executor unavailable, SIGTERM/SIGINT), 1 "
        "anything unexpected")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="on a failure, print the whole traceback before the reason line")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", "-c",
                       help="job config YAML (optional: env JS_ETL__* and --set also configure)")
        p.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a config key (repeatable)")

    drain = commands.add_parser("drain", help="drain the consumer into the Delta table")
    with_config(drain)
    drain.add_argument("--report-file", help="also write the JSON run report (or the failure) "
                       "here: a path, or a URI Spark reaches (hdfs://, s3a://, file://)")

    stream = commands.add_parser(
        "stream", help="a Structured Streaming query (Trigger.AvailableNow) from the stream into "
        "the Delta table, from where its checkpoint (streaming.checkpoint) left off")
    with_config(stream)
    stream.add_argument("--report-file", help="also write the JSON run report (or the failure) "
                        "here: a path, or a URI Spark reaches")

    status = commands.add_parser("status", help="show stream and consumer state")
    with_config(status)

    backfill = commands.add_parser(
        "backfill", help="re-read a range of the stream into the Delta table (ephemeral "
        "consumers; the durable consumer is not touched; rows already there are skipped)")
    with_config(backfill)
    start = backfill.add_mutually_exclusive_group(required=True)
    start.add_argument("--from-seq", type=_sequence, metavar="N", help="first stream sequence")
    start.add_argument("--from-time", metavar="T",
                       help="first message stored at or after T (RFC 3339; no zone = UTC)")
    end = backfill.add_mutually_exclusive_group()
    end.add_argument("--to-seq", type=_sequence, metavar="M",
                     help="last stream sequence (default: the stream's last at start)")
    end.add_argument("--to-time", metavar="U", help="last message stored at or before U")
    backfill.add_argument("--report-file", help="also write the JSON run report (or the "
                          "failure) here: a path, or a URI Spark reaches")

    rewind = commands.add_parser(
        "rewind", help="move the durable consumer so its next delivery is --to-seq (asks first)")
    with_config(rewind)
    rewind.add_argument("--to-seq", type=_sequence, required=True, metavar="N",
                        help="stream sequence the consumer delivers next")
    rewind.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    demo = commands.add_parser("demo", help="local nats-server → sample events → Delta, end to end")
    demo.add_argument("--config")  # default: the demo config shipped in the package
    demo.add_argument("--messages", type=int, default=5000)
    demo.add_argument("--keep", action="store_true", help="keep .demo/ from earlier demo runs")
    spark_args = commands.add_parser(
        "spark-args", help="print spark-submit's options for Delta (--packages, or --jars of "
                           "JS_ETL_JARS_DIR)")
    spark_args.add_argument("--s3", action="store_true", help="with S3A, for s3:// tables")
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("js-etl")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "unknown"


def main(argv: Sequence[str] | None = None, *, spark_submit: bool = False) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    # Only our own progress at INFO: under spark-submit stderr is merged into stdout, and a
    # library logging at exit (py4j does) must not push the report off the last line.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    try:
        if args.command == "drain":
            return _drain(load_config(args.config, args.overrides), args.report_file,
                          spark_submit)
        if args.command == "stream":
            return _stream(load_config(args.config, args.overrides), args.report_file,
                           spark_submit)
        if args.command == "status":
            return _status(load_config(args.config, args.overrides))
        if args.command == "backfill":
            return _backfill(args, spark_submit)
        if args.command == "rewind":
            return _rewind(load_config(args.config, args.overrides), args.to_seq, args.yes)
        if args.command == "spark-args":
            from js_etl.spark.jars import delta_artifacts

            print(shlex.join(delta_artifacts(object_store=args.s3).submit_args()))
            return 0
        from js_etl.demo import demo_config, run_demo

        return run_demo(Path(args.config) if args.config else demo_config(),
                        messages=args.messages, keep=args.keep)
    except JsEtlError as e:
        _traceback_if(args.verbose)
        reason, exit_code = f"{type(e).__name__}: {e}", e.exit_code
    except Exception as e:  # a Spark failure wraps our error from the executors; unwrap it
        from js_etl.spark.failures import failure_reason

        _traceback_if(args.verbose)
        reason, exit_code = failure_reason(e)
    print(f"js-etl: {reason}", file=sys.stderr)
    if getattr(args, "report_file", None):
        # A driver in cluster deploy mode has no output the operator sees: the reason travels
        # where the report would have.
        with contextlib.suppress(Exception):
            _write_report(json.dumps({"error": f"js-etl: {reason}", "exit_code": exit_code}),
                          args.report_file)
    return exit_code


def _traceback_if(verbose: bool) -> None:
    """The whole traceback (a Java stack included) before the reason line, on --verbose."""
    if verbose:
        import traceback

        traceback.print_exc(file=sys.stderr)


def _drain(config: JobConfig, report_file: str | None, spark_submit: bool) -> int:
    from js_etl.delta.rules import on_object_store
    from js_etl.drain.preflight import check_drain
    from js_etl.drain.run import run_drain
    from js_etl.drain.writers.columnar_plan import expects_columnar
    from js_etl.spark.session import is_connect, job_session

    options, _ = check_drain(config)
    spark = job_session(config.spark, spark_submit=spark_submit,
                        columnar=expects_columnar(config),
                        object_store=on_object_store(config.target))
    # SIGTERM (Airflow stopping a task, a scheduler's timeout) and SIGINT (Ctrl-C) end the run
    # at the next round boundary: the round in progress is committed and acked, the rest
    # released, the lease freed. A second Ctrl-C stops at once (the next run's fence then
    # finishes what this one left). Set after the session starts: PySpark's own SIGINT handler
    # cancels the jobs and raises KeyboardInterrupt mid-round.
    terminated = threading.Event()
    received: list[str] = []

    def stop(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum).name)
        terminated.set()
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    progress = progress_for(sys.stderr)
    if isinstance(progress, TerminalProgress) and not is_connect(spark):
        # Spark's warnings would print over the progress line: only its errors while it shows.
        spark.sparkContext.setLogLevel("ERROR")
    report = run_drain(spark, config, options=options, stop=terminated, progress=progress)
    _emit(report, report_file)
    if report.stopped_because is StopReason.TERMINATED:
        print(f"js-etl: Terminated: {received[0]} received; stopped after round "
              f"{report.rounds}, everything committed is acked, the next run continues",
              file=sys.stderr)
        return TransientError.exit_code
    return 0


def _stream(config: JobConfig, report_file: str | None, spark_submit: bool) -> int:
    from js_etl.delta.rules import on_object_store
    from js_etl.spark.session import job_session
    from js_etl.streaming.preflight import check_stream
    from js_etl.streaming.run import run_stream

    check_stream(config)  # NATS only: a bad config or a missing stream fails before Spark starts
    spark = job_session(config.spark, spark_submit=spark_submit,
                        object_store=on_object_store(config.target))
    return _emit(run_stream(spark, config), report_file)


def _emit(report: RunReport, report_file: str | None) -> int:
    """The report as JSON: to ``--report-file`` and as the last stdout line."""
    text = report.to_json()
    if report_file:
        _write_report(text, report_file)
    print(text, flush=True)
    return 0


def _write_report(text: str, location: str) -> None:
    """``text`` into the file at ``location``: a local path, a ``file://`` URI, or a URI of a
    store Spark's Hadoop file systems reach (``hdfs://``, ``s3a://`` …) — where a driver in
    cluster deploy mode leaves its report for the operator."""
    if "://" not in location or location.startswith("file://"):
        Path(location.removeprefix("file://")).write_text(text + "\n")
        return
    from js_etl.spark.session import hadoop_path, pyspark_session

    path, fs = hadoop_path(pyspark_session().builder.getOrCreate(), location)
    out = fs.create(path, True)
    try:
        out.write(bytearray((text + "\n").encode()))
    finally:
        out.close()


def _sequence(text: str) -> int:
    """argparse type of a stream sequence."""
    value = int(text) if text.strip().isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a stream sequence (1 or more), got {text!r}")
    return value


def _backfill(args: argparse.Namespace, spark_submit: bool) -> int:
    from js_etl.backfill.run import Backfill, RangeRequest
    from js_etl.delta.rules import check_target_paths, on_object_store
    from js_etl.delta.table import DeltaTarget, job_tables
    from js_etl.spark.session import job_session

    config = load_config(args.config, args.overrides)
    request = RangeRequest.parse(from_seq=args.from_seq, to_seq=args.to_seq,
                                 from_time=args.from_time, to_time=args.to_time)
    # The table this config's drain writes is the same config without `--set target.*`: only a
    # backfill into that table is clamped to the durable consumer's ack floor (see backfill.py).
    try:
        drain = load_config(args.config, [o for o in args.overrides
                                          if not o.strip().startswith("target.")])
        drain_target: DeltaTarget | None = job_tables(drain).target
    except JsEtlError:  # no target without the overrides: no drain of this config writes one
        drain_target = None
    check_target_paths(config)
    options = config.nats.connection_options()  # secrets resolved before Spark starts
    options.check()
    job = Backfill(config, request, options=options, drain_target=drain_target)
    job.plan()  # NATS only: a range that cannot be backfilled fails here, before Spark starts
    spark = job_session(config.spark, spark_submit=spark_submit,
                        object_store=on_object_store(config.target))
    return _emit(job.run(spark), args.report_file)


def _rewind(config: JobConfig, to_seq: int, yes: bool) -> int:
    from js_etl.durable.rewind import plan_rewind, rewind_consumer
    from js_etl.errors import ConfirmationRequiredError
    from js_etl.jetstream import JetStreamSession

    with JetStreamSession(config.nats.connection_options()) as js:
        plan = plan_rewind(js, config, to_seq)
        print(plan.describe(), flush=True)
        if not yes:
            if sys.stdin is None or not sys.stdin.isatty():
                raise ConfirmationRequiredError(
                    "refusing to rewind without confirmation: stdin is not a terminal; re-run "
                    "with --yes to confirm")
            answer = input(f"Rewind {plan.stream.name}/{plan.consumer.name} to seq {to_seq}? "
                           "[y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("js-etl: not rewound", file=sys.stderr)
                return 1
            plan = plan_rewind(js, config, to_seq)  # a drain may have started meanwhile
        info = rewind_consumer(js, config, plan)
    print(f"rewound {info.stream_name}/{info.name}: the next delivery is seq {to_seq} "
          f"({info.num_pending:,} pending)", flush=True)
    return 0


def _status(config: JobConfig) -> int:
    from js_etl.jetstream import JetStreamSession

    with JetStreamSession(config.nats.connection_options()) as js:
        stream = js.stream_info(config.source.stream)
        consumer = js.consumer_info(config.source.stream, config.source.consumer)
    print(format_status(stream, consumer))
    return 0


def format_status(stream: Any, consumer: Any) -> str:
    s, c = stream.state, consumer
    groups = ", ".join(f"{g.group} (pinned {g.pinned_client_id or '-'})"
                       for g in c.priority_groups) or "-"
    rows = [
        ("stream", f"{stream.name}  subjects {', '.join(stream.subjects) or '-'}"),
        ("  messages", f"{s.messages:,}  ({s.bytes:,} bytes)"),
        ("  sequences", f"{s.first_seq:,} .. {s.last_seq:,}"),
        ("consumer", f"{c.name}  ack {c.config.ack_policy.value}, ack_wait "
                     f"{c.config.ack_wait or 0:g}s, max_ack_pending {c.config.max_ack_pending}"),
        ("  pending", f"{c.num_pending:,}"),
        ("  ack pending", f"{c.num_ack_pending:,}"),
        ("  redelivered", f"{c.num_redelivered:,}"),
        ("  waiting pulls", f"{c.num_waiting:,}"),
        ("  ack floor", f"stream seq {c.ack_floor.stream_seq:,} / consumer seq "
                        f"{c.ack_floor.consumer_seq:,}"),
        ("  delivered", f"stream seq {c.delivered.stream_seq:,} / consumer seq "
                        f"{c.delivered.consumer_seq:,}"),
        ("  filter", ", ".join(c.config.filter_subjects) or "-"),
        ("  priority groups", groups),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


if __name__ == "__main__":
    os.environ.setdefault("TZ", "UTC")
    sys.exit(main())

