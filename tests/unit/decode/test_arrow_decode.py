"""The data source's Python JSON decoding (js_etl/decode/arrow.py): pure, no JVM."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from js_etl.config.model import DecodeConfig
from js_etl.decode.arrow import decode_json

MICRO = timedelta(microseconds=1)
DECODE = DecodeConfig(format="json", schema="id BIGINT, n DECIMAL(10,2), tags ARRAY<STRING>")


@pytest.fixture(scope="module")
def schema():
    from pyspark.sql.types import ArrayType, DecimalType, LongType, StringType, StructType

    return (StructType().add("id", LongType()).add("n", DecimalType(10, 2))
            .add("tags", ArrayType(StringType())))


def test_json_values_take_the_schema_types_or_say_why_not():
    from pyspark.sql.types import DateType, LongType, StringType, StructType, TimestampType

    decode = DecodeConfig(format="json", schema="id BIGINT, note STRING, at TIMESTAMP, d DATE")
    # Built by hand: parsing DDL needs a SparkContext, which this pure check does not use.
    schema = (StructType().add("id", LongType()).add("note", StringType())
              .add("at", TimestampType()).add("d", DateType()))
    row, error = decode_json(b'{"id": 5, "note": {"a": [1]}, "at": "2026-11-01T10:00:00.5Z", '
                             b'"d": "2026-11-01"}', True, schema, decode)
    assert error is None and row is not None
    assert row["note"] == '{"a":[1]}'  # a non-string value in a STRING field: its JSON text
    # As Spark holds them: microseconds and days since the epoch (js_etl.decode.times).
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert row["at"] == (datetime(2026, 11, 1, 10, 0, 0, 500000, tzinfo=UTC) - epoch) // MICRO
    assert row["d"] == (datetime(2026, 11, 1, tzinfo=UTC) - epoch).days
    assert decode_json(b'{"id": NaN}', True, schema, decode) == (None, "malformed JSON")
    assert decode_json(b'{"id": 1.5}', True, schema, decode)[1] == (
        "JSON does not match decode.schema (id BIGINT, note STRING, at TIMESTAMP, d DATE)")
    assert decode_json(b'{"other": 1}', True, schema, decode)[1].startswith(
        "JSON object has none of decode.schema's fields (it has: other)")
    assert decode_json(b"  ", True, schema, decode)[1] == (
        "payload is only whitespace: no JSON value")
    assert decode_json(b"[1]", True, schema, decode)[1].startswith("payload is a JSON array")


@pytest.mark.parametrize(("payload", "reason"), [
    (b"null", "payload is a JSON null, not an object"),
    (b"true", "payload is a JSON boolean, not an object"),
    (b"12", "payload is a JSON number, not an object"),
    (b'"x"', "payload is a JSON string, not an object"),
    # Nested deeper than Spark's parser goes (1,000 levels): malformed, as the drain has it.
    (b"[" * 100_000 + b"]" * 100_000, "malformed JSON"),
    (b'{"tags": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "malformed JSON"),
    # Integer literals of over 1,000 digits: malformed, as Spark's parser (and so the drain)
    # has them; past 4,300 digits int() itself would raise.
    (b'{"id": ' + b"9" * 10_000 + b"}", "malformed JSON"),
    (b'{"tags": [' + b"9" * 1_001 + b"]}", "malformed JSON"),
    (b'{"other": -' + b"9" * 1_001 + b"}", "malformed JSON"),
    (b'{"id": 1}{"id": 2}', "data after the JSON value"),
    (b'{"id": 1} x', "data after the JSON value"),
    (b"\xff\xfe", "payload is not valid UTF-8"),
    (b"{'id': 1}", "malformed JSON"),
])
def test_hostile_payloads_become_reasons_never_a_crashed_task(schema, payload, reason):
    try:  # the fetch computes this flag with Arrow's UTF-8 check
        payload.decode("utf-8")
        is_utf8 = True
    except UnicodeDecodeError:
        is_utf8 = False
    row, error = decode_json(payload, is_utf8, schema, DECODE)
    assert row is None and error is not None and error.startswith(reason), error


def test_pretty_printed_multi_line_json_and_big_numbers_in_range_decode(schema):
    payload = b'{\n  "id": 9223372036854775807,\n  "n": 12345678.99,\n  "tags": ["a", "b"]\n}\n'
    row, error = decode_json(payload, True, schema, DECODE)
    assert error is None and row is not None
    assert row["id"] == 2**63 - 1 and str(row["n"]) == "12345678.99" and row["tags"] == ["a", "b"]
    too_big = b'{"id": 9223372036854775808}'  # one past BIGINT
    assert decode_json(too_big, True, schema, DECODE)[1].startswith("JSON does not match")


def test_a_double_given_an_integer_beyond_the_doubles_is_infinite_as_in_spark():
    """Found by tests/unit/decode/test_json_batch.py's fuzz: ``float()`` of such an integer raised
    OverflowError and crashed the task. Spark's from_json gives +-Infinity (measured, Spark
    4.2: ``{"d": 2**1024}`` as ``d DOUBLE``), as it does for ``1e400``."""
    from pyspark.sql.types import DoubleType, StructType

    schema = StructType().add("d", DoubleType())
    decode = DecodeConfig(format="json", schema="d DOUBLE")
    for text, value in ((str(2 ** 1024), float("inf")), (str(-2 ** 1024), float("-inf")),
                        ("1e400", float("inf")), ("9" * 1_000, float("inf"))):
        assert decode_json(b'{"d": %s}' % text.encode(), True, schema, decode) == (
            {"d": value}, None)
