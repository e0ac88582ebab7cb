"""Development tooling, not in the wheel: the benchmark (``python -m tools.bench``), the Spark
standalone cluster and the packed executor environment the cluster tests and the bench use, and
measurement scripts. Tools and tests import ``js_etl``; ``js_etl`` never imports them."""
