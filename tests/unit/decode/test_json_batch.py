"""pyarrow's batch JSON decode (js_etl/decode/json_batch.py) against the per-payload decoder
(js_etl/decode/arrow.py): what pyarrow does that makes the screens necessary, hostile
batches kept away from it, and a differential fuzz — whenever the batch path answers, every
row must be exactly what the per-payload decoder makes of that payload. Pure: no JVM."""

from __future__ import annotations

import json
import math
import random
import re
import struct as binary

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pytest

from js_etl.config.model import DecodeConfig
from js_etl.decode import json_batch
from js_etl.decode.arrow import decode_json
from js_etl.decode.json_batch import MAX_BRACKETS, _scan, decode_json_batch, supported

DDL = "id BIGINT, n INT, s SMALLINT, t TINYINT, d DOUBLE, kind STRING, ok BOOLEAN"
FIELDS = ("id", "n", "s", "t", "d", "kind", "ok")


@pytest.fixture(scope="module")
def spark_schema():
    from pyspark.sql import types as T

    return (T.StructType().add("id", T.LongType()).add("n", T.IntegerType())
            .add("s", T.ShortType()).add("t", T.ByteType()).add("d", T.DoubleType())
            .add("kind", T.StringType()).add("ok", T.BooleanType()))


@pytest.fixture(scope="module")
def arrow_type(spark_schema):
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(spark_schema, timezone="UTC")


def batch(*payloads: bytes) -> tuple[pa.Array, pa.Array]:
    def utf8(p: bytes) -> bool:
        try:
            p.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False

    return pa.array(payloads, pa.binary()), pa.array([utf8(p) for p in payloads], pa.bool_())


def fast(arrow_type, *payloads: bytes | None, keep_raw: bool = False) -> list[dict] | None:
    result = decode_json_batch(pa.array(payloads, pa.binary()), arrow_type, keep_raw=keep_raw)
    return None if result is None else result.to_pylist()


# --- why the screens exist: pyarrow's own behaviour, pinned ------------------------------------
def read(*lines: bytes) -> list[dict]:
    schema = pa.schema([("id", pa.int64()), ("d", pa.float64())])
    return pj.read_json(pa.BufferReader(b"\n".join(lines)), parse_options=pj.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="ignore")).to_pylist()


def test_pyarrow_reads_documents_across_lines_and_accepts_nan():
    """If any of these stops holding, the screens may be relaxed; none may be dropped while it
    holds. Two malformed payloads merge into one row, one payload with two objects splits in
    two: 3 payloads, 3 rows, and the rows belong to the wrong messages."""
    assert read(b'{"id":1,"x":', b'{"y":1}}', b'{"id":2}{"id":3}') == [
        {"id": 1, "d": None}, {"id": 2, "d": None}, {"id": 3, "d": None}]
    assert read(b'{"d":NaN}', b'{"d":Inf}', b'{"d":-Infinity}')[1:] == [
        {"id": None, "d": math.inf}, {"id": None, "d": -math.inf}]


# --- hostile batches never reach pyarrow, and mixed batches fall back whole --------------------
HOSTILE = [
    b"null", b"true", b"12", b'"x"', b"[1]", b"[]", b"", b"   ", b"\xff\xfe{}",
    b'{"id":1}\n', b'{\n"id": 1\n}', b'{"id":1}\r', b' {"id":1}', b'{"id":1} ',
    b'{"id":1,"x":', b'{"y":1}}', b'{"id":2}{"id":3}', b'{"id":1} x',
    b'{"d":NaN}', b'{"d":Inf}', b'{"d":-Infinity}', b'{"kind":"NaN"}', b'{"d":-0}',
    b'{"o":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"o":' + b"[" * MAX_BRACKETS + b"]" * MAX_BRACKETS + b"}",
    b'{"id":' + b"9" * 10_000 + b"}", b'{"d":1e400}', b'{"id":9223372036854775808}',
    b'{"id":1.0}', b'{"id":1e2}', b'{"n":2147483648}', b'{"t":128}',
    b'{"kind":1}', b'{"kind":{"a":1}}', b'{"ok":"true"}', b'{"ok":1}',
    b'{"id":1,"id":2}', b'{"kind":"\\ud800"}', b'{"kind":"a\x01b"}',
    b"{'id':1}", b'{"id":1,}', b'{"id":1/*c*/}', b"{}", b'{"other":1}', b'{"ID":5}',
    b'{"id":null}',
]


