"""``spark-submit`` entry point of a backfill: the same job, config and flags as
``js-etl backfill``.

    spark-submit --master local[2] $(js-etl spark-args) \
        "$(python -c 'import js_etl.jobs.backfill as job; print(job.__file__)')" \
        --config conf/example.yaml (--from-seq N | --from-time T) [--to-seq M | --to-time U] \
        [--set KEY=VALUE ...] [--report-file PATH]

The range is checked against the stream before Spark does any work. On a cluster, js_etl and
its executor dependencies must be importable on the executors: ship a packed environment
with --archives (docs/running.md, "Running on a cluster"); --py-files cannot carry pyarrow.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``js-etl backfill`` with ``argv`` (default: this process's arguments) under
    spark-submit; returns the exit code."""
    from js_etl.cli import main as cli_main

    return cli_main(["backfill", *(sys.argv[1:] if argv is None else argv)], spark_submit=True)


if __name__ == "__main__":
    sys.exit(main())
