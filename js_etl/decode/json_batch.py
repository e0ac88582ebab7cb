"""A whole batch of JSON payloads decoded by one pyarrow parse — only where that provably gives
what the per-payload decoder (:func:`js_etl.decode.arrow.decode_json`) gives, payload
for payload; otherwise :func:`decode_json_batch` returns None and the caller decodes each
payload itself.

Why a proof is needed: pyarrow's JSON reader is not a per-message decoder (pyarrow 26.0.1;
each point pinned by tests/unit/decode/test_json_batch.py):

* it reads *documents* from newline-joined text, not lines: ``{"id":1,"x":`` then ``{"y":1}}``
  on the next line read as **one** row, and ``{"id":1}{"id":2}`` on one line as two. So "n rows
  from n payloads" proves nothing on its own: one merge and one split cancel out, and every
  later row would belong to the wrong message.
* it accepts ``NaN``, ``Inf`` and ``Infinity``, which are not JSON (the decoder rejects them);
* ``read_json(b"null")`` crashes the process (apache/arrow#47409); arrays and other scalars at
  the top level are no objects either;
* an object with none of the schema's fields, or with only ``ID`` for ``id``, reads as a row of
  nulls, where the decoder names the problem (unless ``keep_raw``).

Everything else it does differently fails the whole batch (and the caller falls back): a value
of the wrong JSON type for its column, an integer written ``1.0`` or ``1e2`` or out of range, a
duplicate key, a lone surrogate, a control character in a string, an exponent too big for a
double (``1e400``), a batch too large for one Arrow buffer.

So a batch goes to pyarrow only if, checked over the whole batch at once:

1. every column of the schema is BIGINT, INT, SMALLINT, TINYINT, DOUBLE, STRING, BOOLEAN,
   DATE, TIMESTAMP, TIMESTAMP_NTZ, DECIMAL or a STRUCT of these (the types the differential
   tests cover; FLOAT would round twice in one of the two; arrays and maps are not proven);
2. no payload is null, every one is valid UTF-8 (validated here: a caller's flags are not
   trusted), starts with ``{``, ends with ``}`` and holds no ``\\n`` or ``\\r``;
3. no payload contains ``NaN`` or ``Inf`` anywhere, nor a run of more than 1,000 digits (the
   decoder, like Spark's parser, calls such an integer malformed; pyarrow reads it, as
   ±Infinity into a DOUBLE or silently in a field it ignores) — in fact no run of more than
   333 digits, since Spark's limit counts the digits before and after a number's point and
   its exponent's, so a number of more than 1,000 holds such a run —
   inside strings too: an over-approximation that only sends more payloads the slow way; and
   no payload is longer than :data:`MAX_NAME_LENGTH` bytes (only such a payload can hold a
   field name Spark's parser refuses);
4. no payload holds more than :data:`MAX_BRACKETS` ``{`` and ``[`` together (a bound on its
   depth, far below where Python's parser gives up with "nested too deeply");

and then pyarrow must return exactly n rows, (unless ``keep_raw``) none of them all null, and
no DOUBLE value -0.0: pyarrow reads the integer ``-0`` as -0.0, the decoder as 0.0 (found by
the differential test), and only the decoder tells ``-0`` from ``-0.0`` (checked on the
parsed values: a search for the bytes ``-0`` would cost the screens more).

pyarrow's own readings of the other types are not the decoder's, so those are read as
something pyarrow reads exactly and converted after (:func:`_finish`): a DATE or TIMESTAMP as
its string — the plain ISO form by arithmetic over the whole column, any other form by
:mod:`js_etl.decode.times` one value at a time, and a string neither reads declines the batch;
a DECIMAL at precision 38 (pyarrow refuses a literal that needs rounding to the column's scale,
where the decoder rounds half up: that batch declines) and then cast to the column's precision,
which pyarrow's reader does not check; a STRUCT field by field, unknown fields ignored at every
level, a duplicate key anywhere failing the batch.

Why n rows then means row i is payload i: no document can span a line break. If one were open
at the end of line i, that line's last character ``}`` closed an inner value (a ``}`` inside a
string cannot be last: a string cannot hold a raw line break, the parser rejects it), and after
an inner value only ``,``, ``}`` or ``]`` may follow — but line i+1 starts with ``{``, an error.
So every line holds its own documents, at least one each (it starts with ``{`` and the batch
parsed), and n of them from n lines means exactly one per line: the whole payload, since it
starts with ``{`` and ends with ``}``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from js_etl.decode import times

# Column types whose values pyarrow reads exactly as the per-payload decoder does (tested).
PLAIN_TYPES = (pa.int64(), pa.int32(), pa.int16(), pa.int8(), pa.float64(), pa.string(),
               pa.bool_())
TIMESTAMP = pa.timestamp("us", tz="UTC")
TIMESTAMP_NTZ = pa.timestamp("us")
# The plain forms of a date and a timestamp, read by arithmetic (_instants): ISO 8601 with at
# most microseconds, in UTC where no zone is given (the decoder's session is UTC).
_DAY = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}"
_TIME = r"[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
_DATE_TEXT = _DAY + "$"
_TIMESTAMP_NTZ_TEXT = _DAY + _TIME + "$"
_TIMESTAMP_TEXT = _DAY + _TIME + r"(Z|[+-][0-9]{2}:[0-9]{2})?$"
# A longer integer literal is malformed JSON (js_etl.decode.arrow, as Spark's parser: Jackson's
# maxNumberLength; docs/design/json-decoding.md).
MAX_INTEGER_DIGITS = 1000
MAX_NAME_LENGTH = 50_000  # characters of a field name Spark's parser takes
# Each byte as its class for the digit-run searches: D a digit, . any other byte.
_CLASSES = bytes(ord("D") if b in b"0123456789" else ord(".") for b in range(256))
_MINUS_ZERO_BITS = -(2**63)  # -0.0 as int64 bits: only the sign bit (1 / x is -inf for tiny x too)
MAX_BRACKETS = 256  # Python's parser recurses up to ~1,000 levels (sys.getrecursionlimit())
_LONG_RUN = b"D" * (MAX_INTEGER_DIGITS // 3 + 1)  # in classes: a run of over 333 digits
_STEP = len(_LONG_RUN) // 2  # 167: the sample's stride (_may_hold_long_run)
_SCAN_CHUNK = 1 << 20


def supported(struct: pa.DataType) -> bool:
    """Whether batches of this schema (an Arrow struct type) may be decoded by pyarrow."""
    return pa.types.is_struct(struct) and _readable(struct)


def _readable(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        names = [kind.field(i).name for i in range(kind.num_fields)]
        return (bool(names) and len(set(names)) == len(names)
                and all(_readable(kind.field(i).type) for i in range(kind.num_fields)))
    return (kind in PLAIN_TYPES or kind in _TIMES or pa.types.is_decimal128(kind))


def decode_json_batch(data: pa.Array, struct: pa.DataType, *, keep_raw: bool
                      ) -> pa.StructArray | None:
    """The payloads ``data`` (binary) decoded to ``struct``, one row each, every one of them a
    good row; or None when the batch is not provably decoded as the per-payload decoder would
    (module docstring) — then nothing of it is used."""
    n = len(data)
    if not n or not supported(struct) or not _screened(data):
        return None
    import pyarrow.json as pj

    parsed = _read_as(struct)
    try:
        joined = _values(pc.binary_join(
            pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), data), b"\n"))
        # One block, no threads: an executor task already has its core, and one block parses
        # faster than pyarrow's default blocks on its thread pool.
        table = pj.read_json(
            pa.BufferReader(joined),
            read_options=pj.ReadOptions(use_threads=False,
                                        block_size=min(joined.size + 1, 2**31 - 1)),
            parse_options=pj.ParseOptions(explicit_schema=pa.schema(list(parsed)),
                                          unexpected_field_behavior="ignore"))
    except pa.ArrowException:  # ArrowInvalid: something the decoder must name; ArrowCapacityError:
        return None  # over 2 GiB joined. Either way each payload is decoded by itself.
    if table.num_rows != n:
        return None
    # One block makes one chunk, taken as it is: combine_chunks copies even a single chunk,
    # every byte of a STRING column.
    columns = [c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()
               for c in (table.column(i) for i in range(struct.num_fields))]
    if not keep_raw and _any_all_null(columns):
        return None  # {} is a good row, {"other": 1} is not: only the decoder tells them apart
    finished = [_finish(column, struct.field(i).type) for i, column in enumerate(columns)]
    if any(column is None for column in finished):
        return None
    return pa.StructArray.from_arrays(finished, fields=list(struct))


def _read_as(kind: pa.DataType) -> pa.DataType:
    """The type pyarrow parses a column of ``kind`` into: dates and timestamps as their strings
    (pyarrow's own reading of them is not Spark's), decimals at the widest precision (pyarrow
    does not check the column's; :func:`_finish` does)."""
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _read_as(f.type)) for f in kind])
    if kind in _TIMES:
        return pa.string()
    if pa.types.is_decimal128(kind):
        return pa.decimal128(38, kind.scale)
    return kind