@pytest.mark.parametrize("payload", HOSTILE)
def test_a_batch_with_a_payload_pyarrow_could_misread_falls_back_whole(arrow_type, payload):
    """Alone or among good payloads, the batch path declines; the per-payload decoder then says
    what each payload is. (``null`` alone would crash the process if it reached pyarrow.)"""
    good = b'{"id":7,"kind":"order"}'
    assert fast(arrow_type, payload) is None
    assert fast(arrow_type, good, payload, good) is None
    assert fast(arrow_type, good, good) == [dict.fromkeys(FIELDS) | {"id": 7, "kind": "order"}] * 2


def test_only_a_negative_zero_double_sends_the_batch_to_the_decoder(arrow_type):
    """pyarrow reads the integer -0 as -0.0 into a DOUBLE, the decoder as 0.0: a parsed -0.0
    declines the batch. A tiny negative double (1 / x overflows to -inf, as for -0.0: a break-it
    review) and -0 into an integer column are read alike by both, and stay on the fast path."""
    assert fast(arrow_type, b'{"d":-0}') is None and fast(arrow_type, b'{"d":-0.0}') is None
    rows = fast(arrow_type, b'{"id":-0,"d":-1e-310}', b'{"d":-5e-324}')
    assert rows is not None and [row["id"] for row in rows] == [0, None]
    assert [math.copysign(1, row["d"]) for row in rows] == [-1, -1]
    assert [row["d"] for row in rows] == [-1e-310, -5e-324]


@pytest.mark.parametrize("payload", [b'{"id":1}\n', b'{"d":NaN}', b'{"d":-0}', b"null",
                                     b'{"o":' + b"[" * 300 + b"]" * 300 + b"}"])
def test_a_slice_of_a_larger_array_is_screened_over_its_own_payloads(arrow_type, payload):
    """Fetched batches can be slices: the screens must read exactly the slice's bytes."""
    good = b'{"id":7}'
    data = pa.array([good, payload, good, good], pa.binary())
    for start, length in ((1, 2), (0, 2), (1, 1)):
        assert decode_json_batch(data.slice(start, length), arrow_type,
                                 keep_raw=False) is None, (start, length)
    rows = decode_json_batch(data.slice(2, 2), arrow_type, keep_raw=False)
    assert rows is not None and rows.to_pylist() == [dict.fromkeys(FIELDS) | {"id": 7}] * 2


