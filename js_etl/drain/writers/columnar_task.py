"""The columnar writer's fetch task, on the executor: pull, decode with Arrow, write the rows
and dead letters to Parquet files, and return their keys and file descriptions."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.delta.files import TaskFiles, WrittenFile
from js_etl.drain.fetch import FetchPlan, fetch_partition
from js_etl.drain.writers.columnar_plan import ColumnarPlan
from js_etl.faults import fail_first_attempt
from js_etl.schema import dead_letter_arrow

# A fetch task's output as a DataFrame's rows, one pickled TaskOutput each: over Spark Connect
# (no RDDs) the round is a ``mapInArrow`` job.
TASK_OUTPUT = pa.schema([("item", pa.binary())])
TASK_OUTPUT_DDL = "item binary"

KEY_SCHEMA = pa.schema([("seq", pa.int64()), ("consumer_seq", pa.int64()),
                        ("num_delivered", pa.int64()), ("dead", pa.bool_()),
                        ("bytes", pa.int64())])


@dataclass(frozen=True, slots=True)
class TaskOutput:
    """One item of a fetch task's output, for one of:

    * a pulled batch: ``keys``, the Arrow IPC stream of the batch's :data:`KEY_SCHEMA` columns
      (one value per pull, not one per message: rows through the JVM are what this writer
      avoids);
    * a file of rows the task wrote: ``file``;
    * the file of dead letters it wrote (one at most): ``dead_letters`` (its path relative to
      :attr:`ColumnarPlan.dead_letter_files`)."""

    keys: bytes | None = None
    file: WrittenFile | None = None
    dead_letters: WrittenFile | None = None


@dataclass(frozen=True, slots=True)
class RoundOutput:
    """A columnar round's task output, collected on the driver: the keys of every delivery
    (:data:`KEY_SCHEMA`), the files of rows, the files of dead letters."""

    keys: pa.Table
    files: tuple[WrittenFile, ...]
    dead_letters: tuple[WrittenFile, ...]

    @classmethod
    def of(cls, output: list[TaskOutput]) -> RoundOutput:
        """From the tasks' collected output."""
        keys = [batch for o in output if o.keys is not None
                for batch in pa.ipc.open_stream(o.keys)]
        return cls(pa.Table.from_batches(keys, schema=KEY_SCHEMA),
                   tuple(o.file for o in output if o.file is not None),
                   tuple(o.dead_letters for o in output if o.dead_letters is not None))


def fetch_task(fetch: FetchPlan, plan: ColumnarPlan, round_no: int,
               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body of a round's fetch job (one row a partition): the task's
    :func:`fetch_decode_write`, as :data:`TASK_OUTPUT` rows."""
    for output in fetch_decode_write(fetch, plan, round_no, batches):
        yield pa.RecordBatch.from_arrays([pa.array([pickle.dumps(output)], pa.binary())],
                                         schema=TASK_OUTPUT)


def task_outputs(rows: pa.Table) -> list[TaskOutput]:
    """The collected :data:`TASK_OUTPUT` rows of a round's tasks (pickled by the tasks above:
    the round's own output, never outside data)."""
    return [pickle.loads(item) for item in rows.column("item").to_pylist()]


def fetch_decode_write(fetch: FetchPlan, plan: ColumnarPlan, round_no: int,
                       elements: Iterator[object]) -> Iterator[TaskOutput]:
    """One task of a round's fetch (an RDD's ``mapPartitions`` body, or :func:`fetch_task`'s):
    the fetch
    (:func:`~js_etl.drain.fetch.fetch_partition`), each pulled batch decoded, its good rows
    written on into one Parquet file per partition value and its dead letters into the task's
    dead-letter file (:class:`~js_etl.delta.files.TaskFiles`); yields the keys of each pull,
    then each file once all are closed.

    What fetch.partition_max_bytes bounds here is the round's dead letters (payload, headers and
    subject counted), which Spark's append reads back where the dead-letter table does not take
    them as they are: the good rows are committed as they are, the keys a few dozen bytes a
    message."""
    from pyspark import TaskContext

    from js_etl.decode.arrow import BatchDecoder

    decoder = BatchDecoder.of(plan.decode, plan.payload_json)
    context = TaskContext.get()
    task = context.partitionId() if context is not None else 0
    dead_bytes = 0
    with TaskFiles(plan.directory, plan.dead_letter_files, plan.partitions,
                   f"{plan.file_prefix}-r{round_no}-t{task}", plan.storage) as files:
        # Late binding wanted: the fetch asks before each pull what is held by then.
        for raw in fetch_partition(fetch, elements, held=lambda: dead_bytes):  # noqa: B023
            decoded = decoder(raw)
            # A good row keeps its payload only where the decode keeps the payload: the bytes, and a
            # row that is parked below, take it from the pull.
            payloads = raw.column("data")
            error = decoded.column("error")
            if plan.park_after is not None:
                delivered = decoded.column("num_delivered")
                poison = pc.binary_join_element_wise(
                    "poison: delivered ", pc.cast(delivered, pa.string()),
                    f" times (more than source.max_deliver {plan.park_after})", "")
                error = pc.if_else(pc.greater(delivered, plan.park_after), poison, error)
            dead = pc.is_valid(error)
            rows = decoded.drop_columns(["error"] if plan.decode.keeps_payload
                                        else ["error", "data"])
            yield TaskOutput(keys=_key_blob(decoded, dead, payloads))
            if pc.any(dead).as_py():
                files.add(rows.filter(pc.invert(dead)))
                dead_letters = _dead_letters(decoded.filter(dead), error.filter(dead),
                                             payloads.filter(dead))
                dead_bytes += dead_letters.nbytes
                files.add_dead_letters(dead_letters)
            else:
                files.add(rows)  # a filter would copy every payload byte (~1 s per 400 MB)
        written, dead_file = files.close()
    if written:  # the attempt dies with its files on disk: they must never be committed
        fail_first_attempt("fail_write_task", fetch.fault)
    for description in written:
        yield TaskOutput(file=description)
    if dead_file is not None:
        yield TaskOutput(dead_letters=dead_file)


def _key_blob(decoded: pa.RecordBatch, dead: pa.Array, payloads: pa.Array) -> bytes:
    """The batch's KEY_SCHEMA columns as one Arrow IPC stream."""
    keys = pa.RecordBatch.from_arrays([
        decoded.column("seq"), decoded.column("consumer_seq"), decoded.column("num_delivered"),
        dead, pc.binary_length(payloads).cast(pa.int64())], schema=KEY_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, KEY_SCHEMA) as writer:
        writer.write_batch(keys)
    return bytes(sink.getvalue())


def _dead_letters(decoded: pa.RecordBatch, error: pa.Array, payloads: pa.Array
                  ) -> pa.RecordBatch:
    columns = {name: decoded.column(name) for name in dead_letter_arrow().names
               if name in decoded.schema.names}
    columns.update({"data": payloads, "error": error})
    n = decoded.num_rows
    return pa.RecordBatch.from_arrays(
        [columns.get(f.name, pa.nulls(n, f.type)) for f in dead_letter_arrow()],
        schema=dead_letter_arrow())