def _finish(column: pa.Array, kind: pa.DataType) -> pa.Array | None:
    """A column as parsed (:func:`_read_as`) made ``kind``, value for value as the decoder reads
    it; None where one value might not be: a DOUBLE -0.0 (pyarrow reads the integer ``-0`` as
    -0.0, the decoder as 0.0, and only the decoder tells ``-0`` from ``-0.0``), a decimal beyond
    the column's precision, a date or timestamp the decoder does not read."""
    if pa.types.is_struct(kind):
        children = [_finish(column.field(i), kind.field(i).type) for i in range(kind.num_fields)]
        if any(child is None for child in children):
            return None
        mask = column.is_null() if column.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)
    if kind == pa.float64():
        minus_zero = pc.any(pc.equal(column.view(pa.int64()), _MINUS_ZERO_BITS)).as_py()
        return None if minus_zero else column
    if pa.types.is_decimal128(kind):
        try:
            return column.cast(kind)  # refuses a value of more digits than the precision
        except pa.ArrowInvalid:
            return None
    if kind in _TIMES:
        plain, read, held = _TIMES[kind]
        return _times(column, plain, read, held, kind)
    return column


# Each time type: its plain form, the decoder's reading of any form, the integer Arrow holds.
_TIMES: dict[pa.DataType, tuple[str, Callable[[str], int | None], pa.DataType]] = {
    pa.date32(): (_DATE_TEXT, times.json_date, pa.int32()),
    TIMESTAMP: (_TIMESTAMP_TEXT, times.json_timestamp, pa.int64()),
    TIMESTAMP_NTZ: (_TIMESTAMP_NTZ_TEXT, times.json_timestamp_ntz, pa.int64()),
}


