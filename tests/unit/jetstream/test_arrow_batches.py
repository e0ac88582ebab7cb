"""The Arrow batch a fetch emits (pure logic, no server, no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from js_etl.errors import TerminalError
from js_etl.jetstream import Deliveries, JsMessage
from js_etl.jetstream.arrow import binary_array, to_record_batch
from js_etl.schema import raw_arrow

PREFIX = "$JS.ACK.ORDERS.drain"


def message(seq: int, data: bytes, headers: bytes | None = None, delivered: int = 1) -> JsMessage:
    ts = 1_700_000_000_123_456_789 + seq
    return JsMessage(f"orders.{seq}", data, f"{PREFIX}.{delivered}.{seq}.{seq + 100}.{ts}.7",
                     headers)


def test_batch_columns_come_from_the_ack_subject_and_the_frame():
    batch = to_record_batch(Deliveries.of([
        message(1, b'{"a":1}', b"NATS/1.0\r\nK: 1\r\nK: 2\r\n\r\n"),
        message(2, b"", delivered=3)]), PREFIX)

    assert batch.schema == raw_arrow()
    rows = batch.to_pylist()
    assert [(r["subject"], r["stream"], r["seq"], r["consumer_seq"], r["num_delivered"])
            for r in rows] == [("orders.1", "ORDERS", 1, 101, 1), ("orders.2", "ORDERS", 2, 102, 3)]
    assert rows[0]["published_at"] == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)
    assert rows[0]["headers"] == [("K", ["1", "2"])] and rows[1]["headers"] is None
    assert [r["data"] for r in rows] == [b'{"a":1}', b""]


@pytest.mark.parametrize("payloads, flags", [
    ([b"plain", "zo\u00eb \u2603".encode(), b""], [True, True, True]),
    ([b"ok", b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf", "\U0001f600".encode()],
     [True, False, False, False, True]),  # stray bytes, an encoded surrogate, an overlong form
])
def test_utf8_flag_per_payload(payloads, flags):
    batch = to_record_batch(Deliveries.of(message(i + 1, p) for i, p in enumerate(payloads)),
                            PREFIX)
    assert batch.column("data_is_utf8").to_pylist() == flags


def test_a_subject_that_is_not_utf8_keeps_its_row():
    # The server takes any bytes but whitespace in a subject; the row and its payload stay.
    deliveries = Deliveries.of([message(1, b"{}"), message(2, b"{}")])
    deliveries.subjects[1] = b"orders.\xff"
    batch = to_record_batch(deliveries, PREFIX)
    assert batch.column("subject").to_pylist() == ["orders.1", "orders.\ufffd"]
    assert batch.column("seq").to_pylist() == [1, 2]
    # The last message's metadata decides whether the fetch pulls again (a break-it review).
    assert deliveries[-1].subject == "orders.\ufffd"
    assert deliveries[-1].metadata.stream_seq == 2


def test_deliveries_are_a_sequence_of_messages():
    messages = [message(1, b"a", b"NATS/1.0\r\nK: 1\r\n\r\n"), message(2, b"b")]
    deliveries = Deliveries.of(messages)
    assert len(deliveries) == 2 and deliveries == messages and deliveries != messages[:1]
    assert deliveries[-1] == messages[1] and deliveries[:1] == messages[:1]
    assert list(deliveries) == messages and Deliveries() == []
    assert Deliveries() != "" and Deliveries() != ()  # a list of messages, not any sequence


def test_foreign_ack_subject_is_refused():
    foreign = JsMessage("orders.1", b"x", "$JS.ACK.OTHER.drain.1.1.1.0.0")
    with pytest.raises(TerminalError, match="does not start with"):
        to_record_batch(Deliveries.of([foreign]), PREFIX)


@pytest.mark.parametrize("values", [[], [b""], [b"", b"a", b""], [b"\xff\x00", "é".encode()],
                                    [bytes(range(256)) * 17, b"{}"], [b"x" * 70_000] * 3])
def test_binary_array_is_pyarrows_conversion(values):  # subjects and ack replies
    import pyarrow as pa

    built = binary_array(values)
    built.validate(full=True)
    assert built.equals(pa.array(values, pa.binary()))
    assert built.to_pylist() == values


@pytest.mark.parametrize("values", [[b""], [b"", b"a", b""], [b"\xff\x00", "é".encode()],
                                    [bytes(range(256)) * 17, b"{}"], [b"x" * 70_000] * 3])
def test_a_pulls_payloads_are_one_arrow_array_over_its_own_buffer(values):
    import pyarrow as pa

    deliveries = Deliveries.of(message(i + 1, v) for i, v in enumerate(values))
    payloads = deliveries.payload_array()
    payloads.validate(full=True)
    assert payloads.equals(pa.array(values, pa.binary()))
    assert deliveries.payloads == values and [m.data for m in deliveries] == values
    # The buffer is Arrow's too now, not a copy: the deliveries take no more messages, not even
    # an empty one, and a refused message leaves no subject behind (a break-it review).
    for late in (b"late", b""):
        with pytest.raises(BufferError):
            deliveries.append(b"orders.9", b"reply", late, None)
    assert payloads.to_pylist() == values and len(deliveries.subjects) == len(values)


def test_payloads_past_what_32_bit_offsets_address_are_refused():
    deliveries = Deliveries.of([message(1, b"x")])
    deliveries._ends[0] = 2**31  # a pull of 2 GiB of payloads, without allocating it
    with pytest.raises(ValueError, match="2 GiB"):
        deliveries.payload_array()
    with pytest.raises(TerminalError, match="lower fetch.max_bytes"):
        to_record_batch(deliveries, PREFIX)
