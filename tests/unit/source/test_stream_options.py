"""The streaming options of the ``nats_jetstream`` source, and the options a job config reads
its stream with (pure logic: no server, no Spark)."""

from __future__ import annotations

import pytest

from js_etl.config import load_config
from js_etl.errors import ConfigError
from js_etl.source.options import SourceOptions, job_options


def parse(**options: str) -> SourceOptions:
    return SourceOptions.parse({"stream": "ORDERS", **options})


def test_streaming_options_are_checked_and_remembered_as_given():
    plain = parse().streaming
    assert (plain.start, plain.max_messages_per_batch, plain.fail_on_data_loss,
            plain.commit_consumer, plain.lease_bucket, plain.given) == (
        "earliest", None, True, None, "js-etl-leases", ())
    given = parse(start="LATEST", max_messages_per_batch="500", fail_on_data_loss="false",
                  commit_consumer="orders_follow", lease_bucket="leases").streaming
    assert (given.start, given.max_messages_per_batch, given.fail_on_data_loss,
            given.commit_consumer, given.lease_bucket) == (
        "latest", 500, False, "orders_follow", "leases")
    assert given.given == ("start", "max_messages_per_batch", "fail_on_data_loss",
                           "commit_consumer", "lease_bucket")
    for options, text in [
        ({"start": "newest"}, "option start must be earliest or latest"),
        ({"start": "latest", "from_seq": "4"}, "give at most one start"),
        ({"max_messages_per_batch": "0"}, "max_messages_per_batch must be a count"),
        ({"fail_on_data_loss": "maybe"}, "fail_on_data_loss must be true or false"),
        ({"commit_consumer": "a.b"}, "commit_consumer must be a consumer name"),
        ({"commit_consumer": "c", "lease_bucket": "a.b"}, "option lease_bucket: expected a "
                                                          "key-value bucket name"),
        ({"lease_bucket": "leases"}, "option lease_bucket goes with commit_consumer"),
    ]:
        with pytest.raises(ConfigError, match=text):
            parse(**options)


def test_a_job_config_reads_its_stream_with_the_same_settings():
    config = load_config(None, [
        "nats.servers=[nats://a:4222, nats://b:4222]", "nats.token_env=NATS_TOKEN",
        "source.stream=ORDERS", "source.consumer=follow", "source.filter_subjects=[o.a, o.b]",
        "fetch.partitions=3", "decode.format=json", "decode.schema=id BIGINT",
        "decode.keep_raw=true", "target.path=/t", "streaming.checkpoint=/c",
        "streaming.max_messages_per_batch=70", "streaming.commit_consumer=true",
        "streaming.fail_on_data_loss=false", "source.lease_bucket=leases"], environ={})
    options = job_options(config)
    assert "NATS_TOKEN" == options["token_env"] and "token" not in options  # a name, no secret
    parsed = SourceOptions.parse(options)
    assert parsed.nats.servers == ["nats://a:4222", "nats://b:4222"]
    assert parsed.filter_subjects == ("o.a", "o.b") and parsed.fetch.partitions == 3
    assert parsed.decode == config.decode
    streaming = parsed.streaming
    assert (streaming.start, streaming.max_messages_per_batch, streaming.fail_on_data_loss,
            streaming.commit_consumer, streaming.lease_bucket) == (
        "earliest", 70, False, "follow", "leases")
    from_seq = job_options(load_config(None, [
        "source.stream=ORDERS", "source.consumer=c", "target.path=/t",
        "streaming.from_seq=42"], environ={}))
    assert SourceOptions.parse(from_seq).request.from_seq == 42 and "start" not in from_seq
    with pytest.raises(ConfigError, match="streaming.start and streaming.from_seq"):
        load_config(None, ["source.stream=ORDERS", "source.consumer=c", "target.path=/t",
                           "streaming.from_seq=42", "streaming.start=latest"], environ={})
