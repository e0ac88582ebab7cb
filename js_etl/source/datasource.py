"""``spark.read.format("nats_jetstream")``: a batch Spark data source over a range of a stream
(and, through :meth:`NatsJetStreamSource.streamReader`, ``spark.readStream``'s).

Built on Spark 4's Python Data Source API (``pyspark.sql.datasource``). After
:func:`register` (once per SparkSession)::

    df = (spark.read.format("nats_jetstream")
          .option("servers", "nats://nats-1:4222").option("stream", "ORDERS")
          .option("from_time", "2026-11-01T00:00:00Z").option("to_time", "2026-11-02T00:00:00Z")
          .option("decode", "json").option("schema", "id BIGINT, kind STRING")
          .load())

How a read is planned, and why it is deterministic:

* ``load()`` runs :meth:`NatsJetStreamSource.schema` in a Python worker on the driver. It checks
  every option (a bad one fails here, naming it), connects, and resolves the range to stream
  sequences with the backfill's resolver (:func:`~js_etl.source.read_range.resolve_sequences`):
  inclusive bounds, RFC 3339 times, the end defaulting to the stream's last sequence *now* (a
  range no read can take fails when the read is planned: ``spark.readStream`` makes its
  DataFrame with the same call, and starts there; :mod:`js_etl.source.stream`).
  Spark pickles the source after ``schema()``, so the resolved range travels with the DataFrame:
  every action on it reads the same sequences, however much is published meanwhile.
* Each action plans the scan: :meth:`NatsJetStreamReader.pushFilters` narrows that range with
  predicates on ``seq`` and ``published_at`` (times become sequences through ``STREAM.MSG.GET``
  with ``start_time``, as for ``from_time``) and turns predicates on ``subject`` into the
  consumers' server-side filter. Pushed predicates are also applied exactly to every batch, so
  the rows are what Spark's own filter would keep; they disappear from the physical plan's
  ``Filter``.
* :meth:`NatsJetStreamReader.partitions` cuts the range into contiguous sub-ranges;
  :meth:`NatsJetStreamReader.read` reads one with :func:`~js_etl.source.read_range.read_range` —
  its own ephemeral, ack-none consumer, by position — so a retried or recomputed task reads the
  same messages. No durable consumer is ever read or changed.

Payloads are decoded on the executor, into the same columns as the drain's table; a payload
that does not decode keeps its raw bytes in ``data`` and says why in ``error`` (null for good
rows), so nothing is silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.config.model import DecodeConfig
from js_etl.decode.arrow import BatchDecoder
from js_etl.durable.policy import source_stream_info
from js_etl.errors import ConfigError, JsEtlError, PurgedRangeError, RangeError
from js_etl.faults import fail_first_attempt
from js_etl.instant import NS_MAX, clamp_ns, format_instant
from js_etl.jetstream import ConnectionOptions, JetStreamSession
from js_etl.jetstream.admin import first_message_at_or_after
from js_etl.schema import ORIGIN_COLUMNS, ORIGIN_DDL
from js_etl.source.options import SourceOptions
from js_etl.source.read_range import (
    RangeFetchPlan,
    Spelling,
    read_range,
    refuse_unmatched_filters,
    refuse_work_queue,
    resolve_sequences,
    split_range,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

try:  # pyspark is a dependency of js_etl.spark; the import is kept local to this module
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        EqualTo,
        Filter,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        InputPartition,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
        StringStartsWith,
    )
except ImportError as e:  # pragma: no cover - pyspark < 4.1
    raise ImportError(f"js_etl.source.datasource needs pyspark >= 4.1 (pyspark.sql.datasource "
                      f"with filter pushdown): {e}") from None

NAME = "nats_jetstream"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
FAULT_PROPERTY = "js_etl.fault"  # sc.setLocalProperty: tests break a read task on purpose
MIN_INACTIVE_THRESHOLD = 30.0  # seconds an abandoned ephemeral consumer outlives its task
SPELLING = Spelling(what="read", cli=False)
RangeFailure = RangeError | PurgedRangeError  # a range no batch read can take

def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("nats_jetstream")`` and ``spark.readStream``'s available in this
    SparkSession.

    Also turns on ``spark.sql.python.filterPushdown.enabled`` for the session (off by default in
    Spark 4.2; a Python source that implements pushdown is refused while it is off). It affects
    only Python data sources.
    """
    spark.dataSource.register(NatsJetStreamSource)
    spark.conf.set(PUSHDOWN_CONF, "true")


