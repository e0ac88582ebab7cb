"""The benchmark on the command line (``python -m tools.bench``, ``make bench``): its arguments,
the settings they make, and the entry point."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import tools.bench as bench_package
from js_etl.errors import TerminalError
from tools.bench.cluster import ClusterBench, format_cluster
from tools.bench.report import format_results
from tools.bench.runner import Bench
from tools.bench.settings import (
    CLUSTER_MESSAGES,
    CLUSTER_SIZE,
    DEFAULT_LEGS,
    DEFAULT_WORKLOADS,
    LEG_LABELS,
    MEMORY_N,
    MEMORY_SIZE,
    PEER_BATCH,
    QUICK_MEMORY_N,
    QUICK_WORKLOADS,
    SCHEMAS,
    TARGETS,
    WARMUP_MESSAGES,
    Settings,
)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}"
                                         ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _legs(text: str) -> tuple[str, ...]:
    names = tuple(x.strip().replace("-", "_") for x in text.split(",") if x.strip())
    unknown = [x for x in names if x not in LEG_LABELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown leg(s) {unknown}; choose from "
                                         f"{', '.join(LEG_LABELS)}")
    return names


def _choices(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
        unknown = [x for x in names if x not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown value(s) {unknown}; choose from "
                                             f"{', '.join(allowed)}")
        return names

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=_int_list, metavar="N[,N...]",
                        help="messages per workload (default 1000000,200000; --quick 20000,5000)")
    parser.add_argument("--size", type=_int_list, metavar="BYTES[,BYTES...]",
                        help="payload bytes per workload, paired with --messages (default "
                             "256,4096); one value applies to every workload")
    parser.add_argument("--target", type=_choices(TARGETS), default=("local",),
                        metavar="local|s3[,...]",
                        help="where both legs' tables go: local directories, or s3 (a SeaweedFS "
                             "S3 server the bench starts once, its CPU counted apart from the "
                             "legs; a bucket per run); a list runs every workload on each "
                             "(default local)")
    parser.add_argument("--schema", type=_choices(tuple(SCHEMAS)), default=("flat",),
                        metavar="flat|rich[,...]",
                        help="the payload's fields: flat (id, kind, amount, pad) or rich (those "
                             "plus a TIMESTAMP, a DECIMAL(18,4) and a nested STRUCT); a list "
                             "runs every workload with each (default flat)")
    parser.add_argument("--quick", action="store_true",
                        help="a small smoke run (20,000 x 256 B and 5,000 x 4 KiB)")
    parser.add_argument("--partitions", type=_int_list, metavar="P[,P...]",
                        help="fetch.partitions of the drain = processes of the client-limit leg "
                             "(default 2); a list runs every workload with each")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="drain config override, e.g. fetch.batch=2000 (repeatable); the "
                             "client-limit leg uses the same fetch.batch / fetch.max_bytes")
    parser.add_argument("--peer-batch", type=int, default=PEER_BATCH,
                        help=f"messages per pull and per Delta commit of the simple peer "
                             f"(default {PEER_BATCH})")
    parser.add_argument("--legs", type=_legs, default=DEFAULT_LEGS, metavar="LEG[,LEG...]",
                        help="run only these legs: client_limit, simple_peer, js_etl, "
                             "js_etl_connect (js-etl's drain as a client of a Spark Connect "
                             "server the bench starts) (default all; a ratio needs both of its "
                             "legs), or also "
                             "nats_py_fetch (nats-py's own fetch loop, compared with the "
                             "client limit) or js_etl_stream (js-etl stream: an AvailableNow "
                             "query, compared with the drain), only when named")
    parser.add_argument("--repeat", type=int, default=1, metavar="K",
                        help="run the legs K times, alternating, and compare the fastest "
                             "verified run of each (filters out other load; default 1)")
    parser.add_argument("--memory-check", action="store_true",
                        help="only run the js-etl leg at N and 4xN messages (N = first "
                             "--messages, default 1000000; --quick 20000) and compare peak RSS")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                        help=f"a {WARMUP_MESSAGES:,}-message untimed drain after Spark starts, "
                             "so the timed legs do not pay JIT and Delta's first use "
                             "(default: on, off with --quick except for --memory-check)")
    parser.add_argument("--cluster", type=_int_list, metavar="N[,N...]",
                        help="only the cluster mode: the drain job by spark-submit on a Spark "
                             "standalone cluster with N one-core executors against local[N], "
                             "for each N, on the same data (default workload "
                             f"{CLUSTER_MESSAGES:,} x {CLUSTER_SIZE} B; needs the dev extra and "
                             "a source checkout)")
    parser.add_argument("--json", dest="json_path", metavar="PATH",
                        help="also write the JSON result here")
    parser.add_argument("--workdir", help="where the server store and tables go (default: a new "
                                          "temporary directory, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the tables and the workdir")


def settings_from_args(args: argparse.Namespace) -> Settings:
    defaults: tuple[tuple[int, int], ...] = QUICK_WORKLOADS if args.quick else DEFAULT_WORKLOADS
    if args.cluster is not None:
        if any(n < 1 for n in args.cluster):
            raise TerminalError("--cluster: executor counts must be >= 1")
        if args.memory_check:
            raise TerminalError("--cluster and --memory-check are separate runs: pick one")
        if len(args.messages or []) > 1 or len(args.size or []) > 1:
            raise TerminalError("--cluster runs one workload: give one --messages and one --size")
        defaults = ((CLUSTER_MESSAGES, CLUSTER_SIZE),)
    if (args.cluster is not None or args.memory_check) and (
            args.target != ("local",) or args.schema != ("flat",)):
        raise TerminalError("--target and --schema apply to the legs' run, not to --cluster or "
                            "--memory-check (local tables, flat schema)")
    messages = args.messages or [n for n, _ in defaults]
    sizes = args.size or ([s for _, s in defaults] if len(messages) == len(defaults)
                          else [defaults[0][1]])
    if len(sizes) == 1:
        sizes = sizes * len(messages)
    if len(messages) == 1:
        messages = messages * len(sizes)
    if len(messages) != len(sizes):
        raise TerminalError(f"--messages has {len(messages)} values and --size {len(sizes)}: "
                            "give one value or as many as the other")
    if any(n < 1 for n in messages) or any(s < 1 for s in sizes):
        raise TerminalError("--messages and --size must be >= 1")
    if args.partitions is not None and min(args.partitions) < 1:
        raise TerminalError("--partitions must be >= 1")
    if args.repeat < 1:
        raise TerminalError("--repeat must be >= 1")
    if args.peer_batch < 1:
        raise TerminalError("--peer-batch must be >= 1")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="js-etl-bench-"))
    return Settings(
        workloads=list(zip(messages, sizes, strict=True)), overrides=list(args.overrides),
        partitions=tuple(args.partitions) if args.partitions else None,
        peer_batch=args.peer_batch,
        warmup=not args.quick if args.warmup is None else args.warmup,
        workdir=workdir.resolve(), keep=args.keep or bool(args.workdir),
        memory_check=args.memory_check, legs=args.legs, repeat=args.repeat,
        memory_warmup=args.warmup is not False,
        memory_n=args.messages[0] if args.messages else (QUICK_MEMORY_N if args.quick
                                                         else MEMORY_N),
        memory_size=args.size[0] if args.size else MEMORY_SIZE,
        targets=args.target, schemas=args.schema)


def run_bench(args: argparse.Namespace) -> int:
    """The benchmark: returns 0 when every leg verified, 1 otherwise."""
    try:
        import deltalake  # noqa: F401
        import psutil  # noqa: F401
    except ImportError as e:
        raise TerminalError(f"the benchmark needs psutil and deltalake ({e.name} is missing): "
                            "pip install -e '.[dev]'") from None
    from js_etl.demo.server import LocalNatsServer
    from tools.object_store import LocalS3Server

    settings = settings_from_args(args)
    if args.cluster is not None:
        # Before anything starts: one line and exit 2 without a checkout or venv-pack.
        from tools.shipping import require_checkout, venv_pack

        require_checkout()
        venv_pack()
    os.environ.setdefault("TZ", "UTC")
    settings.workdir.mkdir(parents=True, exist_ok=True)
    out = lambda text: print(text, flush=True)  # noqa: E731
    store: LocalS3Server | None = None
    saved: dict[str, str | None] = {}  # the AWS_* variables as they were, put back at the end
    try:
        with LocalNatsServer(settings.workdir / "nats") as server:
            out(f"nats-server {server.url} (pid {server.pid}), work dir {settings.workdir}")
            if "s3" in settings.targets:
                # One store for the whole run; js-etl reads it from this process's AWS_*
                # variables, the simple peer gets the same as deltalake storage options.
                store = LocalS3Server(settings.workdir / "s3").start()
                saved = {name: os.environ.get(name) for name in store.environment()}
                os.environ.update(store.environment())
                out(f"SeaweedFS S3 store {store.endpoint} (pid {store.pid}): tables of the s3 "
                    "target, a bucket per run; its CPU is the store's, counted apart from "
                    "every leg")
            bench: Bench | ClusterBench
            if args.cluster is not None:
                bench = ClusterBench(settings, args.cluster, server.url, out)
            else:
                bench = Bench(settings, server.url, out, store)
            try:
                result = bench.run()
            finally:
                bench.close()
    finally:
        if store is not None:
            store.cleanup()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        if not settings.keep:
            shutil.rmtree(settings.workdir, ignore_errors=True)
    out(format_cluster(result) if args.cluster is not None else format_results(result))
    text = json.dumps(result, separators=(",", ":"), default=str)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2, default=str) + "\n")
    out(text)
    return 0 if result["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    description = (bench_package.__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m tools.bench", description=description)
    add_arguments(parser)
    try:
        return run_bench(parser.parse_args(argv))
    except TerminalError as e:
        print(f"js-etl: {type(e).__name__}: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

