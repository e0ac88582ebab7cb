"""``spark-submit`` entry point of a backfill: the same job, config and flags as
``js-etl backfill`` (the work is in the packaged :mod:`js_etl.jobs.backfill`, which a wheel
install has too).

    spark-submit --master local[2] $(js-etl spark-args) jobs/backfill_to_delta.py \
        --config conf/example.yaml (--from-seq N | --from-time T) [--to-seq M | --to-time U] \
        [--set KEY=VALUE ...] [--report-file PATH]

The range is checked against the stream before Spark does any work. On a cluster, js_etl and
its executor dependencies must be importable on the executors: ship a packed environment
with --archives (docs/running.md, "Running on a cluster"); --py-files cannot carry pyarrow.
"""

import sys

from js_etl.jobs.backfill import main

if __name__ == "__main__":
    sys.exit(main())
