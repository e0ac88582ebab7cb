"""TLS against real nats-servers with a CA made in the test: no hang, no downgrade, clear refusals.

Issue 17: a certificate js-etl could not verify made it hang for ever (nats-py waited on a socket
that asyncio's TLS layer had already closed); a ``tls://`` URL with a CA connected in plaintext to
a server without TLS; a missing CA/cert/key file was retried as an outage (exit 75); every TLS run
logged an asyncio ``eof_received`` warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pki import PKI_UNAVAILABLE, Pki, make_pki

from js_etl.config import load_config
from js_etl.demo.server import LocalNatsServer
from js_etl.errors import ConfigError, TerminalError
from js_etl.jetstream import ConnectionOptions, JetStreamSession, TlsOptions
from js_etl.jetstream.errors import StreamNotFoundError, TlsError

pytestmark = pytest.mark.skipif(PKI_UNAVAILABLE is not None, reason=PKI_UNAVAILABLE or "")

BIN = Path(sys.executable).parent
HANG_GUARD = 120.0  # seconds: far beyond any bounded connect; only a hang reaches it


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Another CA: the server's certificate does not verify against it."""
    return make_pki(tmp_path_factory.mktemp("stranger"), "stranger")


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[LocalNatsServer]:
    with LocalNatsServer(config_text=pki.server_tls_block()) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[LocalNatsServer]:
    """Requires a client certificate signed by the test CA."""
    with LocalNatsServer(config_text=pki.server_tls_block(verify_clients=True)) as server:
        yield server


@pytest.fixture(scope="module")
def optional_tls_server(pki: Pki) -> Iterator[LocalNatsServer]:
    """Offers TLS but also takes plaintext clients (``tls_available`` in its INFO)."""
    with LocalNatsServer(config_text=pki.server_tls_block() + "allow_non_tls: true\n") as server:
        yield server


