"""``spark-submit`` entry point of the drain: the same job, config and flags as ``js-etl drain``
(the work is in the packaged :mod:`js_etl.jobs.drain`, which a wheel install has too).

    spark-submit --master local[2] $(js-etl spark-args) jobs/drain_to_delta.py \
        --config conf/example.yaml [--set KEY=VALUE ...] [--report-file PATH]

On a cluster, js_etl and its executor dependencies must be importable on the executors:
ship a packed environment with --archives (docs/running.md, "Running on a cluster"); --py-files
cannot carry pyarrow.
"""

import sys

from js_etl.jobs.drain import main

if __name__ == "__main__":
    sys.exit(main())
