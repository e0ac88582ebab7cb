"""Stream helpers shared by the drain and backfill tests."""

from __future__ import annotations

from typing import Any

from js_etl.dev.publish import publish, wait_for_messages
from js_etl.jetstream import JetStreamSession


def add_stream(js: JetStreamSession, names: Any) -> None:
    js.run(js.admin.add_stream(names.stream, [names.subject]))


def publish_and_wait(js: JetStreamSession, names: Any, messages: list[Any]) -> None:
    before = js.stream_info(names.stream).state.last_seq
    js.run(publish(js.conn, messages))
    js.run(wait_for_messages(js.conn, names.stream, before + len(messages)))


def purge_stream(js: JetStreamSession, name: str, *, keep: int | None = None) -> None:
    js.run(js.conn.request(f"STREAM.PURGE.{name}", {"keep": keep} if keep is not None else None))