def guarded(call: Callable[[], Any], limit: float = HANG_GUARD) -> tuple[Any, float]:
    """``call()`` in a thread: its result or exception, and how long it took. A call still
    running after ``limit`` fails the test (instead of hanging the suite)."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as e:  # handed to the test, which judges it
            outcome.append(e)

    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert outcome, f"still running after {limit:.0f}s: hung"
    return outcome[0], time.monotonic() - started


def connect(url: str, tls: TlsOptions | None, timeout: float = 2.0) -> Any:
    """Open a session, make one JetStream request, close; returns whether it ran over TLS."""
    options = ConnectionOptions(servers=(url,), connect_timeout=timeout, tls=tls)
    with JetStreamSession(options) as js:
        with pytest.raises(StreamNotFoundError):
            js.stream_info("NOPE")
        return js.conn.nc._transport._io_writer.get_extra_info("ssl_object") is not None


def js_etl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(BIN / "js-etl"), *args], capture_output=True, text=True,
                          timeout=HANG_GUARD, env=env, check=False)


def status_args(url: str, *settings: str) -> list[str]:
    args = ["status", "--set", f"nats.servers={url}", "--set", "nats.connect_timeout=2s",
            "--set", "source.stream=S", "--set", "source.consumer=c", "--set", "target.path=/x"]
    for setting in settings:
        args += ["--set", setting]
    return args


# --- a certificate that does not verify ----------------------------------------------------------
def test_untrusted_certificate_ends_within_connect_timeout_as_terminal(tls_server, stranger):
    outcome, elapsed = guarded(lambda: connect(tls_server.url, TlsOptions(str(stranger.ca_file))))

    assert isinstance(outcome, TlsError) and isinstance(outcome, TerminalError)
    message = str(outcome)
    assert tls_server.url in message and "does not verify" in message
    assert "nats.tls.ca_file" in message
    assert elapsed < 2.0  # one attempt, within connect_timeout: not retried, never hung


def test_untrusted_certificate_without_a_ca_file_names_the_trust_store(tls_server):
    url = tls_server.url.replace("nats://", "tls://")
    outcome, _ = guarded(lambda: connect(url, None))

    assert isinstance(outcome, TlsError)
    assert "trust store" in str(outcome) and "nats.tls.ca_file" in str(outcome)


def test_cli_status_with_untrusted_certificate_exits_2_with_one_line(tls_server, stranger):
    result = js_etl(*status_args(tls_server.url, f"nats.tls.ca_file={stranger.ca_file}"))

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("js-etl: TlsError: the TLS certificate of")
    assert "does not verify" in lines[0]


def test_drain_with_untrusted_certificate_fails_terminally(spark, tls_server, stranger, tmp_path):
    from js_etl.drain.run import run_drain

    config = load_config(None, [
        f"nats.servers={tls_server.url}", "nats.connect_timeout=2s",
        f"nats.tls.ca_file={stranger.ca_file}", "source.stream=S", "source.consumer=c",
        "source.create_consumer=true", f"target.path={tmp_path / 'table'}"], environ={})

    outcome, _ = guarded(lambda: run_drain(spark, config))

    assert isinstance(outcome, TlsError), outcome
    assert not (tmp_path / "table").exists()


# --- TLS or nothing ------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["tls", "nats"])
def test_tls_settings_never_fall_back_to_plaintext(nats_server, pki, scheme):
    url = nats_server.url.replace("nats://", f"{scheme}://")

    outcome, _ = guarded(lambda: connect(url, TlsOptions(str(pki.ca_file))))

    assert isinstance(outcome, TlsError), outcome
    assert "secure connection not available" in str(outcome)


def test_tls_url_without_settings_never_falls_back_to_plaintext(nats_server):
    outcome, _ = guarded(lambda: connect(nats_server.url.replace("nats://", "tls://"), None))

    assert isinstance(outcome, TlsError), outcome
    assert "secure connection not available" in str(outcome)


def test_plain_url_without_tls_settings_stays_plaintext(nats_server):
    assert connect(nats_server.url, None) is False


def test_server_offering_optional_tls_is_upgraded_when_tls_is_asked_for(optional_tls_server,
                                                                         pki):
    assert connect(optional_tls_server.url, TlsOptions(str(pki.ca_file))) is True
    assert connect(optional_tls_server.url, None) is False  # nothing asked: nothing changes


def test_nats_py_alone_would_send_the_credentials_in_plaintext_to_that_server(
        optional_tls_server, pki):
    """Why js-etl's connect path is its own where nats-py has no public API for it
    (``_RawClient._process_info``, docs/design/nats-client.md): nats-py's public connect, given
    a TLS context, upgrades only a server whose INFO *requires* TLS, so it sends CONNECT, token
    included, in plaintext to one that merely offers it. When a nats-py of the range stops doing
    so, this fails, and the hook can go."""
    import nats

    async def over_tls() -> bool:
        nc = await nats.connect(optional_tls_server.url, tls=TlsOptions(str(pki.ca_file)).context(),
                                connect_timeout=2, max_reconnect_attempts=0)
        try:
            return nc._transport._io_writer.get_extra_info("ssl_object") is not None
        finally:
            await nc.close()

    assert asyncio.run(over_tls()) is False


def test_trusted_server_carries_jetstream_over_tls(tls_server, pki):
    options = ConnectionOptions(servers=(tls_server.url,), connect_timeout=2,
                                tls=TlsOptions(str(pki.ca_file)))
    with JetStreamSession(options) as js:
        js.run(js.admin.add_stream("TLSOK", ["tlsok.>"]))
        ack = js.run(js.conn.nc.request("tlsok.x", b"over tls", timeout=5))
        assert b'"seq":1' in ack.data
        assert js.stream_info("TLSOK").state.messages == 1
        assert js.conn.nc._transport._io_writer.get_extra_info("ssl_object") is not None


@pytest.mark.filterwarnings("ignore:parameter 'timeout' of type 'float':DeprecationWarning")
def test_a_wss_url_carries_jetstream_and_an_untrusted_certificate_is_one_line_exit_2(pki,
                                                                                    stranger):
    """A ``wss://`` URL (the websocket transport, ``js-etl[websocket]``) to a server's websocket
    listener with TLS: JetStream works over it; a CA that did not sign the server's certificate
    is the same terminal one-line error as over ``tls://``, with nothing printed after it."""
    from js_etl.demo.server import free_port

    port = free_port()
    listener = (f'websocket {{\n  listen: "127.0.0.1:{port}"\n  tls {{ cert_file: '
                f'"{pki.server_cert}", key_file: "{pki.server_key}" }}\n}}\n')
    url = f"wss://127.0.0.1:{port}"
    with LocalNatsServer(config_text=listener):
        options = ConnectionOptions(servers=(url,), connect_timeout=2,
                                    tls=TlsOptions(str(pki.ca_file)))
        with JetStreamSession(options) as js:
            js.run(js.admin.add_stream("WSS", ["wss.>"]))
            assert js.stream_info("WSS").name == "WSS"

        result = js_etl(*status_args(url, f"nats.tls.ca_file={stranger.ca_file}"))

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"js-etl: TlsError: the TLS certificate of {url} does not verify")
    assert "nats.tls.ca_file" in lines[0]