def test_what_a_break_it_review_found_is_refused_or_agrees(arrow_type, spark_schema):
    """Found by a helper whose only job was to break this module (2026-11-24): a null payload
    made it raise, a null or wrong UTF-8 flag let invalid UTF-8 through (the flags are no longer
    taken from the caller), duplicate field names made it raise, and an integer literal of over
    4,000 digits in a DOUBLE was inf here but a mismatch in the decoder. Such literals (over
    1,000 digits) are now malformed in the decoder, as in Spark, and refused here."""
    assert fast(arrow_type, b'{"id":1}', None) is None
    assert fast(arrow_type, b'{"id":1,"x":"\xff"}') is None
    assert fast(arrow_type, b'{"kind":"\xff"}') is None
    assert not supported(pa.struct([("d", pa.float64()), ("d", pa.float64())]))
    decode = DecodeConfig(format="json", schema=DDL)
    for digits in (b"1" * 1001, b"-" + b"1" * 4000, b"9" * 100_000):
        for payload in (b'{"d":' + digits + b"}", b'{"id":1,"x":' + digits + b"}"):
            assert decode_json(payload, True, spark_schema, decode) == (None, "malformed JSON")
            assert fast(arrow_type, payload) is None
    # 1,000 digits: a number, -inf. A run of over 333 digits could be a third of a number of over
    # 1,000 digits with a point and an exponent, which Spark's parser refuses: payload by payload.
    payload = b'{"d":-' + b"1" * 1000 + b"}"
    want = decode_json(payload, True, spark_schema, decode)
    assert want[1] is None and want[0]["d"] == -math.inf
    assert fast(arrow_type, payload) is None
    for number in (b"1" * 500 + b"." + b"1" * 501, b"1." + b"1" * 1000,  # 1,001 digits
                   b"1" * 334 + b"." + b"1" * 333 + b"e" + b"0" * 333 + b"1"):  # with its exponent
        payload = b'{"id":1,"x":' + number + b"}"
        assert decode_json(payload, True, spark_schema, decode) == (None, "malformed JSON")
        assert fast(arrow_type, payload) is None
    long_name = b'{"id":1,"' + b"k" * 50_001 + b'":1}'  # Spark's parser takes 50,000
    assert decode_json(long_name, True, spark_schema, decode) == (None, "malformed JSON")
    assert fast(arrow_type, long_name) is None


def test_the_merge_and_split_that_cancel_out_are_refused(arrow_type):
    assert fast(arrow_type, b'{"id":1,"x":', b'{"y":1}}', b'{"id":2}{"id":3}') is None


def test_keep_raw_keeps_rows_without_schema_fields_like_the_decoder(arrow_type, spark_schema):
    decode = DecodeConfig(format="json", schema=DDL, keep_raw=True)
    payloads = (b"{}", b'{"other":1}', b'{"id":null}', b'{"id":3}')
    rows = fast(arrow_type, *payloads, keep_raw=True)
    assert rows == [decode_json(p, True, spark_schema, decode)[0] for p in payloads]


def test_only_schemas_of_the_tested_types_are_supported():
    timestamp = pa.timestamp("us", tz="UTC")
    for kind in (pa.string(), timestamp, pa.timestamp("us"), pa.date32(), pa.decimal128(10, 2),
                 pa.struct([("x", pa.int64()), ("y", pa.struct([("t", timestamp)]))])):
        assert supported(pa.struct([("a", pa.int64()), ("b", kind)])), kind
    for kind in (pa.float32(), pa.timestamp("ms"), pa.list_(pa.string()), pa.binary(),
                 pa.map_(pa.string(), pa.int64()), pa.struct([]),
                 pa.struct([("x", pa.int64()), ("x", pa.string())]),
                 pa.struct([("x", pa.list_(pa.int64()))])):
        assert not supported(pa.struct([("a", pa.int64()), ("b", kind)])), kind
    assert not supported(pa.struct([]))


# --- differential fuzz ------------------------------------------------------------------------
LIMITS = {"id": 63, "n": 31, "s": 15, "t": 7}


def _integer(rng: random.Random, bits: int, hostile: bool) -> str:
    edge = 2 ** bits
    values = [0, 1, -1, edge - 1, -edge, rng.randrange(-edge, edge)]
    return str(rng.choice(values + [edge, -edge - 1, rng.randrange(-2 ** 70, 2 ** 70)] * hostile))


