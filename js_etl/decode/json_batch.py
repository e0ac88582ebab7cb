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

1. every column of the schema is BIGINT, INT, SMALLINT, TINYINT, DOUBLE, STRING or BOOLEAN (the
   types the differential tests cover; FLOAT would round twice in one of the two, timestamps,
   decimals and nested types parse differently);
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

Why n rows then means row i is payload i: no document can span a line break. If one were open
at the end of line i, that line's last character ``}`` closed an inner value (a ``}`` inside a
string cannot be last: a string cannot hold a raw line break, the parser rejects it), and after
an inner value only ``,``, ``}`` or ``]`` may follow — but line i+1 starts with ``{``, an error.
So every line holds its own documents, at least one each (it starts with ``{`` and the batch
parsed), and n of them from n lines means exactly one per line: the whole payload, since it
starts with ``{`` and ends with ``}``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Column types whose values pyarrow reads exactly as the per-payload decoder does (tested).
SUPPORTED_TYPES = (pa.int64(), pa.int32(), pa.int16(), pa.int8(), pa.float64(), pa.string(),
                   pa.bool_())
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
    if not pa.types.is_struct(struct) or not struct.num_fields:
        return False
    fields = [struct.field(i) for i in range(struct.num_fields)]
    return (all(f.type in SUPPORTED_TYPES for f in fields)
            and len({f.name for f in fields}) == len(fields))


def decode_json_batch(data: pa.Array, struct: pa.DataType, *, keep_raw: bool
                      ) -> pa.StructArray | None:
    """The payloads ``data`` (binary) decoded to ``struct``, one row each, every one of them a
    good row; or None when the batch is not provably decoded as the per-payload decoder would
    (module docstring) — then nothing of it is used."""
    n = len(data)
    if not n or not supported(struct) or not _screened(data):
        return None
    import pyarrow.json as pj

    schema = pa.schema([struct.field(i) for i in range(struct.num_fields)])
    try:
        joined = _values(pc.binary_join(
            pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), data), b"\n"))
        # One block, no threads: an executor task already has its core, and one block parses
        # faster than pyarrow's default blocks on its thread pool.
        table = pj.read_json(
            pa.BufferReader(joined),
            read_options=pj.ReadOptions(use_threads=False,
                                        block_size=min(joined.size + 1, 2**31 - 1)),
            parse_options=pj.ParseOptions(explicit_schema=schema,
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
    if any(pc.any(pc.equal(column.view(pa.int64()), _MINUS_ZERO_BITS)).as_py()
           for column in columns if column.type == pa.float64()):
        return None
    return pa.StructArray.from_arrays(columns, fields=list(schema))


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
