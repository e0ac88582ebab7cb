"""Payload decoding on the JVM, and the split into table rows and dead-letter rows.

Decoding is column expressions (``from_json``), never per-row Python: the fetched Arrow batches
go straight into Spark and are parsed there. Whether a payload is valid UTF-8 arrives with the
fetched row (``data_is_utf8``, checked by Arrow on the executor, see :mod:`js_etl.drain.fetch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from js_etl.decode.reasons import (
    ARRAY,
    DOCUMENT_STARTS,
    EMPTY,
    MALFORMED,
    NO_FIELD,
    NOT_JSON,
    NOT_UTF8,
    SEVERAL,
    TRAILING,
    WHITESPACE,
)
from js_etl.errors import ConfigError
from js_etl.schema import (
    CORRUPT,
    DEAD_LETTER_COLUMNS,
    FIRST,
    KEYS,
    ORIGIN_COLUMNS,
    PAYLOAD_BYTES,
    VALUES,
    schema_field_problem,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

Format = Literal["raw", "text", "json"]
UnknownFields = Literal["ignore", "dead_letter"]


# Spark's JSON parser accepts single-quoted strings and NaN/Infinity unless told not to: a
# payload is good only if it is JSON.
_STRICT = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false"}
_JSON_WHITESPACE = (" ", "\t", "\n", "\r")



@dataclass(frozen=True)
class Decoder:
    """How fetched rows become table rows and dead letters (with the reason).

    Two steps, so the drain can run the first inside its fetch checkpoint: :meth:`flag` parses
    every row and marks the bad ones (``error``, null = good); :meth:`rows` and
    :meth:`dead_letters` are plain projections of what ``flag`` produced.

    A json payload is good only if it is exactly one JSON object that matches the schema:
    anything else (trailing data, several values, an array, a scalar, whitespace, single quotes,
    NaN) is a dead letter with a specific reason and its raw bytes. Fields the schema does not
    name are not columns; so that no payload vanishes:

    * an object with fields but *none* the schema names (``{"foo": 1}``) is a dead letter,
      unless ``keep_raw`` keeps every row's raw payload in a ``data`` column;
    * ``unknown_fields="dead_letter"`` makes any unnamed top-level field (or a repeated one) a
      dead letter.

    Building one checks ``schema_ddl`` (a bad schema fails before any pull).

    >>> Decoder("json", "id BIGINT, kind STRING", keep_raw=True).fields
    ('id', 'kind')
    """

    fmt: Format
    schema_ddl: str | None = None
    keep_raw: bool = False
    unknown_fields: UnknownFields = "ignore"
    fields: tuple[str, ...] = field(init=False, default=())  # json: the schema's top level

    def __post_init__(self) -> None:
        if self.fmt == "json":
            if not self.schema_ddl:
                raise ConfigError("decode.format json needs decode.schema (Spark DDL)")
            object.__setattr__(self, "fields", tuple(json_fields(self.schema_ddl)))
        if self.unknown_fields not in ("ignore", "dead_letter"):
            raise ConfigError(f"decode.unknown_fields: expected 'ignore' or 'dead_letter', got "
                              f"{self.unknown_fields!r}")

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
            error = F.when(~F.col("data_is_utf8"), F.lit(NOT_UTF8))
        elif self.fmt == "json":
            flagged, error = self._flag_json(raw)
        if park_after is not None:
            error = F.when(F.col("num_delivered") > park_after, F.concat(
                F.lit("poison: delivered "), F.col("num_delivered").cast("string"),
                F.lit(f" times (more than source.max_deliver {park_after})"))
            ).otherwise(error)
        flagged = flagged.withColumn("error", error).withColumn(PAYLOAD_BYTES, F.length("data"))
        if self.fmt == "json":
            flagged = flagged.drop(VALUES, KEYS, FIRST)
            if not self.keep_raw:
                # Good rows need only their parsed fields: keeping the raw payload for dead
                # letters only halves what a round holds.
                flagged = flagged.withColumn(
                    "data", F.when(F.col("error").isNotNull(), F.col("data")))
        return flagged

    def _flag_json(self, raw: DataFrame) -> tuple[DataFrame, Column]:
        """The parsed payload (``_json``) and the dead-letter reason, as column expressions.

        Spark's ``from_json`` reads the first JSON value and ignores whatever follows it
        (``{"id":7}garbage`` and ``{"id":8}\\n{"id":9}`` parse as one good object). Whether
        the payload is *exactly one* value is counted on the JVM too, with
        ``json_array_length`` over the payload wrapped in ``[`` ``]``: a trailing ``garbage``
        or a second object without a comma makes that array malformed, ``a,b`` counts 2,
        whitespace counts 0. A payload can close the wrapper itself (``{"id":7}]junk``);
        then the same payload wrapped as ``[`` … ``,0]`` parses to the same array (both stop at
        the payload's ``]``) instead of one element more, which gives it away. That second
        parse runs only for payloads holding a ``]``.

        What several branches test is a column computed once (``VALUES``, ``FIRST``,
        ``KEYS``): Spark evaluates an expression again in every CASE WHEN branch that names it.
        """
        from pyspark.sql import functions as F

        text = F.col("data").cast("string")
        names = F.array(*[F.lit(name) for name in self.fields])
        parsed = F.from_json(text, f"{self.schema_ddl}, {CORRUPT} STRING",
                             {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT,
                              **_STRICT})
        values, first = F.col(VALUES), F.col(FIRST)
        # contains, not instr: instr counts characters as it scans, which is slower on large
        # payloads.
        closes_early = text.contains("]") & (F.coalesce(F.json_array_length(
            F.concat(F.lit("["), text, F.lit(",0]"))), F.lit(0)) != values + 1)
        head = F.substring(text, 1, 1)
        scalar = (F.when(first == '"', F.lit("string")).when(first.isin("t", "f"), "boolean")
                  .when(first == "n", "null").otherwise("number"))
        corrupt = F.col("_json").getField(CORRUPT).isNotNull()
        # Is the payload JSON at all (any object), under the same strict rules?
        strictly_json = F.from_json(text, "MAP<STRING, STRING>", _STRICT).isNotNull()
        error = (F.when(~F.col("data_is_utf8"), F.lit(NOT_UTF8))
                 .when(F.length("data") == 0, F.lit(EMPTY))
                 .when(values == 0, F.lit(WHITESPACE))
                 .when(values.isNull() & F.get_json_object(text, "$").isNotNull()
                       & first.isin(*DOCUMENT_STARTS), F.lit(TRAILING))
                 .when(values.isNull() & first.isin(*DOCUMENT_STARTS), F.lit(MALFORMED))
                 .when(values.isNull(), F.lit(NOT_JSON))
                 .when(values > 1, _filled(SEVERAL, values.cast("string")))
                 .when(closes_early, F.lit(TRAILING))
                 .when(first == "[", F.lit(ARRAY))
                 .when(first != "{", F.concat(F.lit("payload is a JSON "), scalar, F.lit(
                     ", not an object: decode.schema describes one JSON object per message")))
                 .when(corrupt & ~strictly_json, F.lit(MALFORMED))
                 .when(corrupt, F.lit(f"JSON does not match decode.schema ({self.schema_ddl})")))
        flagged = raw.withColumns({
            "_json": parsed,
            VALUES: F.json_array_length(F.concat(F.lit("["), text, F.lit("]"))),
            # The payload's first character that is not JSON whitespace.
            FIRST: F.when(head.isin(*_JSON_WHITESPACE),
                           F.regexp_extract(text, r"^[ \t\n\r]*(.)", 1)).otherwise(head)})
        if not self.keep_raw:
            # Nothing of such a payload would land anywhere: the schema names none of its
            # fields. Its keys are read only when every named field came back null.
            keys = F.json_object_keys(text)
            all_null = F.lit(True)
            for name in self.fields:
                all_null = all_null & F.col("_json").getField(name).isNull()
            error = error.when(
                all_null & (F.size(keys) > 0) & (F.size(F.array_intersect(keys, names)) == 0),
                _filled(NO_FIELD, F.array_join(F.slice(keys, 1, 10), ", ")))
        if self.unknown_fields == "dead_letter":
            flagged = flagged.withColumn(KEYS, F.json_object_keys(text))
            keys = F.col(KEYS)
            unknown = F.array_except(keys, names)
            error = (error
                     .when(F.size(unknown) > 0, F.concat(
                         F.lit("JSON object has fields decode.schema does not name: "),
                         F.array_join(F.slice(unknown, 1, 10), ", "),
                         F.lit(" (decode.unknown_fields is dead_letter)")))
                     .when(F.size(keys) != F.size(F.array_distinct(keys)), F.lit(
                         "JSON object repeats a field (only one of its values could be kept)")))
        return flagged, error

    def rows(self, flagged: DataFrame) -> DataFrame:
        """What goes into the target table: origin columns and the decoded payload."""
        from pyspark.sql import functions as F

        payload = {"raw": [F.col("data")],
                   "text": [F.col("data").cast("string").alias("text")],
                   # getField takes the name as it is: "a.b" is a field, not b of a.
                   "json": [F.col("_json").getField(name).alias(name) for name in self.fields]}
        if self.fmt == "json" and self.keep_raw:
            payload["json"].append(F.col("data"))
        return (flagged.where(F.col("error").isNull())
                .select(*[F.col(c) for c in ORIGIN_COLUMNS], *payload[self.fmt]))

    def dead_letters(self, flagged: DataFrame) -> DataFrame:
        """DEAD_LETTER_COLUMNS of the bad rows."""
        from pyspark.sql import functions as F

        return flagged.where(F.col("error").isNotNull()).select(*DEAD_LETTER_COLUMNS)


def _filled(reason: str, part: Column) -> Column:
    """``reason`` with ``part`` where its ``{}`` stands, as a column."""
    from pyspark.sql import functions as F

    before, after = reason.split("{}")
    return F.concat(F.lit(before), part, F.lit(after))


def json_fields(schema_ddl: str) -> list[str]:
    """Top-level field names of a DDL schema, checked: no clash with js-etl's own columns or
    with each other, in any letter case (Spark and Delta resolve names case-insensitively)."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    try:
        parsed = _parse_datatype_string(schema_ddl)
    except Exception as e:
        raise ConfigError(f"decode.schema is not valid Spark DDL ({schema_ddl!r}): "
                          f"{_first_line(e)}") from None
    if not isinstance(parsed, StructType):
        raise ConfigError(f"decode.schema must list fields, e.g. 'id BIGINT, kind STRING'; "
                          f"got {schema_ddl!r}")
    names = parsed.fieldNames()
    problem = schema_field_problem(names)
    if problem:
        raise ConfigError(problem)
    return names


def _first_line(error: BaseException) -> str:
    """The first non-empty line of an error (Spark's parse errors start with a blank one)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def with_partition_columns(df: DataFrame, expressions: list[str]) -> tuple[DataFrame, list[str]]:
    """Add ``target.partition_by`` expressions (e.g. ``to_date(published_at) AS date``)."""
    from pyspark.sql import functions as F

    from js_etl.config import partition_column_name

    names = []
    for expression in expressions:
        try:
            column = F.expr(expression)
            name = df.select(column).columns[0]
        except Exception as e:
            raise ConfigError(f"target.partition_by {expression!r} is not a valid expression over "
                              f"the table's columns: {_first_line(e)}") from None
        existing = {c.lower(): c for c in df.columns}
        if name.lower() not in existing:
            df = df.withColumn(name, column)
        elif not partition_column_name(expression)[1]:
            # The table's own column would win and the expression be ignored (JobConfig refuses
            # this already; kept for configs that bypassed it).
            raise ConfigError(f"target.partition_by {expression!r} names its column {name!r}, "
                              f"but the table already has {existing[name.lower()]!r}: give the "
                              "expression another name")
        names.append(name)
    return df, names
