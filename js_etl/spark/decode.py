"""Payload decoding on the JVM, and the split into table rows and dead-letter rows.

Decoding is column expressions (``from_json``), never per-row Python: the fetched Arrow batches
go straight into Spark and are parsed there. Whether a payload is valid UTF-8 arrives with the
fetched row (``data_is_utf8``, checked by Arrow on the executor, see :mod:`js_etl.spark.fetch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from js_etl.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

Format = Literal["raw", "text", "json"]

ORIGIN_COLUMNS = ("subject", "stream", "seq", "consumer_seq", "num_delivered", "published_at",
                  "headers")
DEAD_LETTER_COLUMNS = ("seq", "stream", "subject", "consumer_seq", "num_delivered",
                       "published_at", "headers", "data", "error")
_CORRUPT = "_js_etl_corrupt"
PAYLOAD_BYTES = "_js_etl_payload_bytes"  # in `flagged` only: the round's byte count


@dataclass(frozen=True)
class Decoder:
    """How fetched rows become table rows and dead letters (with the reason).

    Two steps, so the drain can run the first inside its fetch checkpoint: :meth:`flag` parses
    every row and marks the bad ones (``error``, null = good); :meth:`rows` and
    :meth:`dead_letters` are plain projections of what ``flag`` produced.

    Building one checks ``schema_ddl`` (a bad schema fails before any pull).
    """

    fmt: Format
    schema_ddl: str | None = None
    fields: tuple[str, ...] = field(init=False, default=())  # json: the schema's top level

    def __post_init__(self) -> None:
        if self.fmt == "json":
            if not self.schema_ddl:
                raise ConfigError("decode.format json needs decode.schema (Spark DDL)")
            object.__setattr__(self, "fields", tuple(json_fields(self.schema_ddl)))

    def flag(self, raw: DataFrame, *, park_after: int | None = None) -> DataFrame:
        """Every fetched row, payload parsed, ``error`` (null = good) and PAYLOAD_BYTES.

        ``park_after``: a message delivered more often than this is poison — it goes to the
        dead-letter table whatever its payload, so it can never stall the drain or be dropped
        by the server's own ``max_deliver``.
        """
        from pyspark.sql import functions as F

        error = F.lit(None).cast("string")
        flagged = raw
        if self.fmt == "text":
            error = F.when(~F.col("data_is_utf8"), F.lit("payload is not valid UTF-8"))
        elif self.fmt == "json":
            text = F.col("data").cast("string")
            parsed = F.from_json(text, f"{self.schema_ddl}, {_CORRUPT} STRING",
                                 {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
            corrupt = F.col(f"_json.{_CORRUPT}").isNotNull()
            error = (F.when(~F.col("data_is_utf8"), F.lit("payload is not valid UTF-8"))
                     .when(F.length("data") == 0, F.lit("empty payload"))
                     .when(F.col("_json").isNull(), F.lit("payload is not JSON"))
                     .when(corrupt & F.get_json_object(text, "$").isNull(),
                           F.lit("malformed JSON"))
                     .when(corrupt,
                           F.lit(f"JSON does not match decode.schema ({self.schema_ddl})")))
            flagged = raw.withColumn("_json", parsed)
        if park_after is not None:
            error = F.when(F.col("num_delivered") > park_after, F.concat(
                F.lit("poison: delivered "), F.col("num_delivered").cast("string"),
                F.lit(f" times (more than source.max_deliver {park_after})"))
            ).otherwise(error)
        flagged = flagged.withColumn("error", error).withColumn(PAYLOAD_BYTES, F.length("data"))
        if self.fmt == "json":
            # Good rows need only their parsed fields: keeping the raw payload for dead letters
            # only halves what a round holds.
            flagged = flagged.withColumn("data",
                                         F.when(F.col("error").isNotNull(), F.col("data")))
        return flagged

    def rows(self, flagged: DataFrame) -> DataFrame:
        """What goes into the target table: origin columns and the decoded payload."""
        from pyspark.sql import functions as F

        payload = {"raw": [F.col("data")],
                   "text": [F.col("data").cast("string").alias("text")],
                   "json": [F.col(f"_json.{name}").alias(name) for name in self.fields]}
        return (flagged.where(F.col("error").isNull())
                .select(*[F.col(c) for c in ORIGIN_COLUMNS], *payload[self.fmt]))

    def dead_letters(self, flagged: DataFrame) -> DataFrame:
        """DEAD_LETTER_COLUMNS of the bad rows."""
        from pyspark.sql import functions as F

        return flagged.where(F.col("error").isNotNull()).select(*DEAD_LETTER_COLUMNS)


def json_fields(schema_ddl: str) -> list[str]:
    """Top-level field names of a DDL schema (checked for clashes with origin columns)."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    try:
        parsed = _parse_datatype_string(schema_ddl)
    except Exception as e:
        raise ConfigError(f"decode.schema is not valid Spark DDL ({schema_ddl!r}): "
                          f"{str(e).splitlines()[0]}") from None
    if not isinstance(parsed, StructType):
        raise ConfigError(f"decode.schema must list fields, e.g. 'id BIGINT, kind STRING'; "
                          f"got {schema_ddl!r}")
    clash = sorted(set(parsed.fieldNames()) & {*ORIGIN_COLUMNS, "data", "text", _CORRUPT})
    if clash:
        raise ConfigError(f"decode.schema field(s) {clash} clash with js-etl's own columns; "
                          "rename them in the schema")
    return parsed.fieldNames()


def with_partition_columns(df: DataFrame, expressions: list[str]) -> tuple[DataFrame, list[str]]:
    """Add ``target.partition_by`` expressions (e.g. ``to_date(published_at) AS date``)."""
    from pyspark.sql import functions as F

    names = []
    for expression in expressions:
        try:
            column = F.expr(expression)
            name = df.select(column).columns[0]
        except Exception as e:
            raise ConfigError(f"target.partition_by {expression!r} is not a valid expression over "
                              f"the table's columns: {str(e).splitlines()[0]}") from None
        if name not in df.columns:
            df = df.withColumn(name, column)
        names.append(name)
    return df, names
