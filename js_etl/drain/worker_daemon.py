"""PySpark's Python worker daemon, with the fetch tasks' modules imported before it forks.

PySpark starts one daemon process per executor (``python -m pyspark.daemon``), which forks a
worker per concurrent task. Every fresh worker imported pyarrow's compute, JSON and Parquet
modules, pandas (pyarrow's compute functions import it where it is installed) and js-etl's
fetch, decode and NATS client modules at its first task, on its own: CPU every fresh worker
spent again. A drain's workers are fresh in every new process and after a minute idle (PySpark's
idle-worker timeout), so every run paid it once per partition. Imported here, in the daemon,
forked workers share them: paid once per executor (docs/design/columnar-writer.md).

Set for local sessions only (``spark.python.daemon.module``, :func:`js_etl.spark.session.
local_builder`; a ``spark.conf`` setting of it wins): under spark-submit the executors' Python
is the user's to set up, and keeps PySpark's own daemon.

Nothing here may write to stdout: the JVM reads the daemon's port from it.
"""

# Imported for the forked workers: what a fetch task imports (columnar or not), at the top of
# these modules or inside the functions a task runs.
import pyarrow.compute
import pyarrow.ipc
import pyarrow.json
import pyarrow.parquet  # noqa: F401
import pyspark.sql.pandas.types  # noqa: F401
from pyspark import daemon

import js_etl.decode.arrow
import js_etl.decode.json_batch
import js_etl.drain.fetch
import js_etl.drain.writers.columnar_task
import js_etl.jetstream.arrow  # noqa: F401

try:  # pyarrow's compute functions import pandas, where it is installed, at their first call
    import pandas  # noqa: F401
except ImportError:
    pass

if __name__ == "__main__":
    daemon.manager()
