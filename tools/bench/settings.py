"""What a bench run measures: its workloads, schemas and payloads, table targets, fixed
parameters and ratio targets."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_WORKLOADS = ((1_000_000, 256), (200_000, 4096))
QUICK_WORKLOADS = ((20_000, 256), (5_000, 4096))
# --cluster: one workload, a few minutes for 1,2,4 executors on the shared 2-core box.
CLUSTER_MESSAGES, CLUSTER_SIZE = 20_000, 1024
MEMORY_N, QUICK_MEMORY_N, MEMORY_SIZE = 1_000_000, 20_000, 256
MEMORY_TARGET = 1.10  # peak RSS at 4×N within 10% of N
WARMUP_MESSAGES = 2_000
# decode.schema of js-etl's leg per --schema; the simple peer declares the same as Arrow types
# (tools.bench.legs.peer_arrow_schema). "rich" adds a timestamp, a decimal and a nested struct.
SCHEMAS = {
    "flat": "id BIGINT, kind STRING, amount DOUBLE, pad STRING",
    "rich": "id BIGINT, kind STRING, amount DOUBLE, pad STRING, ts TIMESTAMP, "
            "price DECIMAL(18,4), customer STRUCT<id: BIGINT, name: STRING, "
            "address: STRUCT<city: STRING, zip: STRING>>",
}
# The rich columns every row of a rich table must have filled (none null): the verifier counts them.
RICH_FILLED = ("ts", "price", "customer.address.city")
TARGETS = ("local", "s3")
PARTITION_BY = "to_date(published_at) AS date"
KINDS = (b"order", b"refund", b"payment", b"shipment")
CITIES = (b"Oslo", b"Lisbon", b"Osaka", b"Quito")
RICH_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z: message i's ts is i milliseconds later
ACK_WAIT = 300.0  # seconds, every bench consumer
JS_ETL_MAX_ACK_PENDING = 1_000_000
# docs/reference/jetstream-wire-facts.md §12: 57-60k msg/s at 256 B, 13-17k at 4 KiB
PEER_BATCH = 5_000
PEER_MAX_BYTES = 32 << 20  # 5,000 x 4 KiB fits in one pull, well under the 64 MiB slow-consumer cut
# js-etl / simple peer: messages per second, and messages per CPU-second of its own processes.
PEER_TARGET = 1.2
PEER_CPU_TARGET = 1.0
SAMPLE_SECONDS = 0.2
MiB = 1 << 20

LEG_LABELS = {"client_limit": "client limit", "simple_peer": "simple peer", "js_etl": "js-etl",
              "js_etl_connect": "js-etl Connect", "js_etl_stream": "js-etl stream",
              "nats_py_fetch": "nats-py fetch"}
# The legs a run has unless --legs says otherwise; nats_py_fetch and js_etl_stream are only run
# when asked for.
DEFAULT_LEGS = ("client_limit", "simple_peer", "js_etl", "js_etl_connect")


def client_target(size: int) -> float:
    """js-etl / client-limit target: 0.6 for small messages (256 B), 0.8 for large (4 KiB)."""
    return 0.6 if size < 2048 else 0.8


def payload(i: int, size: int, pad: bytes, schema: str = "flat") -> bytes:
    """A JSON object of exactly ``size`` bytes (or its minimum: ~60 B flat, ~220 B rich) that
    fills every field of ``SCHEMAS[schema]``; ``pad`` comes last and takes up the rest."""
    head = b'{"id":%d,"kind":"%s","amount":%d.%02d,' % (
        i, KINDS[i % len(KINDS)], i % 1000, i % 100)
    if schema == "rich":
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(RICH_EPOCH + i // 1000)).encode()
        head += (b'"ts":"%s.%03dZ","price":%d.%04d,"customer":{"id":%d,"name":"customer-%d",'
                 b'"address":{"city":"%s","zip":"%05d"}},') % (
            ts, i % 1000, i % 1_000_000, i % 10_000, i % 10_007, i % 10_007,
            CITIES[i % len(CITIES)], i % 100_000)
    head += b'"pad":"'
    return head + pad[:max(size - len(head) - 2, 0)] + b'"}'


def expected_ids(n: int) -> tuple[int, int]:
    return 0, n - 1


@dataclass
class Settings:
    """One ``js-etl bench`` run, as its arguments set it."""

    workloads: list[tuple[int, int]]
    overrides: list[str]  # user --set, applied to the js-etl drain config
    partitions: tuple[int, ...] | None  # fetch.partitions, each in turn (None: the config's)
    peer_batch: int
    warmup: bool
    workdir: Path
    keep: bool
    memory_check: bool
    memory_n: int
    memory_size: int
    legs: tuple[str, ...] = DEFAULT_LEGS
    repeat: int = 1
    memory_warmup: bool = True
    targets: tuple[str, ...] = ("local",)  # where the tables go: local directories, or S3
    schemas: tuple[str, ...] = ("flat",)  # keys of SCHEMAS