def _double(rng: random.Random, hostile: bool = True) -> str:
    choice = rng.random() if hostile else rng.random() * 0.8
    if choice < 0.4:  # any finite double, as Python writes it (shortest round-trip)
        while True:
            value = binary.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if math.isfinite(value):
                return repr(value)
    if choice < 0.6:  # long decimal strings: correct rounding matters
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
        return (f"{rng.choice(['', '-'])}{digits.lstrip('0') or '0'}."
                f"{''.join(rng.choice('0123456789') for _ in range(rng.randint(1, 25)))}"
                f"e{rng.randint(-330, 310)}")
    if choice < 0.8:  # integers, some beyond 2**53 and beyond int64
        return str(rng.randrange(-2 ** 80, 2 ** 80))
    return rng.choice(["0", "-0", "-0.0", "-0e1", "1E5", "1e+5", "1e-400", "5e-324", "0.1",
                       "2.2250738585072011e-308", "1.7976931348623157e308", "1e400", "1.",
                       "1.7976931348623158e308", "1.7976931348623159e308",
                       str(2 ** 1024 - 2 ** 970), str(2 ** 1024 - 2 ** 970 - 1), ".5", "+1",
                       "01", "1e", "-", "0x10", "1" * 1000, "-" + "1" * 1001])


def _string(rng: random.Random, hostile: bool = True) -> str:
    alphabet = ['a', 'Z', ' ', '"', '\\', '/', '\b', '\f', '\n', '\r', '\t', '\x00', '\x1f',
                'é', '€', '😀', '\u2028', '{', '}', '[', ']', ':', ',', 'n', 'f']
    alphabet += ['I', 'N'] * hostile  # "Inf" and "NaN" inside a string: screened out
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    return json.dumps(text, ensure_ascii=rng.random() < 0.5)


def _value(rng: random.Random, field: str, hostile: bool) -> str:
    if rng.random() < 0.08:
        return "null"
    if hostile and rng.random() < 0.05:  # a value of the wrong JSON type
        return rng.choice(['"x"', "1", "true", "[1]", '{"a":1}', "1.5"])
    if field in LIMITS:
        return (_integer(rng, LIMITS[field], hostile) if not hostile or rng.random() < 0.9
                else _double(rng))
    if field == "d":
        return _double(rng, hostile)
    if field == "kind":
        return _string(rng, hostile)
    return rng.choice(["true", "false"])


def _unknown(rng: random.Random, hostile: bool, depth: int = 0) -> str:
    choice = rng.random()
    if depth > 3 or choice < 0.4:
        return rng.choice(["1", "-2.5e3", '"u"', "null", "false", _string(rng, hostile),
                           _double(rng, hostile)])
    if choice < 0.7:
        return "[" + ",".join(_unknown(rng, hostile, depth + 1)
                              for _ in range(rng.randint(0, 3))) + "]"
    return "{" + ",".join(f'"k{i}":{_unknown(rng, hostile, depth + 1)}'
                          for i in range(rng.randint(0, 3))) + "}"


def _payload(rng: random.Random, hostile: bool) -> bytes:
    """A JSON object of schema fields and unknown ones, written in many ways; ``hostile`` adds
    values of the wrong type or range, literals that are not JSON, duplicate keys and damage."""
    members = [(f, _value(rng, f, hostile)) for f in FIELDS if rng.random() < 0.7]
    members += [(f"x{i}", _unknown(rng, hostile)) for i in range(rng.randint(0, 2))]
    if hostile and rng.random() < 0.1 and members:
        members.append(members[0])  # a duplicate key
    rng.shuffle(members)

    def key(name: str) -> str:  # some keys written with escapes: "\u0069\u0064" is "id"
        return (json.dumps(name) if rng.random() < 0.9 else
                '"' + "".join(f"\\u{ord(c):04x}" for c in name) + '"')

    def space() -> str:
        return rng.choice(["", "", " ", "\t", "  "])

    text = "{" + space() + ("," + space()).join(f"{key(k)}{space()}:{space()}{v}"
                                               for k, v in members) + space() + "}"
    data = text.encode()
    if hostile and rng.random() < 0.3:  # damage: cut, insert or drop a byte
        i = rng.randrange(len(data))
        data = rng.choice([data[:i], data[:i] + bytes([rng.choice(b'{}[]:,"\\\n x9')])
                           + data[i:], data[:i] + data[i + 1:]])
    return data


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return binary.pack("<d", a) == binary.pack("<d", b)  # -0.0 is not 0.0
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("keep_raw", [False, True])
def test_whenever_the_batch_path_answers_it_answers_what_the_decoder_does(
        arrow_type, spark_schema, keep_raw):
    rng = random.Random(20261124 + keep_raw)
    decode = DecodeConfig(format="json", schema=DDL, keep_raw=keep_raw)
    answered = declined = rows = 0
    for _ in range(800):
        hostile = rng.random() < 0.4
        payloads = [_payload(rng, hostile) for _ in range(rng.choice([1, 1, 2, 5, 20]))]
        result = fast(arrow_type, *payloads, keep_raw=keep_raw)
        if result is None:
            declined += 1
            continue
        answered += 1
        for payload, got in zip(payloads, result, strict=True):
            want, error = decode_json(payload, True, spark_schema, decode)
            assert error is None, (payload, error)
            assert want is not None and all(_same(want[f], got[f]) for f in FIELDS), (
                payload, want, got)
            rows += 1
    # Not vacuous: both paths taken, many rows compared.
    assert answered > 300 and declined > 200 and rows > 1_500, (answered, declined, rows)


