"""What a drain needs from its durable pull consumer, and the ``nats`` CLI commands that get it.

* the consumer a drain creates (:func:`desired_consumer`, :data:`DEFAULT_ACK_WAIT`,
  :data:`DEFAULT_MAX_ACK_PENDING`), or checks when it exists (:func:`ensure_drain_consumer`,
  :func:`drain_consumer_problems`, :func:`min_ack_wait`, :func:`check_priority_settings`);
* each refusal carries the ``nats`` CLI command (v0.5) that fixes it, runnable as printed without
  a terminal (``tests/durable/test_natscli_commands.py`` runs them).

A server-side ``max_deliver`` is refused: see :func:`drain_consumer_problems`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from js_etl.durable.cursor import MARK, marked
from js_etl.errors import ConfigError
from js_etl.jetstream.api import AckPolicy, ConsumerConfig, ConsumerInfo, PriorityPolicy, StreamInfo
from js_etl.jetstream.errors import ConsumerConfigError, ConsumerNotFoundError, StreamNotFoundError

if TYPE_CHECKING:
    from js_etl.config import JobConfig
    from js_etl.jetstream.admin import JetStreamAdmin
    from js_etl.jetstream.sync import JetStreamSession

DEFAULT_ACK_WAIT = 300.0  # seconds, for consumers js-etl creates
DEFAULT_MAX_ACK_PENDING = 100_000  # for consumers js-etl creates: the round size ceiling


def min_ack_wait(config: JobConfig) -> float:
    """The shortest ack_wait a drain accepts: a round's pulls are sent within a third of
    ack_wait and each ends within fetch.pull_timeout, so every delivery of a round is received
    within two thirds of ack_wait (see :mod:`js_etl.drain.run`)."""
    return 3 * config.fetch.pull_timeout


def desired_consumer(config: JobConfig) -> ConsumerConfig:
    """The durable consumer a drain creates when ``source.create_consumer`` allows it."""
    # No server-side max_deliver: see drain_consumer_problems.
    s = config.source
    return ConsumerConfig(
        durable_name=s.consumer, ack_wait=s.ack_wait or DEFAULT_ACK_WAIT,
        max_ack_pending=s.max_ack_pending or DEFAULT_MAX_ACK_PENDING,
        filter_subjects=tuple(s.filter_subjects), description="js-etl drain into Delta")


async def ensure_drain_consumer(admin: JetStreamAdmin, stream: str, desired: ConsumerConfig, *,
                                create: bool, min_ack_wait: float) -> ConsumerInfo:
    """The durable pull consumer a drain uses: checked if it exists, else created.

    Raises ConsumerNotFoundError (with the fix) when it is missing and ``create`` is off, and
    ConsumerConfigError when an existing one cannot serve a drain.
    """
    name = desired.durable_name or ""
    ack_wait = max(desired.ack_wait or 0.0, min_ack_wait)
    try:
        info = await admin.consumer_info(stream, name)
    except ConsumerNotFoundError as e:
        if not create:
            command = consumer_add_command(stream, name, replace(desired, ack_wait=ack_wait))
            raise ConsumerNotFoundError(
                f"consumer {name!r} not found on stream {stream!r}: create it (set "
                f"source.create_consumer: true, or run `{command}`)",
                code=e.code or 404, err_code=e.err_code or 10014) from None
        info = await admin.create_consumer(stream, replace(desired, ack_wait=ack_wait))
    problems = drain_consumer_problems(info.config, min_ack_wait=min_ack_wait, stream=stream,
                                       consumer=name)
    if problems:
        raise ConsumerConfigError(f"consumer {stream}/{name} cannot be drained: "
                                  + "; ".join(problems))
    return info


def drainable_consumer(js: JetStreamSession, config: JobConfig
                       ) -> tuple[ConsumerInfo, PriorityPolicy | None]:
    """The job's consumer, checked (or created, ``source.create_consumer``) as a drain needs
    it, and the policy of its priority group."""
    source = config.source
    info = js.run(ensure_drain_consumer(js.admin, source.stream, desired_consumer(config),
                                        create=source.create_consumer,
                                        min_ack_wait=min_ack_wait(config)))
    return info, check_priority_settings(config, info)


def consumer_add_command(stream: str, name: str, config: ConsumerConfig, *,
                         start_seq: int | None = None) -> str:
    """The ``nats`` CLI command (v0.5) that creates the durable pull consumer ``config``
    describes, starting at ``start_seq`` when given (else the stream's start).
    ``--defaults`` lets it run without a terminal (without it the CLI prompts, and fails)."""
    parts = ["nats consumer add", stream, name, "--pull"]
    if start_seq is not None:
        parts.append(f"--deliver {start_seq}")
    parts.append("--ack explicit")
    if config.ack_wait:
        parts.append(f"--wait {config.ack_wait:g}s")
    if config.max_ack_pending:
        parts.append(f"--max-pending {config.max_ack_pending}")
    if start_seq is not None:
        parts.append("--replay instant")
    if config.max_deliver and config.max_deliver > 0:
        parts.append(f"--max-deliver {config.max_deliver}")
    parts += [f"--filter {subject}" for subject in config.filter_subjects]
    parts.append("--defaults")
    return " ".join(parts)


def consumer_add_command_at(stream: str, consumer: str, start_seq: int,
                            existing: ConsumerConfig | None, config: JobConfig) -> str:
    """The ``nats`` CLI command creating the drain's consumer to start at ``start_seq``, with
    the settings it has (``existing``), else those a drain would give it."""
    desired = desired_consumer(config)
    if existing is not None:
        desired = replace(desired, ack_wait=existing.ack_wait or desired.ack_wait,
                          max_ack_pending=existing.max_ack_pending or desired.max_ack_pending,
                          max_deliver=existing.max_deliver,
                          filter_subjects=existing.filter_subjects or desired.filter_subjects)
    return consumer_add_command(stream, consumer, desired, start_seq=start_seq)


def drain_consumer_problems(config: ConsumerConfig, *, min_ack_wait: float,
                            stream: str = "STREAM", consumer: str = "CONSUMER") -> list[str]:
    """What keeps an existing consumer from serving an ack-after-commit drain, each with the
    ``nats`` CLI command that fixes it (v0.5; each runs as printed, without a terminal)."""
    problems = []
    replacement = (f"`nats consumer add {stream} {consumer}_pull --pull --ack explicit "
                   "--defaults`, then set source.consumer to it")
    if config.deliver_subject:
        problems.append("it is a push consumer (deliver_subject set); a drain needs a pull "
                        f"consumer: create one under a new name, e.g. {replacement}")
    if config.ack_policy is not AckPolicy.EXPLICIT:
        problems.append(f"ack policy is {config.ack_policy.value!r}; a drain acks each message "
                        "after its Delta commit and needs 'explicit'; an ack policy cannot be "
                        f"changed, so create a new consumer, e.g. {replacement}")
    if config.headers_only:
        problems.append("it delivers headers only (headers_only), so every payload would be "
                        "lost: turn it off with "
                        f"`nats consumer edit {stream} {consumer} --no-headers-only -f`")
    if config.ack_wait is not None and config.ack_wait < min_ack_wait:
        seconds = math.ceil(min_ack_wait) + 1
        problems.append(f"ack_wait {config.ack_wait:g}s is shorter than one round needs "
                        f"({min_ack_wait:g}s): messages would be redelivered before their "
                        "commit; raise it with "
                        f"`nats consumer edit {stream} {consumer} --wait {seconds}s -f`, or lower "
                        "fetch.pull_timeout (a round needs 3 x fetch.pull_timeout)")
    if config.max_deliver is not None and config.max_deliver > 0:
        # The server drops a message after max_deliver deliveries: once the delivery count
        # reaches it, an unacked message is dropped when the server would deliver it again, the
        # ack floor moves past it and no advisory reaches a pull client; a NAK counts as a
        # delivery spent. A run that dies after fetching, or a fence NAK, spends a delivery
        # without committing. No timing makes that safe, so the drain refuses the limit
        # (docs/design/max-deliver.md).
        problems.append(f"max_deliver {config.max_deliver}: the server drops a message after "
                        "that many deliveries, and a run that dies after fetching spends one, so "
                        "a crash could lose messages for good (js-etl parks poison itself: "
                        "source.max_deliver); remove the limit with "
                        f"`nats consumer edit {stream} {consumer} --max-deliver=-1 -f`")
    if config.max_ack_pending == 0:
        problems.append("max_ack_pending is 0")
    if marked(config.metadata):
        problems.append(f"it follows a Structured Streaming query (commit_consumer; metadata "
                        f"{MARK}), which moves it past what the query wrote: a drain of it "
                        f"would miss those messages; give the drain its own consumer, e.g. "
                        f"{replacement}")
    return problems


def check_priority_settings(config: JobConfig, info: ConsumerInfo) -> PriorityPolicy | None:
    """The consumer's priority policy, after checking the job's group settings fit it."""
    source = config.source
    policy = info.config.priority_policy
    policy = None if policy in (None, PriorityPolicy.NONE) else policy
    if policy and source.priority_group not in info.config.priority_groups:
        raise ConfigError(
            f"consumer {info.name} uses priority groups {list(info.config.priority_groups)} "
            f"({policy.value}): set source.priority_group to one of them")
    overflow = source.min_pending is not None or source.min_ack_pending is not None
    if overflow and policy is not PriorityPolicy.OVERFLOW:
        raise ConfigError("source.min_pending / source.min_ack_pending need a consumer with the "
                          f"'overflow' priority policy; {info.name} has "
                          f"{policy.value if policy else 'none'}")
    return policy


def source_stream_info(js: JetStreamSession, stream: str, setting: str = "source.stream"
                       ) -> StreamInfo:
    """The stream's info; a missing stream names the setting (or option) to check."""
    try:
        return js.stream_info(stream)
    except StreamNotFoundError as e:
        raise StreamNotFoundError(f"stream {stream!r} not found: check {setting} "
                                  f"(server said: {e.description})", code=e.code,
                                  err_code=e.err_code) from None