def _times(text: pa.Array, plain: str, read: Callable[[str], int | None], held: pa.DataType,
           kind: pa.DataType) -> pa.Array | None:
    """Strings read into a DATE or TIMESTAMP as the decoder reads them (``read``,
    :mod:`js_etl.decode.times`): the ones of the plain form ``plain`` (ISO 8601, at most
    microseconds, ``Z`` or an offset) by arithmetic over the whole column, the rest one by one;
    None if ``read`` refuses one."""
    n = len(text)
    values = np.zeros(n, np.int64)
    present = np.asarray(text.is_valid())
    fast = np.flatnonzero(np.asarray(pc.fill_null(pc.match_substring_regex(text, plain), False)))
    if len(fast):
        values[fast], good = _instants(text, fast)
        fast = fast[good]
    slow = np.flatnonzero(present)
    slow = slow[~np.isin(slow, fast, assume_unique=True)]
    for i in slow.tolist():
        value = read(text[i].as_py())
        if value is None:
            return None
        values[i] = value
    return pa.array(values, held, mask=~present).cast(kind)


def _instants(text: pa.Array, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows of the plain form (:func:`_times`): their days (a date) or microseconds (a
    timestamp) since the epoch, and which of them name a real date and time (the others are
    left to :mod:`js_etl.decode.times`, which knows what Java makes of them)."""
    _, offsets, data = text.buffers()
    bounds = np.frombuffer(offsets, np.int32)[text.offset:text.offset + len(text) + 1]
    chars = np.frombuffer(data, np.uint8)
    start, end = bounds[rows].astype(np.int64), bounds[rows + 1].astype(np.int64)

    def number(at: np.ndarray, digits: int) -> np.ndarray:
        value = np.zeros(len(rows), np.int64)
        for k in range(digits):
            value = value * 10 + chars[at + k] - 48
        return value

    year, month, day = number(start, 4), number(start + 5, 2), number(start + 8, 2)
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    month_length = np.where(month == 2, 28 + leap, 30 + ((month + (month > 7)) % 2))
    good = (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_length)
    shifted = year - (month <= 2)  # days from 1970-01-01 to a proleptic Gregorian date
    era = shifted // 400
    of_era = shifted - era * 400
    of_year = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    days = era * 146097 + of_era * 365 + of_era // 4 - of_era // 100 + of_year - 719468
    length = end - start
    if (length == 10).all():
        return days, good
    hour, minute, second = number(start + 11, 2), number(start + 14, 2), number(start + 17, 2)
    zulu = chars[end - 1] == ord("Z")
    offset_sign = chars[np.maximum(end - 6, start)]
    has_offset = (length >= 25) & ((offset_sign == ord("+")) | (offset_sign == ord("-")))
    offset_hours, offset_minutes = number(end - 5, 2), number(end - 2, 2)
    offset = np.where(has_offset, (offset_hours * 3600 + offset_minutes * 60)
                      * np.where(offset_sign == ord("-"), -1, 1), 0)
    fraction = np.maximum(length - 20 - np.where(has_offset, 6, zulu), 0)  # its digits
    micros = np.zeros(len(rows), np.int64)
    for k in range(6):
        digit = chars[np.minimum(start + 20 + k, len(chars) - 1)].astype(np.int64) - 48
        micros += np.where(k < fraction, digit * 10 ** (5 - k), 0)
    good &= (hour <= 23) & (minute <= 59) & (second <= 59)
    good &= ~has_offset | ((offset_hours <= 17) & (offset_minutes <= 59))  # Java's: +-18:00
    seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset
    return seconds * 1_000_000 + micros, good


def _values(array: pa.Array) -> pa.Buffer:
    """The bytes of a binary array's values, back to back: a slice of its data buffer, no copy.
    (For the join's one value, ``array[0]`` copies them, at several times the cost of the join
    itself.) Binary and without nulls (32-bit offsets): what the screens and the join of
    screened payloads have."""
    assert array.type == pa.binary() and not array.null_count, array.type
    _, offsets, values = array.buffers()
    bounds = memoryview(offsets).cast("i")
    start, end = bounds[array.offset], bounds[array.offset + len(array)]
    return values.slice(start, end - start)


def _screened(data: pa.Array) -> bool:
    """Conditions 2-4 of the module docstring, for every payload of the batch.

    Byte searches over the batch's one contiguous payload buffer where a match anywhere
    decides (:func:`_scan`), Arrow's per-payload kernels where the payload matters: Arrow's
    substring kernels over every payload cost many times pyarrow's parse itself
    (docs/design/json-decoding.md)."""
    n = len(data)
    if data.type != pa.binary() or data.null_count:
        return False
    try:
        data.cast(pa.string())  # UTF-8 validation of the whole batch at once
    except pa.ArrowInvalid:
        return False
    if not (pc.all(pc.equal(pc.binary_slice(data, 0, 1), pa.scalar(b"{"))).as_py()
            and pc.all(pc.equal(pc.binary_slice(data, -1), pa.scalar(b"}"))).as_py()):
        return False
    brackets = _scan(memoryview(_values(data)))
    if brackets is None:
        return False
    # Only a payload this long can hold a field name longer than Spark's parser takes.
    if pc.max(pc.binary_length(data)).as_py() > MAX_NAME_LENGTH:
        return False
    # Every payload holds at least one "{" (its first byte), so no payload holds more brackets
    # than the batch's total less n - 1; only above the bound are payloads counted one by one.
    return brackets - (n - 1) <= MAX_BRACKETS or _most_brackets(data) <= MAX_BRACKETS


def _scan(text: memoryview, chunk: int = _SCAN_CHUNK) -> int | None:
    """How many ``{`` and ``[`` ``text`` holds; None if it holds ``NaN``, ``Inf``, a line break
    or a run of more than 333 digits (a number of more than 1,000 digits, counting its
    fraction's and exponent's, holds one).

    A chunk at a time, each read with the next bytes a match starting in it can reach (a run's
    length), its brackets counted over its own bytes only: memchr-speed searches for the words
    and line breaks, a sample for the runs (:func:`_may_hold_long_run`), numpy for the count.
    Chunks, not one copy of the batch: two buffers of the batch's size made fresh for every
    batch cost more in page faults than the work; and no translation of every byte to its
    class, which took several times as long as these searches."""
    size = len(text)
    if not size:
        return 0
    values = np.frombuffer(text, np.uint8)
    folded = np.empty(min(chunk, size), np.uint8)
    flags = np.empty(min(chunk, size), np.bool_)
    brackets = 0
    for start in range(0, size, chunk):
        piece = bytes(text[start:start + chunk + len(_LONG_RUN)])
        if ((b"N" in piece and b"NaN" in piece) or (b"I" in piece and b"Inf" in piece)
                or b"\n" in piece or b"\r" in piece):
            return None
        if _may_hold_long_run(piece) and _LONG_RUN in piece.translate(_CLASSES):
            return None
        own = values[start:start + chunk]
        n = len(own)
        # "{" is 0x7B and "[" 0x5B: with bit 0x20 cleared both are 0x5B, and no other byte is.
        np.bitwise_and(own, 0xDF, out=folded[:n])
        brackets += int(np.count_nonzero(np.equal(folded[:n], 0x5B, out=flags[:n])))
    return brackets


def _most_brackets(data: pa.Array, chunk: int = _SCAN_CHUNK) -> int:
    """The most ``{`` and ``[`` one payload of ``data`` holds, or any count over
    :data:`MAX_BRACKETS` once one is found: the brackets' positions, a chunk of the batch's
    buffer at a time, each assigned to its payload by the payloads' offsets. The count of every
    batch whose payloads nest objects or arrays in fields the schema ignores, so it must cost
    far less than the parse (Arrow's ``count_substring_regex`` cost about as much)."""
    _, offsets, _ = data.buffers()
    bounds = np.frombuffer(offsets, np.int32)[data.offset:data.offset + len(data) + 1]
    starts = bounds[:-1] - bounds[0]
    values = np.frombuffer(_values(data), np.uint8)
    counts = np.zeros(len(data), np.int64)
    for start in range(0, len(values), chunk):
        own = values[start:start + chunk]
        at = np.flatnonzero(np.bitwise_and(own, 0xDF) == 0x5B) + start  # as in _scan
        if len(at):
            owners = np.searchsorted(starts, at, side="right") - 1
            counts += np.bincount(owners, minlength=len(counts))
            if counts.max() > MAX_BRACKETS:
                break
    return int(counts.max())


def _may_hold_long_run(piece: bytes) -> bool:
    """False only if ``piece`` holds no run of over 333 digits. Such a run, from byte a, covers
    the first multiple m of 167 at or after a (m <= a + 166) and m + 167 (<= a + 333), so the
    bytes sampled every 167 show two digits in a row and the 168 bytes from m are all digits:
    one slice of a 167th of the text, and a check of the rare candidates."""
    samples = piece[::_STEP].translate(_CLASSES)
    at = samples.find(b"DD")
    while at >= 0:
        if piece[at * _STEP:(at + 1) * _STEP + 1].isdigit():
            return True
        at = samples.find(b"DD", at + 1)
    return False


def _any_all_null(columns: list[pa.Array]) -> bool:
    nulls = pc.is_null(columns[0])
    for column in columns[1:]:
        nulls = pc.and_(nulls, pc.is_null(column))
    return bool(pc.any(nulls).as_py())