# --- the same fuzz over dates, timestamps, decimals and nested structs -------------------------
RICH_DDL = ("id BIGINT, ts TIMESTAMP, local TIMESTAMP_NTZ, day DATE, price DECIMAL(18,4), "
            "c STRUCT<id: BIGINT, name: STRING, a: STRUCT<city: STRING, d: DOUBLE>>")


@pytest.fixture(scope="module")
def rich_schema():
    from pyspark.sql import types as T

    address = T.StructType().add("city", T.StringType()).add("d", T.DoubleType())
    customer = (T.StructType().add("id", T.LongType()).add("name", T.StringType())
                .add("a", address))
    return (T.StructType().add("id", T.LongType()).add("ts", T.TimestampType())
            .add("local", T.TimestampNTZType()).add("day", T.DateType())
            .add("price", T.DecimalType(18, 4)).add("c", customer))


def _date(rng: random.Random, hostile: bool) -> str:
    year = rng.choice([rng.randint(0, 9999), 1970, 2000, 1900, 2024, 1582, 0])
    return (f"{year:04d}-{rng.randint(1 - hostile, 12 + hostile):02d}-"
            f"{rng.randint(1 - hostile, 28 + 4 * hostile):02d}")


def _timestamp(rng: random.Random, hostile: bool, zoned: float = 0.7) -> str:
    """Mostly the plain form json_batch reads by arithmetic (``zoned`` of them with a zone),
    some that only the decoder's times module reads, and (hostile) ones nobody reads."""
    if rng.random() < 0.15:
        return rng.choice(["2026-11-28", "2026-11-28T10:00", "2026-11-28T10:00:00.1234567",
                           "2026-11-28T10:00:00+18:00", "2026-11-28T10:00:00 GMT",
                           "2026-11-28T10:00:00UTC", "2026-11-28T10:00:00Europe/Oslo",
                           "+12026-01-01", "2026-1-1 1:2:3"]
                          + ["2026-02-30", "2026-11-28T24:00:00", "x", ""] * hostile)
    text = f"{_date(rng, hostile)}{rng.choice('T T')}" + ":".join(
        f"{rng.randint(0, 23 + 2 * hostile):02d}" for _ in range(3))
    if rng.random() < 0.5:
        text += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 6)))
    zone = rng.random() / zoned
    if zone < 0.4 / 0.7:
        text += "Z"
    elif zone < 1:
        text += f"{rng.choice('+-')}{rng.randint(0, 18):02d}:{rng.choice([0, 30, 45, 59]):02d}"
    return text