# --- schema ---------------------------------------------------------------------------------


def schema_ddl(decode: DecodeConfig) -> str:
    """The drain's table columns for this decode (origin, then payload), ``data`` (raw bytes of
    rows that did not decode, or of every row with raw/keep_raw), then ``error``."""
    payload = {"raw": "data BINARY", "text": "text STRING, data BINARY",
               "json": f"{decode.schema}, data BINARY"}[decode.format]
    return f"{ORIGIN_DDL}, {payload}, error STRING"


# --- the plan that travels to the executors -------------------------------------------------
@dataclass(frozen=True, slots=True)
class Pushed:
    """What the predicates pushed into the scan narrowed (exact, applied to every batch too)."""

    lo: int | None = None  # seq >= lo
    hi: int | None = None  # seq <= hi
    time_from: datetime | None = None  # published_at >= (microseconds, as Spark compares)
    time_after: datetime | None = None  # published_at >
    time_before: datetime | None = None  # published_at <
    time_until: datetime | None = None  # published_at <=
    subjects: tuple[str, ...] | None = None  # subject IN (…)
    subject_prefix: str | None = None  # subject LIKE 'prefix%'


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """One read: the range resolved when the DataFrame was created, and how to read it."""

    options: ConnectionOptions
    stream: str
    lo: int
    hi: int
    filter_subjects: tuple[str, ...]
    batch: int
    max_bytes: int
    pull_timeout: float
    partitions: int
    decode: DecodeConfig
    notes: tuple[str, ...] = ()
    pushed: Pushed = field(default_factory=Pushed)
    payload_json: str | None = None  # json: the payload's StructType, as Spark parsed it


