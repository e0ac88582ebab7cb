"""Pure logic of the JetStream layer, no server: ack subjects, header blocks, status frames,
pull request bodies, error mapping, admin dataclasses, options and secrets.

The literal subjects and frames are copied from the measured fact sheet
(docs/reference/jetstream-wire-facts.md).
"""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime

import pytest
from streams import drained, size

from js_etl.errors import ConfigError, TerminalError, TransientError
from js_etl.instant import format_time, parse_time
from js_etl.jetstream import (
    AckMetadata,
    AckPolicy,
    ConnectionOptions,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    JsMessage,
    PriorityGroupRequest,
    PriorityPolicy,
    PullEnd,
    PullRequest,
    PullResult,
    Secret,
    Status,
    StreamInfo,
    TlsOptions,
    ack_subject,
    parse_ack_subject,
    parse_headers,
)
from js_etl.jetstream.ack import nak_body, term_body
from js_etl.jetstream.errors import (
    BadRequestError,
    ClusterUnavailableError,
    ConsumerDeletedError,
    ConsumerExistsError,
    ConsumerNotFoundError,
    ConsumerUnavailableError,
    JetStreamNotEnabledError,
    NatsUnavailableError,
    PinMismatchError,
    PriorityGroupError,
    PullLimitError,
    StreamNotFoundError,
    WrongLastSequenceError,
    api_error,
)
from js_etl.jetstream.pull import status_error


# --- ack subjects --------------------------------------------------------------------------------
def test_parse_nine_token_ack_subject():
    meta = parse_ack_subject("$JS.ACK.A4.c.1.1.1.1795328815752052740.4")
    assert meta == AckMetadata("A4", "c", 1, 1, 1, 1795328815752052740, 4)
    assert meta.domain is None and meta.account_hash is None
    assert meta.ack_prefix == "$JS.ACK.A4.c"
    assert meta.timestamp == datetime(2026, 11, 22, 6, 26, 55, 752052, tzinfo=UTC)


def test_parse_eleven_token_domain_ack_subject():
    meta = parse_ack_subject("$JS.ACK.hub.szMpdrwD.V2.c.1.1.1.1795329181521759735.1")
    assert (meta.domain, meta.account_hash, meta.stream, meta.consumer) == (
        "hub", "szMpdrwD", "V2", "c")
    assert (meta.num_delivered, meta.stream_seq, meta.consumer_seq, meta.num_pending) == (
        1, 1, 1, 1)
    assert meta.timestamp_ns == 1795329181521759735
    assert meta.ack_prefix == "$JS.ACK.hub.szMpdrwD.V2.c"


def test_parse_twelve_token_ack_subject_with_random_token_and_no_domain():
    meta = parse_ack_subject("$JS.ACK._.ACCHASH1.ORDERS.drain.3.17.42.1795329181521759735.0.rNd0m")
    assert meta.domain is None and meta.account_hash == "ACCHASH1"
    assert (meta.stream, meta.consumer, meta.num_delivered, meta.stream_seq,
            meta.consumer_seq, meta.num_pending) == ("ORDERS", "drain", 3, 17, 42, 0)
    assert meta.ack_prefix == "$JS.ACK._.ACCHASH1.ORDERS.drain"


@pytest.mark.parametrize("subject", [
    "",
    "inbox.abc",
    "$JS.ACK.A4.c.1.1.1.1795328815752052740",  # 8 tokens
    "$JS.ACK.hub.hash.A4.c.1.1.1.17953288157",  # 10 tokens
    "$JS.ACK.A4.c.one.1.1.1795328815752052740.4",  # not a number
    "$JS.NAK.A4.c.1.1.1.1795328815752052740.4",
    "$KV.ACK.A4.c.1.1.1.1795328815752052740.4",
    "$JS.ACK.hub.hash.V2.c.1.1.x.1795329181521759735.1",
])
def test_garbage_is_not_an_ack_subject(subject):
    with pytest.raises(ValueError, match="not a JetStream ack subject"):
        parse_ack_subject(subject)


