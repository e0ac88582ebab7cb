"""An Airflow host's Python, made of this one: what js-etl's Airflow side must never need cannot
be imported (``python -c "import no_spark; no_spark.install(); ..."``)."""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec

# What `pip install 'js-etl[airflow]'` leaves out (pyspark, delta-spark, deltalake, obstore) and
# the job's own libraries (pyarrow, pandas, numpy), which the Airflow side never imports.
BLOCKED = frozenset({"pyspark", "py4j", "delta", "deltalake", "obstore", "pyarrow", "pandas",
                     "numpy"})


class _Blocker:
    def find_spec(self, name: str, path: object = None, target: object = None
                  ) -> ModuleSpec | None:
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (an Airflow host without "
                                      "Spark)", name=name)
        return None


def install() -> None:
    for name in [m for m in sys.modules if m.partition(".")[0] in BLOCKED]:
        raise RuntimeError(f"{name} was imported before the blocker")
    sys.meta_path.insert(0, _Blocker())
