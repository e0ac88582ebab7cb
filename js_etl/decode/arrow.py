"""Payload decoding in Python on the executor, for the ``nats_jetstream`` data source.

A Python data source returns Arrow batches from its tasks: it cannot hand rows to Spark's JVM
``from_json`` the way the drain does (:mod:`js_etl.decode.spark`). So the source decodes here,
with the same rules and the same dead-letter reasons: a json payload is good only if it is
exactly one JSON object matching the schema; anything else keeps its raw bytes in ``data`` and
says why in ``error``. The drain's columnar writer (:mod:`js_etl.drain.writers.columnar`)
decodes with it too, so it must give what Spark gives, payload for payload:
tests/drain/test_columnar.py drains hostile payloads through both and compares the tables.
Hostile payloads are reasons, never a crashed task, and the reasons are Spark's: nesting deeper
than Spark's parser allows (1,000 levels) is malformed JSON, whatever the depth Python's own
parser could follow; an integer literal of more than 1,000 digits is malformed JSON, as Spark's
parser refuses such a number (Python's ``int()`` would refuse it only past 4,300;
tests/unit/decode/test_arrow_decode.py); a non-string value in a STRING column is written back
as Spark's Jackson writes it. The evidence for each of these limits:
docs/design/json-decoding.md.

A batch whose payloads are provably decoded the same way by one pyarrow parse goes that way
instead (:mod:`js_etl.decode.json_batch`); any other batch is decoded payload by payload here.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.decode import reasons, times
from js_etl.decode.json_batch import MAX_INTEGER_DIGITS, MAX_NAME_LENGTH, decode_json_batch

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

from js_etl.config.model import DecodeConfig

# Spark's JSON parser (Jackson's StreamReadConstraints) refuses nesting deeper than this; so
# does this decoder, with the reasons the drain's decoder gives (tests/drain/test_columnar.py).
MAX_DEPTH = 1000
_DECIMALS = Context(prec=2 * MAX_INTEGER_DIGITS + 100)
# What java.math.BigDecimal(String) reads; its digits are UTF-16 units, so only those of the
# Basic Multilingual Plane count.
_DIGIT = r"(?:(?![\U00010000-\U0010FFFF])\d)"
_DECIMAL_TEXT = re.compile(rf"[+-]?({_DIGIT}+\.?{_DIGIT}*|\.{_DIGIT}+)([eE][+-]?{_DIGIT}+)?")
_INT32 = range(-(2**31), 2**31)
# The largest n for which Java's BigInteger holds 10**n (its magnitude is at most 2**31 bits).
_JAVA_MAX_POWER_OF_TEN = 646_456_992
_BRACKETS_OUTSIDE_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


@dataclass(frozen=True)
class BatchDecoder:
    """Raw fetched batch (:data:`js_etl.schema.RAW`) -> the source's columns."""

    decode: DecodeConfig
    spark_type: Any = None  # json: the schema's StructType
    arrow_type: Any = None  # json: its Arrow struct type

    @classmethod
    def of(cls, decode: DecodeConfig, payload_json: str | None) -> BatchDecoder:
        if decode.format != "json":
            return cls(decode)
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import StructType

        spark_type = StructType.fromJson(json.loads(payload_json or "{}"))
        return cls(decode, spark_type, to_arrow_type(spark_type, timezone="UTC"))

    def __call__(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        origin = [raw.column(i) for i in range(7)]
        names = list(raw.schema.names[:7])
        data, utf8 = raw.column("data"), raw.column("data_is_utf8")
        no_error = pa.nulls(raw.num_rows, pa.string())
        if self.decode.format == "raw":
            return pa.RecordBatch.from_arrays([*origin, data, no_error],
                                              names=[*names, "data", "error"])
        if self.decode.format == "text":
            bad = pc.invert(utf8)
            nothing = pa.nulls(raw.num_rows, pa.binary())
            text = pc.if_else(utf8, data, nothing).cast(pa.string())  # invalid ones nulled first
            return pa.RecordBatch.from_arrays(
                [*origin, text, pc.if_else(bad, data, nothing),
                 pc.if_else(bad, pa.scalar(reasons.NOT_UTF8), no_error)],
                names=[*names, "text", "data", "error"])
        return self._json(raw, origin, names)

    def _json(self, raw: pa.RecordBatch, origin: list[pa.Array], names: list[str]
              ) -> pa.RecordBatch:
        fields = self.spark_type.fieldNames()
        struct = (decode_json_batch(raw.column("data"), self.arrow_type,
                                    keep_raw=self.decode.keep_raw)
                  if self.decode.unknown_fields == "ignore" else None)
        if struct is not None:  # one pyarrow parse, proven to give what decode_json gives
            error_array = pa.nulls(raw.num_rows, pa.string())
        else:
            rows: list[dict[str, Any] | None] = []
            errors: list[str | None] = []
            for payload, is_utf8 in zip(raw.column("data").to_pylist(),
                                        raw.column("data_is_utf8").to_pylist(), strict=True):
                row, error = decode_json(payload, is_utf8, self.spark_type, self.decode)
                rows.append(row)
                errors.append(error)
            struct = pa.array(rows, self.arrow_type)
            error_array = pa.array(errors, pa.string())
        good = pc.is_null(error_array)
        data = raw.column("data") if self.decode.keep_raw else pc.if_else(
            good, pa.nulls(raw.num_rows, pa.binary()), raw.column("data"))
        columns = struct.flatten()  # children with the rows' nulls (struct.field ignores them)
        return pa.RecordBatch.from_arrays([*origin, *columns, data, error_array],
                                          names=[*names, *fields, "data", "error"])


class _Mismatch(Exception):
    pass


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Object(dict[str, Any]):
    """A JSON object as parsed: the last value of each name (as Spark keeps it), and every
    (name, value) pair in order, repeats included (Spark checks each against the schema, lists
    each among an object's keys, and writes each back into a STRING column)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs
        if any(len(name) > MAX_NAME_LENGTH for name, _ in pairs):
            raise ValueError(f"a field name of more than {MAX_NAME_LENGTH:,} characters")


def _parse_float(text: str) -> float:
    """A number with a fraction or an exponent; more than 1,000 digits is malformed JSON, as for
    integers (Spark's parser counts the digits on both sides of the point and the exponent's)."""
    if sum(c.isdigit() for c in text) > MAX_INTEGER_DIGITS:
        raise ValueError(f"a number of more than {MAX_INTEGER_DIGITS:,} digits")
    return _Float(text)


class _Float(float):
    """A JSON number with a fraction or an exponent, and its literal: a DECIMAL column takes the
    literal's exact value, as Spark's parser does, not the nearest double's."""

    literal: str

    def __new__(cls, text: str) -> _Float:
        number = super().__new__(cls, text)
        number.literal = text
        return number


def _loads(text: str) -> Any:
    """``json.loads`` with Spark's parser's limits (module docstring)."""
    with _recursion_room():
        return json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int,
                          parse_float=_parse_float, object_pairs_hook=_Object)


