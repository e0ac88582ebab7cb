"""js-etl's frame parser (``jetstream.client._FrameParser``) hands over exactly what nats-py's
own parser does: the same frames, in the same order, with the same control callbacks between
them, however the wire is split into reads."""

from __future__ import annotations

import asyncio
import json
import random
from functools import partial
from typing import Any

import pytest
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from js_etl.jetstream.client import _FrameParser

RAW_SIDS = (1, 2)  # the pulls' inboxes; sid 9 is an ordinary nats-py subscription


class _Recorder:
    """Stands in for the client: records frames (through a raw sink or ``_process_msg``) and
    the control callbacks, in the order the parser makes them."""

    def __init__(self, raw_sids: tuple[int, ...]) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.raw_sinks = {sid: partial(self._frame, sid) for sid in raw_sids}

    def _frame(self, sid: int, subject: bytes, reply: bytes, data: bytes | memoryview,
               headers: bytes | None) -> None:
        self.events.append(("frame", sid, bytes(subject), bytes(reply), bytes(data),
                            None if headers is None else bytes(headers)))

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        self._frame(sid, subject, reply, data, headers)

    async def _process_ping(self) -> None:
        self.events.append(("ping",))

    async def _process_pong(self) -> None:
        self.events.append(("pong",))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.events.append(("info", info))

    async def _process_err(self, message: str) -> None:
        self.events.append(("err", message))


def _frame(rng: random.Random) -> bytes:
    sid = rng.choice((*RAW_SIDS, 9))
    payload = rng.choice([b"", b"MSG a 1 5\r\n", b"\r\n", rng.randbytes(rng.randint(0, 300))])
    reply = rng.choice([b"", b"$JS.ACK.S.c.1.7.7.1764000000000000000.0"])
    kind = rng.randrange(8)
    if kind < 4:
        return b"MSG s.%d %d %s%s%d\r\n%s\r\n" % (
            sid, sid, reply, b" " if reply else b"", len(payload), payload)
    if kind < 6:
        headers = rng.choice([b"NATS/1.0\r\nA: 1\r\nA: 2\r\n\r\n",
                              b"NATS/1.0 404 No Messages\r\n\r\n"])
        return b"HMSG s.%d %d %s%s%d %d\r\n%s%s\r\n" % (
            sid, sid, reply, b" " if reply else b"", len(headers), len(headers) + len(payload),
            headers, payload)
    return rng.choice([b"PING\r\n", b"PONG\r\n", b"+OK\r\n",
                       b"INFO " + json.dumps({"server_id": "x", "n": 1}).encode() + b"\r\n",
                       b"MSG " + b"s" * 5000 + b" 1 2\r\nhi\r\n"])  # a line over 4 KiB


def _feed(parser_class: type[Parser], raw_sids: tuple[int, ...], reads: list[bytes]
          ) -> list[tuple[Any, ...]]:
    recorder = _Recorder(raw_sids)
    parser = parser_class(recorder)

    async def run() -> None:
        for read in reads:
            await parser.parse(read)

    asyncio.run(run())
    assert not parser.buf, "every frame was complete"
    return recorder.events


def _split(wire: bytes, rng: random.Random, largest: int) -> list[bytes]:
    reads, pos = [], 0
    while pos < len(wire):
        step = rng.randint(1, largest)
        reads.append(wire[pos:pos + step])
        pos += step
    return reads


@pytest.mark.parametrize("seed", range(30))
def test_frames_and_callbacks_are_those_of_nats_py_whatever_the_reads(seed: int) -> None:
    rng = random.Random(seed)
    wire = b"".join(_frame(rng) for _ in range(rng.randint(1, 60)))
    expected = _feed(Parser, (), [wire])
    for largest in (1, 7, 300, 32768):
        reads = _split(wire, rng, largest)
        assert _feed(_FrameParser, RAW_SIDS, reads) == expected, (seed, largest)


def test_a_frame_is_handed_over_once_even_when_its_sink_raises() -> None:
    recorder = _Recorder(RAW_SIDS)
    seen: list[bytes] = []

    def sink(subject: bytes, reply: bytes, data: bytes | memoryview, headers: bytes | None
             ) -> None:
        seen.append(bytes(data))  # a view of the read buffer, valid during the call (FrameSink)
        if data == b"two":  # the traceback keeps this frame, and so the view, alive
            raise RuntimeError("sink failed")

    recorder.raw_sinks[1] = sink
    parser = _FrameParser(recorder)
    wire = b"".join(b"MSG s 1 %d\r\n%s\r\n" % (len(p), p) for p in (b"one", b"two", b"three"))

    async def run() -> None:
        with pytest.raises(RuntimeError):
            await parser.parse(wire)
        await parser.parse(b"")

    asyncio.run(run())
    assert seen == [b"one", b"two", b"three"]
    assert not parser.buf


def test_a_view_a_sink_keeps_fails_loudly_and_the_buffer_is_still_trimmed() -> None:
    recorder = _Recorder(RAW_SIDS)
    kept: list[Any] = []
    recorder.raw_sinks[1] = lambda subject, reply, data, headers: kept.append(data)
    parser = _FrameParser(recorder)
    asyncio.run(parser.parse(b"MSG s 1 3\r\none\r\nMSG s 1 3\r\ntwo\r\n"))
    assert not parser.buf and len(kept) == 2
    with pytest.raises(ValueError, match="released"):
        bytes(kept[0])


def test_a_reset_parser_reads_the_new_connection_from_its_first_byte() -> None:
    """A connection lost while a sink raised: nothing of the next connection's buffer may count
    as handed over already (a break-it review: its first bytes were skipped)."""
    recorder = _Recorder(RAW_SIDS)

    def failing(subject: bytes, reply: bytes, data: Any, headers: Any) -> None:
        raise RuntimeError("sink failed")

    recorder.raw_sinks[2] = failing
    parser = _FrameParser(recorder)

    async def run() -> None:
        with pytest.raises(RuntimeError):
            await parser.parse(b"MSG s 1 3\r\none\r\nMSG s 2 3\r\nbad\r\nMSG s 1 1\r\nx\r\n")
        parser.reset()  # what nats-py does on a reconnect
        await parser.parse(b"PING\r\nMSG s 1 5\r\nthree\r\n")

    asyncio.run(run())
    assert recorder.events == [("frame", 1, b"s", b"", b"one", None), ("ping",),
                               ("frame", 1, b"s", b"", b"three", None)]
    assert not parser.buf


@pytest.mark.parametrize("line", [b"MSG s x 2\r\nhi\r\n", b"MSG s 1 -2\r\nhi\r\n",
                                  b"BOGUS\r\n", b" MSG s 1 2\r\nhi\r\n",
                                  b"MSG s 1 2 \r\nhi\r\n"])
def test_a_malformed_frame_is_the_protocol_error_nats_py_raises(line: bytes) -> None:
    for parser_class in (Parser, _FrameParser):
        with pytest.raises(ProtocolError):
            _feed(parser_class, RAW_SIDS, [b"MSG s 1 2\r\nok\r\n" + line])