def _price(rng: random.Random, hostile: bool) -> str:
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 14)))
    fraction = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 4 + 2 * hostile)))
    number = f"{rng.choice(['', '-'])}{digits.lstrip('0') or '0'}"
    number += f".{fraction}" * bool(fraction)
    choice = rng.random()
    if choice < 0.6:
        return number
    if choice < 0.8:
        return json.dumps(number)  # Spark reads a DECIMAL from a string too
    return rng.choice(["1e2", "1E-4", "-0", "-0.0", "1.0e-4", "100e-6", '"+1.5"', '".5"',
                       '"1."', "99999999999999.9999", "-99999999999999.9999"]
                      + ['"1,234.5"', '" 1"', '""', '"1e-5"', "1e-5", "1e30",
                         "12345678901234567.5", "99999999999999.99995", '"x"'] * hostile)


def _customer(rng: random.Random, hostile: bool, depth: int = 0) -> str:
    members = []
    if rng.random() < 0.7:
        members.append(("id", _integer(rng, 63, hostile)))
    if rng.random() < 0.7:
        members.append(("name", _string(rng, hostile)))
    if depth == 0 and rng.random() < 0.7:
        members.append(("a", _customer(rng, hostile, 1) if rng.random() < 0.9 else "null"))
    if depth == 1:
        members += [("city", _string(rng, hostile))] * (rng.random() < 0.7)
        members += [("d", _double(rng, hostile))] * (rng.random() < 0.7)
    members += [(f"x{i}", _unknown(rng, hostile)) for i in range(rng.randint(0, 2))]
    if hostile and rng.random() < 0.1 and members:
        members.append(members[0])  # a duplicate key, nested
    rng.shuffle(members)
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members) + "}"


def _rich_payload(rng: random.Random, hostile: bool) -> bytes:
    values = {"id": lambda: _integer(rng, 63, hostile),
              "ts": lambda: json.dumps(_timestamp(rng, hostile)),
              "local": lambda: json.dumps(_timestamp(rng, hostile, zoned=0.05)),
              "day": lambda: json.dumps(_date(rng, hostile)),
              "price": lambda: _price(rng, hostile), "c": lambda: _customer(rng, hostile)}
    members = []
    for name, value in values.items():
        if rng.random() < 0.8:
            wrong = hostile and rng.random() < 0.05
            members.append((name, "null" if rng.random() < 0.05 else rng.choice(
                ['"x"', "1", "true", "[1]", '{"a":1}', "1.5"]) if wrong else value()))
    members += [(f"x{i}", _unknown(rng, hostile)) for i in range(rng.randint(0, 2))]
    rng.shuffle(members)
    return ("{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members) + "}").encode()


def _held(kind: pa.DataType) -> pa.DataType:
    """``kind`` with dates and timestamps as the integers they hold: Python's datetime cannot
    hold every year Spark reads ("+12026-01-01")."""
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _held(f.type)) for f in kind])
    return {pa.date32(): pa.int32(), pa.timestamp("us", tz="UTC"): pa.int64(),
            pa.timestamp("us"): pa.int64()}.get(kind, kind)


def _alike(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_alike(a[k], b[k]) for k in a)
    return _same(a, b)


@pytest.mark.parametrize("keep_raw", [False, True])
def test_dates_timestamps_decimals_and_nested_structs_are_read_as_the_decoder_reads_them(
        rich_schema, keep_raw):
    from pyspark.sql.pandas.types import to_arrow_type

    kind = to_arrow_type(rich_schema, timezone="UTC")
    rng = random.Random(20261128 + keep_raw)
    decode = DecodeConfig(format="json", schema=RICH_DDL, keep_raw=keep_raw)
    answered = declined = rows = 0
    for _ in range(300):
        hostile = rng.random() < 0.3
        payloads = [_rich_payload(rng, hostile) for _ in range(rng.choice([1, 2, 5, 20]))]
        result = decode_json_batch(pa.array(payloads, pa.binary()), kind, keep_raw=keep_raw)
        if result is None:
            declined += 1
            continue
        answered += 1
        decoded = [decode_json(payload, True, rich_schema, decode) for payload in payloads]
        assert all(error is None for _, error in decoded), [
            (p, e) for p, (_, e) in zip(payloads, decoded, strict=True) if e]
        # The decoder's rows as Arrow holds them (days, microseconds, Decimals): the same array
        # the data source would build from them.
        want = pa.array([row for row, _ in decoded], kind).cast(_held(kind)).to_pylist()
        got_rows = result.cast(_held(kind)).to_pylist()
        for payload, w, got in zip(payloads, want, got_rows, strict=True):
            assert _alike(w, got), (payload, w, got)
            rows += 1
    assert answered > 100 and declined > 50 and rows > 300, (answered, declined, rows)