def _java_decimal_fits(text: str, scale: int) -> bool:
    """Whether ``java.math.BigDecimal(text).setScale(scale, HALF_UP)`` answers (Spark's reading
    of a DECIMAL): the text is a decimal number, its exponent and scale are 32-bit integers, and
    the power of ten the rescale needs fits Java's BigInteger."""
    match = _DECIMAL_TEXT.fullmatch(text)
    if match is None:
        return False
    exponent = int(match[2][1:]) if match[2] else 0
    mantissa = match[1]
    fraction = len(mantissa.partition(".")[2])
    if exponent not in _INT32 or fraction - exponent not in _INT32:
        return False
    return abs(fraction - exponent - scale) <= _JAVA_MAX_POWER_OF_TEN


def _parse_int(digits: str) -> int:
    """An integer literal; more than 1,000 digits is malformed JSON (module docstring): the
    ValueError reaches :func:`decode_json`'s handler."""
    if len(digits) - digits.startswith("-") > MAX_INTEGER_DIGITS:
        raise ValueError(f"an integer literal of more than {MAX_INTEGER_DIGITS:,} digits")
    return int(digits)


def decode_json(payload: bytes, is_utf8: bool, schema: StructType, decode: DecodeConfig
                ) -> tuple[dict[str, Any] | None, str | None]:
    """One payload -> (row, None) or (None, reason): exactly one JSON object matching the
    schema, with the drain's dead-letter reasons for the shapes it names."""
    if not is_utf8:
        return None, reasons.NOT_UTF8
    if not payload:
        return None, reasons.EMPTY
    text = payload.decode("utf-8")
    stripped = text.lstrip(" \t\n\r")
    if not stripped:
        return None, reasons.WHITESPACE
    depth = _depth(payload) if payload.count(b"[") + payload.count(b"{") >= MAX_DEPTH else 0
    if depth > MAX_DEPTH:
        return None, (reasons.MALFORMED if stripped[0] in reasons.DOCUMENT_STARTS
                      else reasons.NOT_JSON)
    if depth == MAX_DEPTH:
        # Parsed by Spark, but one level too deep once wrapped in the [ ] of the drain's count
        # of values: Spark's decoder says "data after the JSON value", and so does this one.
        return None, reasons.TRAILING
    try:
        value = _loads(text)
    except ValueError as e:
        if "Extra data" in str(e):
            return None, _trailing(text)
        return None, (reasons.MALFORMED if stripped[0] in reasons.DOCUMENT_STARTS
                      else reasons.NOT_JSON)
    if isinstance(value, list):
        return None, reasons.ARRAY
    if not isinstance(value, dict):
        kind = ("string" if isinstance(value, str) else "boolean" if isinstance(value, bool)
                else "null" if value is None else "number")
        return None, (f"payload is a JSON {kind}, not an object: decode.schema describes one "
                      "JSON object per message")
    try:
        with _recursion_room():
            row = _convert(value, schema)
    except _Mismatch:
        return None, f"JSON does not match decode.schema ({decode.schema})"
    if not decode.keep_raw and value and not any(k in value for k in schema.fieldNames()):
        names = ", ".join(name for name, _ in cast(_Object, value).pairs[:10])
        return None, _as_spark_text(reasons.NO_FIELD.format(names))
    return row, None


