"""Hostile payloads and the dead-letter reason each must get (None: a good row), shared by the
decoder tests and the columnar writer's comparison with Spark's writer."""

from __future__ import annotations

PAYLOAD_SCHEMA = "id BIGINT, kind STRING"


TRAILING = "data after the JSON value: a payload must be exactly one JSON value"


ARRAY = "payload is a JSON array: decode.schema describes one JSON object per message"


OBJECT_ONLY = "not an object: decode.schema describes one JSON object per message"


# payload -> the dead-letter reason (None: a good row).
PAYLOADS: dict[bytes, str | None] = {
    b'{"id": 1, "kind": "k"}': None,
    b' {"id": 2}\r\n': None,  # JSON whitespace around the value is fine
    b'{"id": 3, "extra": [1, 2]}': None,  # fields the schema does not name: see below
    b'{"id": null}': None,
    b"{}": None,
    b'{"id":7}garbage': TRAILING,
    b'{"id":8}\n{"id":9}': TRAILING,  # two objects, one per line: the second was lost and acked
    b'{"id":10}/* comment */': TRAILING,
    b'{"id":11}]': TRAILING,  # closes the [ ] the check wraps it in
    b'{"id":12},{"id":13}': ("payload holds 2 JSON values: a payload must be exactly one JSON "
                             "value"),
    b'[{"id":14},{"id":15}]': ARRAY,
    b"[]": ARRAY,
    b"7": f"payload is a JSON number, {OBJECT_ONLY}",
    b'"text"': f"payload is a JSON string, {OBJECT_ONLY}",
    b"true": f"payload is a JSON boolean, {OBJECT_ONLY}",
    b"null": f"payload is a JSON null, {OBJECT_ONLY}",
    b"   ": "payload is only whitespace: no JSON value",
    b"\n\t": "payload is only whitespace: no JSON value",
    b"plain text": "payload is not JSON",
    # Text that starts like a JSON scalar is text too: only what starts like an object or an
    # array (and breaks) is malformed JSON.
    b"false alarm": "payload is not JSON",
    b"7 apples": "payload is not JSON",
    b'"unterminated': "payload is not JSON",
    b"[1, 2": "malformed JSON",
    b'{"id": 16': "malformed JSON",
    b"{'id': 17}": "malformed JSON",  # single quotes: Spark's parser takes them by default
    b'{"id": NaN}': "malformed JSON",
    # Spark's parser refuses an integer literal of over 1,000 digits, even in a field the schema
    # does not name (the data source's decoder applies the same limit: js_etl/decode/arrow.py).
    b'{"id": 19, "x": ' + b"9" * 1_001 + b"}": "malformed JSON",
    b'{"id": 20, "x": ' + b"9" * 1_000 + b"}": None,
    b'{"id": "x"}': f"JSON does not match decode.schema ({PAYLOAD_SCHEMA})",
    b'{"foo": 1}': ("JSON object has none of decode.schema's fields (it has: foo); fix "
                    "decode.schema, or set decode.keep_raw to keep such payloads in the row"),
    b'{"ID": 18}': ("JSON object has none of decode.schema's fields (it has: ID); fix "
                    "decode.schema, or set decode.keep_raw to keep such payloads in the row"),
    b"": "empty payload",
    b"\xff\xfe": "payload is not valid UTF-8",
}
