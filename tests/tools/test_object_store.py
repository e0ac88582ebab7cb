"""The tests' S3-compatible store (tools/object_store.py, SeaweedFS): started on free ports,
and started again on others when a port found free is taken before weed binds it (another
test's server on this box took one in a full run)."""

from __future__ import annotations

import socket
from typing import Any

from tools import object_store
from tools.object_store import LocalS3Server


def test_a_port_taken_before_weed_binds_it_is_replaced(tmp_path: Any, monkeypatch: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        # The eighth port handed out is the S3 gateway's gRPC port (the one seen taken).
        ports = iter([None] * 7 + [taken.getsockname()[1]])
        free = object_store.free_port
        monkeypatch.setattr(object_store, "free_port", lambda: next(ports, None) or free())
        server = LocalS3Server(tmp_path / "s3")
        try:
            server.start()
            assert server._ports["s3.port.grpc"] != taken.getsockname()[1]  # started again
            server.create_bucket("after-a-retry")
            store = server.store("after-a-retry")
            store.put("k", b"v")
            assert bytes(store.get("k").bytes()) == b"v"
        finally:
            server.stop()