class NatsJetStreamSource(DataSource):
    """``spark.read.format("nats_jetstream")``; see the module docstring and docs/pyspark.md."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        # Called once, by load() of spark.read and of spark.readStream alike: the options, the
        # connection and the stream are checked here, so those errors come when the DataFrame
        # is created. A batch read's range is resolved here too and pickled with this source
        # for every later action; what makes it impossible (an empty stream, a start past the
        # end or purged) is where a stream starts (or fails), so it is raised when a batch read
        # is planned.
        parsed = SourceOptions.parse(self.options)
        self._parsed, self._plan = parsed, plan_read(parsed)
        return schema_ddl(parsed.decode)

    def reader(self, schema: StructType) -> NatsJetStreamReader:
        parsed, plan = self._planned()
        if isinstance(plan, RangeFailure):
            raise plan
        given = parsed.streaming.given
        if given:
            raise ConfigError(f"option {given[0]} is for spark.readStream; a batch read "
                              "takes from_seq/from_time and to_seq/to_time")
        return NatsJetStreamReader(replace(plan, payload_json=payload_json(plan.decode, schema)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        parsed, _ = self._planned()
        from js_etl.source.stream import NatsJetStreamStreamReader

        return NatsJetStreamStreamReader(parsed, payload_json(parsed.decode, schema))

    def _planned(self) -> tuple[SourceOptions, ReadPlan | RangeFailure]:
        """What :meth:`schema` parsed and planned (pickled with this source)."""
        plan: ReadPlan | RangeFailure | None = getattr(self, "_plan", None)
        if plan is None:  # a schema given with .schema(...): schema() was never called
            raise ConfigError("the nats_jetstream source makes its own schema: do not pass "
                              ".schema(...); use the options decode and schema")
        return self._parsed, plan


def payload_json(decode: DecodeConfig, schema: StructType) -> str | None:
    """json: the payload columns as Spark parsed them (the executors decode into these types)."""
    if decode.format != "json":
        return None
    from pyspark.sql.types import StructType

    return StructType(schema.fields[len(ORIGIN_COLUMNS):-2]).json()


def plan_read(parsed: SourceOptions) -> ReadPlan | RangeFailure:
    """Resolve the range on the driver (NATS only): one clear error per impossible read,
    raised, or returned where it is only a batch read's (see :meth:`NatsJetStreamSource.schema`).
    """
    options = parsed.nats.connection_options()
    options.check()
    with JetStreamSession(options) as js:
        stream = source_stream_info(js, parsed.stream, "the option stream")
        refuse_work_queue(stream, "read")
        refuse_unmatched_filters(stream, parsed.filter_subjects, "filter_subjects")
        try:
            found = resolve_sequences(js, stream, parsed.request, SPELLING)
        except (RangeError, PurgedRangeError) as e:
            return e
    fetch = parsed.fetch
    return ReadPlan(options=options, stream=parsed.stream, lo=found.lo, hi=found.hi,
                    filter_subjects=parsed.filter_subjects, batch=fetch.batch,
                    max_bytes=fetch.max_bytes, pull_timeout=fetch.pull_timeout,
                    partitions=fetch.partitions, decode=parsed.decode, notes=found.notes)


# --- pushdown -------------------------------------------------------------------------------
_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


class NatsJetStreamReader(DataSourceReader):
    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Take predicates on ``seq``, ``published_at`` and ``subject``; give back the rest."""
        pushed = self.plan.pushed
        rest: list[Filter] = []
        for f in filters:
            column = getattr(f, "attribute", None)
            taken = None
            if column == ("seq",) and isinstance(f, (*_COMPARISONS, In)):
                taken = _push_seq(pushed, f)
            elif column == ("published_at",) and isinstance(f, _COMPARISONS):
                taken = _push_time(pushed, f)
            elif column == ("subject",) and isinstance(f, (EqualTo, In, StringStartsWith)):
                taken = _push_subject(pushed, f)
            elif column in (("seq",), ("published_at",), ("subject",)) \
                    and isinstance(f, IsNotNull):
                taken = pushed  # never null
            if taken is None or isinstance(f, In):
                rest.append(f)  # an IN list only narrows the range: Spark still checks it
            if taken is not None:
                pushed = taken
        self.plan = _narrowed(replace(self.plan, pushed=pushed))
        return rest

    def partitions(self) -> Sequence[InputPartition]:
        plan = self.plan
        if plan.hi < plan.lo:
            return [InputPartition(None)]  # the predicates leave nothing to read
        return [InputPartition(bounds) for bounds in split_range(plan.lo, plan.hi,
                                                                 plan.partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is None:
            return
        from pyspark import TaskContext

        # Test-only fault point (js_etl.faults), armed by the driver thread's local property
        # so it never appears among the options (plans, UI) and cannot be set by accident.
        context = TaskContext.get()
        fault = context.getLocalProperty(FAULT_PROPERTY) if context is not None else None
        for batch in read_partition(self.plan, partition.value):
            yield batch
            fail_first_attempt("fail_fetch_task", fault)


def _push_seq(pushed: Pushed, f: Filter) -> Pushed | None:
    value = getattr(f, "value", None)
    if isinstance(f, In):
        if not f.value or not all(isinstance(v, int) for v in f.value):
            return None
        return _bounds(pushed, min(f.value), max(f.value))
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    lo, hi = {EqualTo: (value, value), GreaterThan: (value + 1, None),
              GreaterThanOrEqual: (value, None), LessThan: (None, value - 1),
              LessThanOrEqual: (None, value)}[type(f)]
    return _bounds(pushed, lo, hi)


def _bounds(pushed: Pushed, lo: int | None, hi: int | None) -> Pushed:
    if lo is not None:
        pushed = replace(pushed, lo=lo if pushed.lo is None else max(lo, pushed.lo))
    if hi is not None:
        pushed = replace(pushed, hi=hi if pushed.hi is None else min(hi, pushed.hi))
    return pushed


def _push_time(pushed: Pushed, f: Filter) -> Pushed | None:
    value = getattr(f, "value", None)
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:  # Spark hands TIMESTAMP literals in the session zone; assume UTC
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    if isinstance(f, EqualTo):
        return replace(pushed, time_from=_later(pushed.time_from, value),
                       time_until=_earlier(pushed.time_until, value))
    if isinstance(f, GreaterThan):
        return replace(pushed, time_after=_later(pushed.time_after, value))
    if isinstance(f, GreaterThanOrEqual):
        return replace(pushed, time_from=_later(pushed.time_from, value))
    if isinstance(f, LessThan):
        return replace(pushed, time_before=_earlier(pushed.time_before, value))
    return replace(pushed, time_until=_earlier(pushed.time_until, value))


def _later(a: datetime | None, b: datetime) -> datetime:
    return b if a is None else max(a, b)


def _earlier(a: datetime | None, b: datetime) -> datetime:
    return b if a is None else min(a, b)


def _push_subject(pushed: Pushed, f: Filter) -> Pushed | None:
    if isinstance(f, StringStartsWith):
        if pushed.subject_prefix is not None and not f.value.startswith(pushed.subject_prefix):
            return None  # two prefixes: keep the first, let Spark check the second
        return replace(pushed, subject_prefix=f.value)
    values = (f.value,) if isinstance(f, EqualTo) else tuple(getattr(f, "value", ()))
    if not values or not all(isinstance(v, str) for v in values):
        return None
    if pushed.subjects is not None:
        values = tuple(v for v in values if v in pushed.subjects)
    return replace(pushed, subjects=values)


_MICRO = 1000  # ns per µs: Spark timestamps are microseconds, stream times nanoseconds


def _ns(moment: datetime, later: int = 0) -> int:
    """A pushed filter's time as the stream's nanoseconds, ``later`` after it, within the times
    NATS compares (:func:`~js_etl.instant.clamp_ns`)."""
    return min(NS_MAX, clamp_ns(moment.astimezone(UTC)) + later)


def _narrowed(plan: ReadPlan) -> ReadPlan:
    """The plan's range narrowed by what was pushed: sequences directly, times through
    ``STREAM.MSG.GET`` (the first message stored at or after a time), subjects as the
    consumers' filter. A row's ``published_at`` is its stream time truncated to microseconds,
    so ``published_at >= T`` holds exactly for stream times >= T (µs) and ``published_at > T``
    for stream times >= T + 1 µs."""
    p = plan.pushed
    lo, hi = plan.lo, plan.hi
    if p.lo is not None:
        lo = max(lo, p.lo)
    if p.hi is not None:
        hi = min(hi, p.hi)
    starts = [_ns(t) for t in (p.time_from,) if t is not None]
    starts += [_ns(t, _MICRO) for t in (p.time_after,) if t is not None]
    ends = [_ns(t) for t in (p.time_before,) if t is not None]  # first stored at/after: excluded
    ends += [_ns(t, _MICRO) for t in (p.time_until,) if t is not None]
    if (starts or ends) and lo <= hi:
        with JetStreamSession(plan.options) as js:
            for start in starts:
                found = js.run(first_message_at_or_after(js.admin, plan.stream,
                                                         format_instant(start)))
                lo = max(lo, found[0]) if found is not None else hi + 1
            for end in ends:
                found = js.run(first_message_at_or_after(js.admin, plan.stream,
                                                         format_instant(end)))
                if found is not None:
                    hi = min(hi, found[0] - 1)
    filters = plan.filter_subjects
    narrowed = p.subjects if p.subjects is not None else (
        (f"{p.subject_prefix}>",) if p.subject_prefix and p.subject_prefix.endswith(".")
        and not any(c in p.subject_prefix for c in "*> ") else None)
    if narrowed is not None:
        # Server-side filter: the pushed subjects that the option's own filter lets through.
        kept = tuple(s for s in narrowed if not filters or any(
            subject_matches(s, f) for f in filters))
        if not kept:
            hi = lo - 1  # nothing can match both
        filters = kept
    return replace(plan, lo=lo, hi=hi, filter_subjects=filters)


def subject_matches(subject: str, pattern: str) -> bool:
    """Whether every subject ``subject`` (itself possibly a wildcard filter) matches lies
    within NATS filter ``pattern`` (``*`` one token, ``>`` one or more at the end)."""
    tokens, wanted = subject.split("."), pattern.split(".")
    for i, want in enumerate(wanted):
        if want == ">":
            return len(tokens) > i
        if i >= len(tokens) or (want != "*" and want != tokens[i]) or \
                (want == "*" and tokens[i] == ">"):
            return False
    return len(tokens) == len(wanted)


# --- the executor side ----------------------------------------------------------------------
def read_partition(plan: ReadPlan, bounds: tuple[int, int]) -> Iterator[pa.RecordBatch]:
    """Sub-range ``bounds`` through the shared range reader, pushed predicates applied exactly,
    payloads decoded."""
    import uuid

    fetch = RangeFetchPlan(
        options=plan.options, stream=plan.stream, name_prefix=f"jsetl_rd_{uuid.uuid4().hex[:8]}",
        bounds=(bounds,), filter_subjects=plan.filter_subjects, batch=plan.batch,
        max_bytes=plan.max_bytes, pull_timeout=plan.pull_timeout,
        inactive_threshold=max(MIN_INACTIVE_THRESHOLD, 6 * plan.pull_timeout))
    decoder = BatchDecoder.of(plan.decode, plan.payload_json)
    for batch in read_range(fetch, 0):
        batch = _apply_pushed(batch, plan.pushed)
        if batch.num_rows:
            yield decoder(batch)


def _apply_pushed(batch: pa.RecordBatch, p: Pushed) -> pa.RecordBatch:
    mask = None

    def both(cond: pa.Array) -> None:
        nonlocal mask
        mask = cond if mask is None else pc.and_(mask, cond)

    published = batch.column("published_at")
    for moment, op in ((p.time_from, pc.greater_equal), (p.time_after, pc.greater),
                       (p.time_before, pc.less), (p.time_until, pc.less_equal)):
        if moment is not None:
            both(op(published, pa.scalar(moment, published.type)))
    subjects = batch.column("subject")
    if p.subjects is not None:
        both(pc.is_in(subjects, value_set=pa.array(p.subjects, pa.string())))
    if p.subject_prefix is not None:
        both(pc.starts_with(subjects, p.subject_prefix))
    return batch if mask is None else batch.filter(mask)


def load_error(error: BaseException) -> JsEtlError | None:
    """The js-etl error inside a Spark exception from ``load()``/an action, or None.

    Spark wraps what a Python data source raises in its own exception whose text carries the
    worker's traceback; its ``js_etl.errors.X: message`` line is the one line that says why."""
    from js_etl import errors
    from js_etl.jetstream import errors as jetstream_errors

    match = re.search(r"^js_etl\.(?:jetstream\.)?errors\.(\w+): (.*)$", str(error), re.M)
    if match is None:
        return None
    kind = getattr(errors, match.group(1), None) or getattr(jetstream_errors, match.group(1),
                                                            None)
    text = re.sub(r" SQLSTATE: \w+$", "", match.group(2))
    if not (isinstance(kind, type) and issubclass(kind, JsEtlError)):
        return None
    try:
        return kind(text)
    except TypeError:
        return JsEtlError(text)
