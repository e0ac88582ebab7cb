"""The record of a lease or a lock file (js_etl.durable.owner): the flat JSON every js-etl version
writes, read back whole; anything else is an unreadable record, never an exception."""

from __future__ import annotations

import json

from js_etl.durable.owner import LockOwner, ProcessId

# A record as js-etl wrote it before the process fields had their own type.
WRITTEN = {"run_id": "r1", "host": "h", "pid": 42, "started": 1.5, "heartbeat": 2.5,
           "pin_id": None, "boot_id": "b", "pid_namespace": "pid:[1]", "pid_start": 7}


def test_the_record_is_flat_json_and_reads_back_whole():
    owner = LockOwner.from_json(json.dumps(WRITTEN).encode())
    assert owner == LockOwner("r1", ProcessId("h", 42, "b", "pid:[1]", 7), 1.5, 2.5)
    assert json.loads(owner.to_json()) == {**WRITTEN, "target": None, "tables": None}
    me = LockOwner.me("r2", "s3://bucket/table")
    assert LockOwner.from_json(me.to_json()) == me


def test_an_unreadable_record_is_none():
    for data in (None, b"", b"{", b"[1, 2]", b'"text"', b'{"run_id": "r"}',
                 json.dumps({**WRITTEN, "unknown": 1}).encode()):
        assert LockOwner.from_json(data) is None, data