@pytest.mark.parametrize("reply", [
    "$JS.ACK.A4.c.2.6.7.1795328815752052740.4",
    "$JS.ACK.hub.szMpdrwD.V2.c.2.6.7.1795329181521759735.1",
    "$JS.ACK._.ACCHASH1.V2.c.2.6.7.1795329181521759735.1.rNd0m",
])
def test_rebuilt_ack_subject_round_trips(reply):
    meta = parse_ack_subject(reply)
    rebuilt = ack_subject(meta.ack_prefix, meta.num_delivered, meta.stream_seq, meta.consumer_seq)
    again = parse_ack_subject(rebuilt)
    assert (again.stream, again.consumer, again.domain, again.account_hash) == (
        meta.stream, meta.consumer, meta.domain, meta.account_hash)
    assert (again.num_delivered, again.stream_seq, again.consumer_seq) == (2, 6, 7)
    assert (again.timestamp_ns, again.num_pending) == (0, 0)
    assert len(rebuilt.split(".")) == (9 if meta.account_hash is None else 11)


# --- header blocks and status frames -------------------------------------------------------------
def test_parse_headers_keeps_repeats_in_order():
    raw = b"NATS/1.0\r\nX-Tag: a\r\nX-Other: 1\r\nX-Tag: b\r\nX-Tag:  c:d \r\n\r\n"
    assert parse_headers(raw) == {"X-Tag": ["a", "b", "c:d"], "X-Other": ["1"]}
    assert parse_headers(None) == {} and parse_headers(b"") == {}
    assert parse_headers(b"NATS/1.0\r\n\r\n") == {}


@pytest.mark.parametrize("raw,code,text,headers", [
    (b"NATS/1.0 404 No Messages\r\n\r\n", 404, "No Messages", {}),
    (b"NATS/1.0 409 Message Size Exceeds MaxBytes\r\nNats-Pending-Messages: 17\r\n"
     b"Nats-Pending-Bytes: 59\r\n\r\n", 409, "Message Size Exceeds MaxBytes",
     {"Nats-Pending-Messages": ["17"], "Nats-Pending-Bytes": ["59"]}),
    (b"NATS/1.0 503\r\nNats-Subject: $JS.API.CONSUMER.MSG.NEXT.E.nosuch\r\n\r\n", 503, "",
     {"Nats-Subject": ["$JS.API.CONSUMER.MSG.NEXT.E.nosuch"]}),
    (b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 21\r\nNats-Last-Stream: 21\r\n\r\n",
     100, "Idle Heartbeat", {"Nats-Last-Consumer": ["21"], "Nats-Last-Stream": ["21"]}),
    (b"NATS/1.0 400 Bad Request - invalid character 'b' looking for beginning of object key "
     b"string\r\n\r\n", 400,
     "Bad Request - invalid character 'b' looking for beginning of object key string", {}),
])
def test_status_parse(raw, code, text, headers):
    status = Status.parse(raw)
    assert (status.code, status.description, status.headers) == (code, text, headers)
    assert str(status) == f"{code} {text}".strip()


def test_message_size_is_the_server_formula():
    # docs/reference/jetstream-wire-facts.md §2: subject p2.x, reply with 19-digit ts, 100 B
    # payload -> 147; 33-B header -> 180.
    reply = "$JS.ACK.P2.c11.1.1.1.1795328815752052740.19"
    plain = JsMessage("p2.x", b"x" * 100, reply)
    assert size(plain) == 147
    header = b"NATS/1.0\r\nX-Probe: 0123456789\r\n\r\n"
    assert len(header) == 33
    assert size(JsMessage("p2.x", b"x" * 100, reply, header)) == 180
    assert JsMessage("p2.x", b"x" * 100, reply, header).headers == {"X-Probe": ["0123456789"]}
    assert plain.metadata.num_pending == 19


# --- pull request bodies and how pulls end -------------------------------------------------------
def test_pull_request_json():
    assert json.loads(PullRequest(10).as_json()) == {"batch": 10, "no_wait": True}
    group = PriorityGroupRequest("jobs", min_pending=100, id="PIN", priority=3)
    body = json.loads(PullRequest(500, max_bytes=8 << 20, expires=2.0,
                                  priority_group=group).as_json())
    assert body == {"batch": 500, "max_bytes": 8 << 20, "no_wait": True,
                    "expires": 2_000_000_000, "group": "jobs", "min_pending": 100,
                    "id": "PIN", "priority": 3}
    # A string duration is a 400 (docs/reference/jetstream-wire-facts.md §1).
    assert isinstance(body["expires"], int)
    zero = PriorityGroupRequest("jobs", min_ack_pending=0)  # 0 is a threshold, not "unset"
    assert json.loads(PullRequest(5, no_wait=False, priority_group=zero).as_json()) == {
        "batch": 5, "group": "jobs", "min_ack_pending": 0}