def test_timestamps_in_the_plain_form_are_read_by_arithmetic_as_the_times_module_reads_them():
    """json_batch._instants against js_etl.decode.times, value by value, on 50,000 strings of
    the plain form with fields in and out of range; a value it calls not good goes to times."""
    import numpy as np

    from js_etl.decode import times

    rng = random.Random(7)
    texts = [_timestamp(rng, hostile=True) for _ in range(25_000)]
    texts += [_date(rng, hostile=True) for _ in range(25_000)]
    data = pa.array(texts, pa.string())
    checked = 0
    for plain, read in ((json_batch._TIMESTAMP_TEXT, times.json_timestamp),
                        (json_batch._TIMESTAMP_NTZ_TEXT, times.json_timestamp_ntz),
                        (json_batch._DATE_TEXT, times.json_date)):
        rows = np.flatnonzero(np.asarray(pc.match_substring_regex(data, plain)))
        values, good = json_batch._instants(data, rows)
        for row, value in zip(rows[good], values[good], strict=True):
            assert value == read(texts[row]), texts[row]
            checked += 1
        assert all(read(texts[row]) is None for row in rows[~good][:2000] if
                   texts[row][11:13] in ("24", "25") or texts[row][5:7] in ("00", "13"))
    assert checked > 35_000, checked


# --- the data source's decoder: the same record batch whichever path decodes it -------------
def test_the_data_sources_batches_are_the_same_whichever_path_decodes_them(
        spark_schema, monkeypatch):
    from js_etl.decode import arrow as source_decode
    from js_etl.schema import raw_arrow

    payloads = [b'{"id":%d,"kind":"k\\u00e9%d","d":%d.5,"ok":true,"x":{"y":[1]}}' % (i, i, i)
                for i in range(50)]
    data, utf8 = batch(*payloads)
    n = len(payloads)
    raw = pa.RecordBatch.from_arrays(
        [pa.array(["s"] * n), pa.array(["S"] * n), pa.array(range(1, n + 1), pa.int64()),
         pa.array(range(1, n + 1), pa.int64()), pa.array([1] * n, pa.int64()),
         pa.array([0] * n, pa.timestamp("us", tz="UTC")),
         pa.nulls(n, raw_arrow().field("headers").type), data, utf8], schema=raw_arrow())
    taken = []

    def spy(*args, **kw):
        taken.append(decode_json_batch(*args, **kw))
        return taken[-1]

    for keep_raw in (False, True):
        decoder = source_decode.BatchDecoder.of(
            DecodeConfig(format="json", schema=DDL, keep_raw=keep_raw), spark_schema.json())
        monkeypatch.setattr(source_decode, "decode_json_batch", spy)
        columnar = decoder(raw)
        monkeypatch.setattr(source_decode, "decode_json_batch", lambda *a, **k: None)
        per_payload = decoder(raw)
        assert taken[-1] is not None  # the batch path did decode it
        assert columnar.equals(per_payload), (columnar.to_pylist()[:2], per_payload.to_pylist()[:2])
        assert columnar.column("error").null_count == n


def _scan_whole(text: bytes) -> int | None:
    """_scan's answer from the whole text at once, the obvious way."""
    if b"NaN" in text or b"Inf" in text or b"\n" in text or b"\r" in text:
        return None
    if re.search(rb"[0-9]{334}", text):
        return None
    return text.count(b"{") + text.count(b"[")


