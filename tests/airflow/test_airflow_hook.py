"""The nats connection type, the hook (the only reader of a Connection) and the trigger's
serialisation — against a real nats-server that requires a token."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from airflow_support import REPO, TOKEN, set_connection

from js_etl.config import load_config
from js_etl.demo.publish import publish, wait_for_messages
from js_etl.errors import ConfigError


def test_provider_info_registers_the_nats_connection_type():
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk import BaseHook

    from js_etl.airflow import JetStreamHook

    manager = ProvidersManager()
    assert "js-etl" in manager.providers
    by_type = {m.connection_type: m for m in manager.iter_connection_type_hook_ui_metadata()}
    nats = by_type["nats"]
    assert nats.hook_class_name == "js_etl.airflow.hooks.JetStreamHook"
    assert nats.hook_name == "NATS JetStream"
    assert nats.field_behaviour["relabeling"]["host"] == "Servers"
    widgets = manager._connection_form_widgets_from_metadata
    assert widgets["extra__nats__token"].is_sensitive  # rendered as a password field
    assert {"creds_file", "tls_ca_file", "domain", "connect_timeout"} <= {
        w.field_name for k, w in widgets.items() if k.startswith("extra__nats__")}

    set_connection("nats_lookup", conn_type="nats", host="127.0.0.1")
    hook = BaseHook.get_hook("nats_lookup")  # Airflow finds our hook by connection type
    assert isinstance(hook, JetStreamHook)
    assert hook.nats_conn_id == "nats_lookup"


def test_hook_builds_options_and_a_job_environment_without_exposing_the_secret():
    from js_etl.airflow import JetStreamHook

    set_connection("nats_opts", conn_type="nats", host="nats-1:4222, nats-2 ,tls://nats-3:4443",
                   port=4300, extra={"token": TOKEN, "connect_timeout": "3s", "name": "etl",
                                     "tls_ca_file": "/etc/nats/ca.pem", "domain": "hub"})
    hook = JetStreamHook("nats_opts")

    options = hook.connection_options()
    from airflow.sdk.log import redact

    assert TOKEN not in str(redact(f"connecting with {TOKEN}"))  # registered with the masker
    assert options.servers == ("nats://nats-1:4222", "nats://nats-2:4300", "tls://nats-3:4443")
    assert options.token is not None and options.token.reveal() == TOKEN
    assert (options.connect_timeout, options.name, options.domain) == (3.0, "etl", "hub")
    assert options.tls is not None and options.tls.ca_file == "/etc/nats/ca.pem"
    assert TOKEN not in repr(options) and TOKEN not in str(options)

    env = hook.job_environment()
    carriers = [k for k, v in env.items() if TOKEN in v]
    assert carriers == ["JS_ETL_NATS_TOKEN"]  # the secret travels as one value, and only there
    assert not any(TOKEN in key for key in env)
    assert env["JS_ETL__NATS__TOKEN_ENV"] == "JS_ETL_NATS_TOKEN"
    assert env["JS_ETL__NATS__SERVERS"] == "nats://nats-1:4222,nats://nats-2:4300,tls://nats-3:4443"
    assert env["JS_ETL__NATS__CREDS_FILE"] == "null"  # the connection owns the nats section

    # The job reads that environment back into the very same options (one builder for both).
    config = load_config(REPO / "conf" / "example.yaml", environ=env)
    assert config.nats.connection_options(environ=env) == options
    assert config.nats.name == "etl"  # the YAML's name "orders-etl" does not leak through


def test_hook_passes_user_and_password_the_same_way():
    from js_etl.airflow import JetStreamHook

    set_connection("nats_userpass", conn_type="nats", host="127.0.0.1", login="etl",
                   password="pw-7d1e0b", extra={})
    hook = JetStreamHook("nats_userpass")
    options = hook.connection_options()
    assert options.user == "etl" and options.password is not None
    assert options.password.reveal() == "pw-7d1e0b"
    env = hook.job_environment()
    assert [k for k, v in env.items() if "pw-7d1e0b" in v] == ["JS_ETL_NATS_PASSWORD"]
    assert env["JS_ETL__NATS__USER"] == "etl"
    assert env["JS_ETL__NATS__PASSWORD_ENV"] == "JS_ETL_NATS_PASSWORD"
    assert env["JS_ETL__NATS__TOKEN_ENV"] == "null"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"host": "h", "extra": {"creds-file": "/x.creds"}}, "did you mean 'creds_file'"),
    ({"host": "h", "login": "u", "password": "p1234", "extra": {"token": "t1234"}},
     "login/password and token are set together"),
    ({"host": "h", "password": "p1234"}, "password is set without a login"),
    ({"host": "h", "extra": {"tls_cert_file": "/c.pem"}}, "tls.key_file"),
    ({"host": "h:notaport"}, "expected server URLs"),
    ({"host": ""}, "host is empty"),
])
def test_bad_connections_are_refused_with_a_fix(fields, expected):
    from js_etl.airflow import JetStreamHook

    set_connection("nats_bad", conn_type="nats", **fields)
    with pytest.raises(ConfigError, match="NATS connection 'nats_bad'") as caught:
        JetStreamHook("nats_bad").connection_options()
    assert expected in str(caught.value)
    assert "p1234" not in str(caught.value) and "t1234" not in str(caught.value)


def test_a_missing_connection_is_a_terminal_config_error_on_both_paths():
    from js_etl.airflow import JetStreamHook

    expected = "NATS connection 'no_such_connection' is not defined: add it"
    with pytest.raises(ConfigError, match=expected):  # operator, sensor poke
        JetStreamHook("no_such_connection").job_environment()
    with pytest.raises(ConfigError, match=expected):  # the trigger, in the triggerer's loop
        asyncio.run(JetStreamHook("no_such_connection").aconnection_options())


def test_test_connection_reports_success_refused_credentials_and_unreachable(token_server):
    from js_etl.airflow import JetStreamHook

    ok, message = JetStreamHook("nats_test").test_connection()
    assert ok, message
    assert "JetStream account" in message

    ok, message = JetStreamHook("nats_bad_token").test_connection()
    assert not ok
    assert message.startswith("AuthorizationError: NATS refused the credentials")

    started = time.monotonic()
    ok, message = JetStreamHook("nats_closed").test_connection()
    assert not ok
    assert message.startswith("NatsUnavailableError: cannot connect to NATS at nats://127.0.0.1:")
    assert time.monotonic() - started < 15


def test_test_connection_says_what_it_saw_and_when_credentials_went_unchecked(nats_server,
                                                                              token_server):
    from js_etl.airflow import JetStreamHook

    # A token given to a server without authorization: connected, but nothing was checked.
    set_connection("nats_open_with_token", conn_type="nats", host="127.0.0.1",
                   port=nats_server.port, extra={"token": "not-checked-anywhere"})
    ok, message = JetStreamHook("nats_open_with_token").test_connection()
    assert ok, message
    assert message.endswith("the server did not ask for credentials, so the connection's "
                            "token, user or key was not checked")
    ok, message = JetStreamHook("nats_test").test_connection()  # the token server checks it
    assert ok and "did not ask" not in message

    # Airflow's command prints only "Connection success!" and silences logs unless --verbose;
    # with it, the hook's message (logged) shows.
    result = subprocess.run([str(Path(sys.executable).with_name("airflow")), "connections",
                             "test", "nats_test", "--verbose"], capture_output=True, text=True,
                            timeout=180,
                            check=False,
                            env={**os.environ, "AIRFLOW__CORE__TEST_CONNECTION": "Enabled"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-2000:]
    assert "Connection success!" in output
    assert "JetStream account has" in output and "consumer(s)" in output
    assert TOKEN not in output


def test_hook_consumer_info_and_session(tjs, names):
    from js_etl.airflow import JetStreamHook
    from js_etl.jetstream import AckPolicy, ConsumerConfig

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(tjs.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_policy=AckPolicy.EXPLICIT)))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.a", b"x")] * 3))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 3))

    hook = JetStreamHook("nats_test")
    assert hook.consumer_info(names.stream, names.consumer).num_pending == 3
    with hook.get_conn() as js:
        assert js.stream_info(names.stream).state.messages == 3


def test_trigger_serialises_ids_and_numbers_only(token_server):
    from js_etl.airflow import JetStreamBacklogTrigger

    trigger = JetStreamBacklogTrigger(nats_conn_id="nats_test", stream="ORDERS",
                                      consumer="orders_to_delta", min_pending=10,
                                      poll_interval=0.5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "js_etl.airflow.triggers.JetStreamBacklogTrigger"
    assert kwargs == {"nats_conn_id": "nats_test", "stream": "ORDERS",
                      "consumer": "orders_to_delta", "min_pending": 10, "poll_interval": 0.5}
    assert all(isinstance(v, str | int | float) for v in kwargs.values())
    for text in (repr(trigger), repr(trigger.serialize()), json.dumps(kwargs)):
        assert TOKEN not in text

    rebuilt = JetStreamBacklogTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def _first_event(trigger):
    async def first():
        return await anext(trigger.run())

    return asyncio.run(asyncio.wait_for(first(), 20)).payload


def test_trigger_fires_on_backlog_and_reports_errors_instead_of_waiting(tjs, names):
    from js_etl.airflow import JetStreamBacklogTrigger
    from js_etl.jetstream import AckPolicy, ConsumerConfig

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(tjs.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_policy=AckPolicy.EXPLICIT)))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.a", b"x")] * 5))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 5))

    def trigger(**kw):
        args = {"nats_conn_id": "nats_test", "stream": names.stream,
                "consumer": names.consumer, "poll_interval": 0.1, **kw}
        return JetStreamBacklogTrigger(**args)

    assert _first_event(trigger(min_pending=5)) == {
        "status": "success", "stream": names.stream, "consumer": names.consumer,
        "num_pending": 5}

    missing = _first_event(trigger(stream="NO_SUCH_STREAM"))
    assert (missing["status"], missing["error"], missing["retryable"]) == (
        "error", "StreamNotFoundError", False)
    assert "stream not found" in missing["message"]

    refused = _first_event(trigger(nats_conn_id="nats_bad_token"))
    assert (refused["error"], refused["retryable"]) == ("AuthorizationError", False)

    unreachable = _first_event(trigger(nats_conn_id="nats_closed"))
    assert (unreachable["error"], unreachable["retryable"]) == ("NatsUnavailableError", True)
    assert "cannot connect to NATS" in unreachable["message"]


def test_trigger_cleanup_logs_a_failing_close_instead_of_raising(capfd):
    from js_etl.airflow import JetStreamBacklogTrigger

    class BrokenConnection:  # only close() is exercised: a stand-in is enough here
        async def close(self) -> None:
            raise OSError("socket already gone")

    trigger = JetStreamBacklogTrigger(nats_conn_id="nats_test", stream="S", consumer="c")
    trigger._conn = BrokenConnection()  # type: ignore[assignment]
    asyncio.run(trigger.cleanup())  # Airflow's logging writes to stdout
    assert "closing the NATS connection of S/c failed: socket already gone" in (
        capfd.readouterr().out)
    assert trigger._conn is None
    asyncio.run(trigger.cleanup())  # nothing left to close: a no-op