@pytest.mark.parametrize("raw,error", [
    (b"NATS/1.0 409 Consumer Deleted\r\n\r\n", ConsumerDeletedError),
    (b"NATS/1.0 409 Exceeded MaxRequestBatch of 100\r\n\r\n", PullLimitError),
    (b"NATS/1.0 409 Exceeded MaxRequestMaxBytes of 1000\r\n\r\n", PullLimitError),
    (b"NATS/1.0 409 Exceeded MaxRequestExpires of 2s\r\n\r\n", PullLimitError),
    (b"NATS/1.0 409 Exceeded MaxWaiting\r\n\r\n", PullLimitError),
    (b"NATS/1.0 400 Bad Request - Priority Group missing\r\n\r\n", PriorityGroupError),
    (b"NATS/1.0 400 Bad Request - Invalid Priority Group\r\n\r\n", PriorityGroupError),
    (b"NATS/1.0 400 Bad Request - Not a Pinned Client Priority consumer\r\n\r\n",
     PriorityGroupError),
    (b"NATS/1.0 400 Bad Request - Not a Overflow Priority consumer\r\n\r\n", PriorityGroupError),
    (b"NATS/1.0 400 Bad Request - Priority must be between 0 and 9\r\n\r\n", BadRequestError),
    (b"NATS/1.0 400 Bad Request - heartbeat value too large\r\n\r\n", BadRequestError),
    (b"NATS/1.0 400 Bad Request - json: cannot unmarshal string into Go struct field .expires "
     b"of type time.Duration\r\n\r\n", BadRequestError),
    # No consumer answered: a leader being elected, or a missing consumer. Transient (exit 75,
    # retried), never terminal: a leader election must not stop a pipeline until a person looks.
    (b"NATS/1.0 503\r\nNats-Subject: $JS.API.CONSUMER.MSG.NEXT.E.nosuch\r\n\r\n",
     ConsumerUnavailableError),
    (b"NATS/1.0 409 Leadership Change\r\n\r\n", NatsUnavailableError),
])
def test_status_error_mapping(raw, error):
    err = status_error(Status.parse(raw))
    assert type(err) is error
    assert err.code == Status.parse(raw).code


def test_raise_for_status_only_for_ends_that_need_a_decision():
    for end in (PullEnd.BATCH_FULL, PullEnd.BYTES_FULL, PullEnd.NO_MESSAGES, PullEnd.OVERSIZE,
                PullEnd.EXPIRED, PullEnd.REQUESTS_PENDING, PullEnd.DEADLINE):
        PullResult([], end).raise_for_status()
    with pytest.raises(PinMismatchError):
        PullResult([], PullEnd.PIN_MISMATCH,
                   Status.parse(b"NATS/1.0 423 Nats-Pin-Id mismatch\r\n\r\n")).raise_for_status()
    with pytest.raises(NatsUnavailableError):
        PullResult([], PullEnd.DISCONNECTED).raise_for_status()
    assert drained(PullEnd.NO_MESSAGES) and not drained(PullEnd.DEADLINE)
    assert issubclass(PinMismatchError, TransientError)
    assert issubclass(ConsumerDeletedError, TerminalError)
    assert issubclass(ConsumerUnavailableError, TransientError)


# --- API error mapping ---------------------------------------------------------------------------
@pytest.mark.parametrize("error,cls", [
    ({"code": 404, "err_code": 10059, "description": "stream not found"}, StreamNotFoundError),
    # An expected-sequence publish that lost: one server says 10071 with the sequence, a
    # clustered stream 10164 without it (seen on the 3-node cluster); both are the same refusal.
    ({"code": 400, "err_code": 10071, "description": "wrong last sequence: 5"},
     WrongLastSequenceError),
    ({"code": 400, "err_code": 10164, "description": "wrong last sequence"},
     WrongLastSequenceError),
    ({"code": 404, "err_code": 10014, "description": "consumer not found"},
     ConsumerNotFoundError),
    ({"code": 400, "err_code": 10148, "description": "consumer already exists"},
     ConsumerExistsError),
    ({"code": 400, "err_code": 10196,
      "description": "consumer can not have priority groups when policy is none"},
     BadRequestError),
    ({"code": 400, "err_code": 10160,
      "description": "Provided priority group does not exist for this consumer"},
     PriorityGroupError),
    ({"code": 503, "err_code": 10039, "description": "jetstream not enabled for account"},
     JetStreamNotEnabledError),
    ({"code": 400, "err_code": 99999, "description": "something new"}, BadRequestError),
    ({"code": 500, "description": "internal"}, ClusterUnavailableError),
    ({}, ClusterUnavailableError),
])
def test_api_error_mapping(error, cls):
    err = api_error(error)
    assert type(err) is cls
    assert err.err_code == error.get("err_code", 0)
    if "description" in error:
        assert str(err).startswith(error["description"])


