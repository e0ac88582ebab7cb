"""Unit tests: pure logic, no nats-server and no JVM, so `make test-unit` answers in seconds.

A test here that asks for a server or Spark fixture is refused at collection, so the folder keeps
its promise as it grows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NEEDS_A_SERVER_OR_JVM = {"spark", "nats_server", "nats_options", "js", "stream", "nats_cli",
                         "tls_server", "token_server"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE not in Path(item.path).parents:
            continue
        used = NEEDS_A_SERVER_OR_JVM & set(getattr(item, "fixturenames", ()))
        if used:
            raise pytest.UsageError(f"{item.nodeid} is in tests/unit but uses {sorted(used)}: "
                                    "move it to the folder of the layer it tests")