def _depth(payload: bytes) -> int:
    """How deep ``[`` and ``{`` nest in ``payload``, outside strings."""
    depth = deepest = 0
    for token in _BRACKETS_OUTSIDE_STRINGS.finditer(payload):
        char = token[0][:1]
        if char in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif char in (b"]", b"}"):
            depth -= 1
    return deepest


@contextmanager
def _recursion_room() -> Iterator[None]:
    """Python's JSON parser recurses once per level: room for MAX_DEPTH levels, wherever on the
    stack the decoder runs, so the same payload never fails in one task and parses in another."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, MAX_DEPTH + 2_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def _spark_json(value: Any) -> str:
    """A parsed JSON value written back as Spark writes a non-string value into a STRING column
    (Jackson: compact, non-ASCII as is, numbers with a fraction or exponent as Java's
    ``Double.toString``, infinities as strings; Spark 4.2 on Java 17)."""
    if isinstance(value, _Object):
        return "{" + ",".join(f"{_spark_json(k)}:{_spark_json(v)}"
                              for k, v in value.pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_spark_json(v) for v in value) + "]"
    if isinstance(value, float):
        return _java_double(value)
    return json.dumps(value, ensure_ascii=False)


def _as_spark_text(text: str) -> str:
    """``text`` as a Spark string holds it: a lone surrogate (an escape like ``\\ud800``)
    becomes "?" as in Spark, which Arrow's UTF-8 also needs."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def _java_double(x: float) -> str:
    """Java's ``Double.toString`` of ``x`` from Python's shortest digits: plain from 10^-3 to
    10^7, else ``d.dddE<n>``; infinities as JSON strings, as Jackson writes them. Java 17's
    digits are not always the shortest (2.82879384806159008E17, 9.999999999999999E22 for
    1.0E23, 4.9E-324); those few values differ (docs/guarantees.md, "Writers")."""
    if math.isinf(x):
        return '"Infinity"' if x > 0 else '"-Infinity"'
    sign, digits, exponent = Decimal(repr(x)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)  # finite
    power = len(digits) + exponent - 1  # x = d.ddd * 10^power
    minus = "-" if sign else ""
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        plain = format(abs(Decimal(repr(x))), "f")
        whole, _, fraction = plain.partition(".")
        return f"{minus}{whole}.{fraction.rstrip('0') or '0'}"
    return f"{minus}{text[0]}.{text[1:] or '0'}E{power}"