# --- admin dataclasses ---------------------------------------------------------------------------
def test_consumer_config_round_trip():
    config = ConsumerConfig(
        durable_name="drain", deliver_policy=DeliverPolicy.BY_START_TIME,
        opt_start_time=datetime(2026, 11, 22, 6, 26, 55, 752052, tzinfo=UTC),
        ack_policy=AckPolicy.EXPLICIT, ack_wait=300, max_ack_pending=20_000, max_expires=2.5,
        filter_subjects=("orders.>", "refunds.>"), priority_groups=("jobs",),
        priority_policy=PriorityPolicy.PINNED_CLIENT, priority_timeout=120,
        metadata={"owner": "etl"})
    wire = config.as_dict()
    assert wire["ack_wait"] == 300_000_000_000 and wire["max_expires"] == 2_500_000_000
    assert wire["priority_timeout"] == 120_000_000_000
    assert wire["opt_start_time"] == "2026-11-22T06:26:55.752052Z"
    assert wire["priority_policy"] == "pinned_client" and wire["ack_policy"] == "explicit"
    assert wire["filter_subjects"] == ["orders.>", "refunds.>"]
    assert "name" not in wire and "max_batch" not in wire  # None is not sent
    json.dumps(wire)  # plain JSON
    assert ConsumerConfig.from_response({**wire, "unknown_new_key": 1}) == config


def test_consumer_config_from_response_single_filter_and_defaults():
    config = ConsumerConfig.from_response({
        "durable_name": "c", "ack_policy": "none", "filter_subject": "a.>",
        "deliver_policy": "all", "max_waiting": 512, "replay_policy": "instant"})
    assert config.ack_policy is AckPolicy.NONE and config.filter_subjects == ("a.>",)
    assert config.max_ack_pending is None and config.ack_wait is None


def test_consumer_info_from_response():
    info = ConsumerInfo.from_response({
        "type": "io.nats.jetstream.api.v1.consumer_info_response", "stream_name": "S",
        "name": "c", "created": "2026-11-22T06:29:40.208366595Z",
        "config": {"durable_name": "c", "ack_policy": "explicit", "ack_wait": 30_000_000_000,
                   "priority_groups": ["jobs"], "priority_policy": "pinned_client"},
        "delivered": {"consumer_seq": 7, "stream_seq": 9,
                      "last_active": "2026-11-22T06:29:41.5Z"},
        "ack_floor": {"consumer_seq": 5, "stream_seq": 6},
        "num_ack_pending": 2, "num_redelivered": 1, "num_waiting": 0, "num_pending": 3,
        "priority_groups": [{"group": "jobs", "pinned_client_id": "Wxbl9ln5zT1YYEb1YNHT0Y",
                             "pinned_ts": "2026-11-22T06:29:40.208366595Z"}],
        "ts": "2026-11-22T06:29:42Z"})
    assert info.delivered.stream_seq == 9 and info.ack_floor.consumer_seq == 5
    assert info.ack_floor.last_active is None
    assert info.delivered.last_active == datetime(2026, 11, 22, 6, 29, 41, 500000, tzinfo=UTC)
    assert info.config.ack_wait == 30.0
    assert info.pinned_id("jobs") == "Wxbl9ln5zT1YYEb1YNHT0Y" and info.pinned_id("x") is None
    assert info.priority_groups[0].pinned_ts == datetime(2026, 11, 22, 6, 29, 40, 208366,
                                                         tzinfo=UTC)


