"""The row contract, once: the columns every js-etl row carries (its origin), the raw row a fetch
produces, the rows of a round and of the dead-letter table, and the names js-etl reserves.

Each is spelled here as ``(name, Spark type)`` pairs; the DDL strings Spark takes and the Arrow
schemas the executors and the columnar writer take are made from them. The Arrow ones on first
use: loading a config (an Airflow host, the CLI's checks) does not import pyarrow.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

Columns = tuple[tuple[str, str], ...]

HEADERS_TYPE = "MAP<STRING, ARRAY<STRING>>"
# Every row's origin: where the message came from, in the table's column order.
ORIGIN: Columns = (
    ("subject", "STRING"), ("stream", "STRING"), ("seq", "BIGINT"), ("consumer_seq", "BIGINT"),
    ("num_delivered", "BIGINT"), ("published_at", "TIMESTAMP"), ("headers", HEADERS_TYPE),
)
ORIGIN_COLUMNS = tuple(name for name, _ in ORIGIN)
_TYPES = dict((*ORIGIN, ("data", "BINARY"), ("error", "STRING")))

# A fetched message before decoding. The UTF-8 check is Arrow's, in the fetch: it validates a
# whole batch at memory speed, where the JVM's took an eighth of a round's JVM time at 4 KiB.
RAW: Columns = (*ORIGIN, ("data", "BINARY"), ("data_is_utf8", "BOOLEAN"))
# The dead-letter table's rows: the origin, the raw payload and why it was refused.
DEAD_LETTER_COLUMNS = ("seq", "stream", "subject", "consumer_seq", "num_delivered",
                       "published_at", "headers", "data", "error")
DEAD_LETTER: Columns = tuple((name, _TYPES[name]) for name in DEAD_LETTER_COLUMNS)
# A round's rows as the Spark writer's path takes them: the dead-letter columns and the
# payload's byte count (in the decoder's flagged rows only, never in a table).
PAYLOAD_BYTES = "_js_etl_payload_bytes"
ROUND: Columns = (*DEAD_LETTER, (PAYLOAD_BYTES, "BIGINT"))

# What the fence and the acks read from a table, by name: a table without these columns, of
# these types, is refused before anything is fetched.
ACK_KEY_COLUMNS = ("seq", "num_delivered", "consumer_seq")
REQUIRED_COLUMNS = {name: _TYPES[name].lower()
                    for name in ("stream", "seq", "consumer_seq", "num_delivered")}

# Scratch columns of the JSON decoder (js_etl.decode.spark); a payload field may not take them.
CORRUPT = "_js_etl_corrupt"
VALUES = "_js_etl_values"  # how many JSON values the payload holds (null: not JSON)
KEYS = "_js_etl_keys"  # the payload object's top-level keys (unknown_fields dead_letter)
FIRST = "_js_etl_first"  # the payload's first non-whitespace character
# Column names js-etl writes itself; a JSON field may not take one, in any letter case (Spark
# and Delta resolve column names case-insensitively).
RESERVED_COLUMNS = (*ORIGIN_COLUMNS, "data", "text")


def ddl(columns: Columns) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in columns)


ORIGIN_DDL = ddl(ORIGIN)
RAW_DDL = ddl(RAW)
ROUND_DDL = ddl(ROUND)


def schema_field_problem(names: list[str]) -> str | None:
    """Why these JSON field names cannot be columns next to js-etl's own, or None."""
    reserved = {c.lower(): c for c in (*RESERVED_COLUMNS, CORRUPT, VALUES, KEYS, FIRST,
                                       PAYLOAD_BYTES)}
    clash = sorted({f"{n} (js-etl's {reserved[n.lower()]})" for n in names
                    if n.lower() in reserved})
    if clash:
        return (f"decode.schema field(s) {', '.join(clash)} clash with js-etl's own columns "
                "(names are compared ignoring case); rename them in the schema")
    seen: dict[str, str] = {}
    for name in names:
        if name.lower() in seen:
            return (f"decode.schema fields {seen[name.lower()]!r} and {name!r} differ only in "
                    "case; Spark and Delta would take them for one column: rename one")
        seen[name.lower()] = name
    return None


def arrow(columns: Columns) -> pa.Schema:
    """``columns`` as an Arrow schema (only the Spark types the contract uses)."""
    import pyarrow as pa

    types = {"STRING": pa.string(), "BIGINT": pa.int64(), "BINARY": pa.binary(),
             "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us", tz="UTC"),
             HEADERS_TYPE: pa.map_(pa.string(), pa.list_(pa.string()))}
    return pa.schema([(name, types[kind]) for name, kind in columns])


@cache
def raw_arrow() -> pa.Schema:
    return arrow(RAW)


@cache
def round_arrow() -> pa.Schema:
    return arrow(ROUND)


@cache
def dead_letter_arrow() -> pa.Schema:
    return arrow(DEAD_LETTER)