@pytest.mark.parametrize("seed", range(8))
def test_the_chunked_scan_answers_as_the_whole_text_would(seed):
    """Matches straddling a chunk's end are found (each chunk is read with the bytes a match
    starting in it reaches) and no bracket is counted twice."""
    rng = random.Random(seed)
    parts = [b"{", b"[", b"x", b"N", b"a", b"NaN", b"Inf", b"In", b"\n", b"\r", b"7",
             b"9" * 100, b"9" * 166, b"9" * 167, b"9" * 168, b"9" * 333, b'"', b"}", b"\xdb",
             b"\xfb", b"{" * 3]
    for _ in range(200):
        text = b"".join(rng.choice(parts) for _ in range(rng.randrange(0, 60)))
        for chunk in (1, 2, 3, 7, 64, 167, 168, 1000):
            assert _scan(memoryview(text), chunk) == _scan_whole(text), (text, chunk)


@pytest.mark.parametrize("seed", range(8))
def test_the_most_brackets_of_a_payload_are_counted_as_one_by_one(seed):
    """json_batch._most_brackets against each payload's own count, for slices of random batches
    and chunks that cut payloads anywhere; above MAX_BRACKETS only "more" matters."""
    rng = random.Random(seed)
    parts = [b"{", b"[", b"]", b"}", b"x", b"\xdb", b"\xfb", b"{" * 50, b"[" * 120]
    for _ in range(100):
        payloads = [b"{" + b"".join(rng.choice(parts) for _ in range(rng.randrange(0, 8)))
                    for _ in range(rng.randrange(1, 12))]
        data = pa.array([b"{pad", *payloads, b"[[["], pa.binary()).slice(1, len(payloads))
        expected = max(p.count(b"{") + p.count(b"[") for p in payloads)
        for chunk in (1, 3, 64, 1 << 20):
            most = json_batch._most_brackets(data, chunk)
            if expected <= MAX_BRACKETS:
                assert most == expected, (payloads, chunk)
            else:
                assert most > MAX_BRACKETS, (payloads, chunk)


def test_every_run_of_over_333_digits_is_found_wherever_it_starts():
    # The runs are found from a sample every 167 bytes: every run length and offset around it.
    for length in (166, 167, 168, 332, 333, 334, 335, 500, 501, 502, 1001):
        for offset in range(0, 2 * 168):
            text = b"{" + b"x" * offset + b"1" * length + b"x}"
            assert _scan(memoryview(text)) == (None if length > 333 else 1), (length, offset)


def test_a_long_run_or_a_word_across_the_real_chunk_boundary_is_found():
    chunk = 1 << 20
    for tail, expected in ((b"9" * 334, None), (b"9" * 333, 0), (b"NaN", None),
                           (b"Inf", None), (b"\n", None)):
        for before in range(len(tail) + 1):  # the boundary at every byte of the tail
            text = b"x" * (chunk - before) + tail + b"x" * 10
            assert _scan(memoryview(text)) == expected, (tail[:3], before)
    assert _scan(memoryview(b"{" * (chunk + 5))) == chunk + 5


def test_the_joined_payloads_are_the_join_without_a_copy():
    """decode_json_batch parses the join's own buffer (json_batch._values), not a copy."""
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, 2], pa.int32()),
                                                     pa.array([b'{"a":1}', b'{"a":2}'])), b"\n")
    assert json_batch._values(joined).to_pybytes() == b'{"a":1}\n{"a":2}'
    assert json_batch._values(joined).address == joined.buffers()[2].address
    values = pa.array([b"x", b"abc", b"de"], pa.binary())
    assert json_batch._values(values.slice(1, 1)).to_pybytes() == b"abc"
    assert json_batch._values(values.slice(1)).to_pybytes() == b"abcde"  # what _screened scans