def test_stream_info_from_response_empty_stream():
    info = StreamInfo.from_response({
        "config": {"name": "S", "subjects": ["s.>"], "storage": "file"},
        "state": {"messages": 0, "bytes": 0, "first_seq": 0,
                  "first_ts": "0001-01-01T00:00:00Z", "last_seq": 0,
                  "last_ts": "0001-01-01T00:00:00Z", "consumer_count": 0}})
    assert info.subjects == ("s.>",) and info.state.first_ts is None
    assert info.state.num_subjects == 0


def test_time_parsing():
    assert parse_time("0001-01-01T00:00:00Z") is None and parse_time(None) is None
    assert parse_time("2026-11-22T06:26:55.75205274Z") == datetime(
        2026, 11, 22, 6, 26, 55, 752052, tzinfo=UTC)
    assert parse_time("2026-11-22T08:26:55+02:00") == datetime(2026, 11, 22, 6, 26, 55,
                                                               tzinfo=UTC)
    assert format_time(datetime(2026, 11, 22, 6, 26, 55, tzinfo=UTC)) == \
        "2026-11-22T06:26:55.000000Z"
    with pytest.raises(ValueError):
        parse_time("yesterday")


# --- ack bodies ----------------------------------------------------------------------------------
def test_ack_bodies():
    assert nak_body() == b"-NAK" and nak_body(0) == b"-NAK"
    assert nak_body(0.5) == b'-NAK {"delay": 500000000}'  # integer ns; "1s" would be ignored
    assert term_body() == b"+TERM"
    assert term_body("bad  payload\r\nxyz") == b"+TERM bad payload xyz"


# --- options and secrets -------------------------------------------------------------------------
def test_secret_masks_itself():
    secret = Secret("s3cret")
    assert secret.reveal() == "s3cret"
    assert repr(secret) == str(secret) == "Secret('***')"
    assert "s3cret" not in f"{secret} {secret!r} {[secret]} {({'t': secret})}"
    assert secret == Secret("s3cret") and secret != Secret("other") and secret != "s3cret"
    assert pickle.loads(pickle.dumps(secret)).reveal() == "s3cret"


def test_secret_from_env_and_file(tmp_path):
    assert Secret.from_env("TOK", {"TOK": "abc"}).reveal() == "abc"
    with pytest.raises(ConfigError, match="TOK"):
        Secret.from_env("TOK", {})
    with pytest.raises(ConfigError):
        Secret.from_env("TOK", {"TOK": ""})
    path = tmp_path / "token"
    path.write_text("  from-file\n")
    assert Secret.from_file(str(path)).reveal() == "from-file"
    with pytest.raises(ConfigError, match="cannot read"):
        Secret.from_file(str(tmp_path / "missing"))


def test_connection_options_repr_and_pickle():
    options = ConnectionOptions(servers=("nats://a:4222", "nats://b:4222"), name="etl",
                                token=Secret("tok-123"), user="u", password=Secret("pw-456"),
                                tls=TlsOptions(ca_file="/ca.pem"), domain="hub",
                                connect_timeout=1.5)
    text = repr(options)
    assert "tok-123" not in text and "pw-456" not in text and "Secret('***')" in text
    restored = pickle.loads(pickle.dumps(options))
    assert restored == options
    assert restored.token.reveal() == "tok-123" and restored.password.reveal() == "pw-456"
    assert restored.api_prefix == "$JS.hub.API"
    kw = ConnectionOptions(token=Secret("tok-123"), user="u", password=Secret("pw")) \
        .connect_kwargs()
    assert kw["token"] == "tok-123" and kw["password"] == "pw"
    assert ConnectionOptions().api_prefix == "$JS.API"


def test_websocket_urls_without_aiohttp_are_a_config_error(monkeypatch):
    """nats-py's websocket transport needs aiohttp: without it the connect loop raised
    ImportError, read as an unreachable server (exit 75, retried for ever)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aiohttp" else real(name, *a))
    for url in ("ws://127.0.0.1:8080", "WSS://nats.example.com/ws"):
        options = ConnectionOptions(servers=("nats://127.0.0.1:4222", url))
        with pytest.raises(ConfigError, match=r"websocket URLs \(.*\) need aiohttp.*"
                                              r"js-etl\[websocket\]") as refused:
            options.connect_kwargs()
        assert refused.value.exit_code == 2
    ConnectionOptions(servers=("nats://127.0.0.1:4222", "tls://h:4222")).check()  # no websocket