# --- client certificates -------------------------------------------------------------------------
def test_client_certificate_is_presented_and_its_absence_is_terminal(mtls_server, pki):
    with_cert = TlsOptions(str(pki.ca_file), str(pki.client_cert), str(pki.client_key))
    assert connect(mtls_server.url, with_cert) is True

    outcome, _ = guarded(lambda: connect(mtls_server.url, TlsOptions(str(pki.ca_file))))

    assert isinstance(outcome, TlsError), outcome
    assert "requires a client certificate" in str(outcome)
    assert "nats.tls.cert_file" in str(outcome)


# --- unusable TLS files: terminal, named, key path never shown -----------------------------------
def test_missing_tls_files_exit_2_naming_the_setting(nats_server, pki, tmp_path):
    missing_ca = tmp_path / "no-such-ca.pem"
    result = js_etl(*status_args(nats_server.url, f"nats.tls.ca_file={missing_ca}"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"js-etl: ConfigError: nats.tls.ca_file: cannot read {missing_ca} (No such file or "
        "directory); point it at a readable PEM file")

    secret_looking_key = tmp_path / "-----BEGIN PRIVATE KEY-----MIGHAgEA"
    result = js_etl(*status_args(nats_server.url, f"nats.tls.cert_file={pki.client_cert}",
                                 f"nats.tls.key_file={secret_looking_key}"))
    assert result.returncode == 2, result.stderr
    assert "nats.tls.key_file: cannot read" in result.stderr
    assert "MIGHAgEA" not in result.stderr


def test_drain_with_a_missing_tls_file_exits_2_before_spark_starts(nats_server, tmp_path):
    missing_ca = tmp_path / "no-such-ca.pem"
    args = status_args(nats_server.url, f"nats.tls.ca_file={missing_ca}")
    result = js_etl("drain", *args[1:])

    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"js-etl: ConfigError: nats.tls.ca_file: cannot read {missing_ca}")
    assert "py4j" not in result.stderr and "Spark" not in result.stderr


def test_unusable_tls_files_are_config_errors(nats_server, pki, stranger, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = {
        "a CA file without a certificate": TlsOptions(str(garbage)),
        "a key that does not match the certificate": TlsOptions(
            str(pki.ca_file), str(pki.client_cert), str(stranger.client_key)),
        "a directory for the CA file": TlsOptions(str(tmp_path)),
    }
    for label, tls in cases.items():
        outcome, _ = guarded(lambda tls=tls: connect(nats_server.url, tls))
        assert isinstance(outcome, ConfigError), (label, outcome)
        assert "nats.tls." in str(outcome), label


# --- no asyncio warning --------------------------------------------------------------------------
def test_tls_connections_log_no_asyncio_eof_warning(pki, caplog):
    caplog.set_level(logging.WARNING, logger="asyncio")
    with LocalNatsServer(config_text=pki.server_tls_block()) as server:
        assert connect(server.url, TlsOptions(str(pki.ca_file))) is True
        options = ConnectionOptions(servers=(server.url,), connect_timeout=2,
                                    tls=TlsOptions(str(pki.ca_file)))
        js = JetStreamSession(options)
        try:
            server.stop()  # the server closes a live TLS connection
            deadline = time.monotonic() + 30
            while js.conn.nc.is_connected and time.monotonic() < deadline:
                js.run(asyncio.sleep(0.05))  # nats-py notices the close on the session's loop
        finally:
            js.close()
    assert not js.conn.nc.is_connected
    assert "eof_received" not in caplog.text