def _trailing(text: str) -> str:
    """Why a payload with data after its first JSON value is refused, as the drain's decoder
    says it: values separated by commas are counted (it counts the elements of ``[payload]``),
    anything else is trailing data after a document — or text, when the payload does not start
    like one (``false alarm``: see ``reasons.DOCUMENT_STARTS``)."""
    try:
        values = _loads(f"[{text}]")
    except (ValueError, RecursionError):
        starts_document = text.lstrip(" \t\n\r")[:1] in reasons.DOCUMENT_STARTS
        return reasons.TRAILING if starts_document else reasons.NOT_JSON
    return reasons.SEVERAL.format(len(values))


def _convert(value: Any, dt: DataType) -> Any:
    """A parsed JSON value as the Python value of Spark type ``dt``, or _Mismatch."""
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(dt, T.StructType):
        if not isinstance(value, _Object):
            raise _Mismatch
        row = {}
        for f in dt.fields:
            # Every occurrence of a repeated name must fit (Spark converts each); the last wins.
            for name, item in value.pairs:
                if name == f.name:
                    row[f.name] = _convert(item, f.dataType)
            row.setdefault(f.name, None)
        return row
    if isinstance(dt, T.ArrayType):
        if not isinstance(value, list):
            raise _Mismatch
        return [_convert(v, dt.elementType) for v in value]
    if isinstance(dt, T.MapType):
        if not isinstance(value, _Object) or not isinstance(dt.keyType, T.StringType):
            raise _Mismatch
        # Every pair, a repeated key too: Spark's map holds each (and its lookup finds the first).
        return [(k, _convert(v, dt.valueType)) for k, v in value.pairs]
    if isinstance(dt, T.StringType):
        # Like Spark's from_json: a non-string value becomes its JSON text (non-ASCII as is), and
        # a lone surrogate (an escape like \ud800) becomes "?".
        return _as_spark_text(value if isinstance(value, str) else _spark_json(value))
    if isinstance(dt, T.BooleanType):
        if not isinstance(value, bool):
            raise _Mismatch
        return value
    if isinstance(value, bool):
        raise _Mismatch
    if isinstance(dt, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        bits = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}[type(dt)]
        if not isinstance(value, int) or not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise _Mismatch
        return value
    if isinstance(dt, (T.FloatType, T.DoubleType)):
        if not isinstance(value, (int, float)):
            raise _Mismatch
        try:
            return float(value)
        except OverflowError:  # an integer literal beyond the doubles: as Spark, +-Infinity
            return math.inf if value > 0 else -math.inf
    if isinstance(dt, T.DecimalType):
        # Spark takes a number, or a string with any commas dropped (grouping: "1,234.5"), as
        # Java's BigDecimal reads it, and rounds it half up to the column's scale.
        if isinstance(value, str):
            text = value.replace(",", "")
        elif isinstance(value, (int, float)):
            text = value.literal if isinstance(value, _Float) else str(value)
        else:
            raise _Mismatch
        if not _java_decimal_fits(text, dt.scale):
            raise _Mismatch
        try:  # room for any literal the parser takes (digits are bounded) at the column's scale
            number = Decimal(text).quantize(Decimal(1).scaleb(-dt.scale), rounding=ROUND_HALF_UP,
                                            context=_DECIMALS)
        except InvalidOperation:
            raise _Mismatch from None
        if len(number.as_tuple().digits) > dt.precision:
            raise _Mismatch
        return number
    if isinstance(dt, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        # As Spark holds them: days or microseconds since the epoch (js_etl.decode.times). A
        # TIMESTAMP takes a JSON integer too, as seconds; the others only strings.
        if isinstance(value, str):
            read = (times.json_date if isinstance(dt, T.DateType)
                    else times.json_timestamp if isinstance(dt, T.TimestampType)
                    else times.json_timestamp_ntz)
            held = read(value)
        elif isinstance(dt, T.TimestampType) and type(value) is int:
            held = times.json_seconds(value)
        else:
            held = None
        if held is None:
            raise _Mismatch
        return held
    raise _Mismatch
