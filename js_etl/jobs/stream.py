"""``spark-submit`` entry point of a stream job: the same job, config and flags as
``js-etl stream``.

    spark-submit --master local[2] $(js-etl spark-args) \
        "$(python -c 'import js_etl.jobs.stream as job; print(job.__file__)')" \
        --config conf/example.yaml --set streaming.checkpoint=/data/checkpoints/events \
        [--set KEY=VALUE ...] [--report-file PATH]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``js-etl stream`` with ``argv`` (default: this process's arguments) under
    spark-submit; returns the exit code."""
    from js_etl.cli import main as cli_main

    return cli_main(["stream", *(sys.argv[1:] if argv is None else argv)], spark_submit=True)


if __name__ == "__main__":
    sys.exit(main())
