"""Connecting: unreachable servers, token auth, a JetStream domain with v2 ack subjects, and the
blocking facade in reused Spark-style workers. Each server here is started and stopped by its test.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest
from streams import (
    ack,
    ack_confirmed,
    consumer,
    drained,
    pub,
    wait_until,
)

from js_etl.demo.server import LocalNatsServer, free_port
from js_etl.errors import TerminalError, TransientError
from js_etl.jetstream import (
    ConnectionOptions,
    ConsumerConfig,
    JetStreamSession,
    PullEnd,
    Secret,
    ack_subject,
)
from js_etl.jetstream.ack import Acker
from js_etl.jetstream.errors import AuthorizationError, NatsUnavailableError


def test_closed_port_fails_fast_as_unavailable():
    # Hold the port bound without listening: connects are refused, and no other process can
    # start a server on it meanwhile.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{held.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(NatsUnavailableError) as err:
            JetStreamSession(ConnectionOptions(servers=(url,), connect_timeout=0.5))
        elapsed = time.monotonic() - t0
    assert elapsed < 30  # a few quick retries (0.5 s apart), not minutes
    assert isinstance(err.value, TransientError)
    assert url in str(err.value)


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    # A store directory that does not exist yet: start() creates it before writing the config.
    store = tmp_path_factory.mktemp("token") / "not-yet"
    with LocalNatsServer(store, config_text="authorization { token: s3cret }\n") as server:
        yield server


@pytest.mark.parametrize("token", [Secret("wrong"), None], ids=["wrong-token", "no-token"])
def test_token_server_refuses_bad_credentials(token_server, token):
    options = ConnectionOptions(servers=(token_server.url,), connect_timeout=0.5, token=token)
    with pytest.raises(AuthorizationError) as err:
        JetStreamSession(options)
    assert isinstance(err.value, TerminalError)
    message = str(err.value)
    assert "refused the credentials" in message and "token" in message
    assert "authorization violation" in message.lower()  # the server's reason, not "no servers"
    assert "wrong" not in message


def test_token_server_accepts_the_token(token_server):
    options = ConnectionOptions(servers=(token_server.url,), connect_timeout=2,
                                token=Secret("s3cret"))
    assert "s3cret" not in repr(options) and "s3cret" not in str(options)
    assert "Secret('***')" in repr(options)
    with JetStreamSession(options) as js:
        js.run(js.admin.add_stream("TOK", ["tok.>"]))
        assert js.stream_info("TOK").name == "TOK"
    # Options cross to executors by pickle, token included.
    assert pickle.loads(pickle.dumps(options)).token.reveal() == "s3cret"


# --- JetStream domain, v2 ack subjects -----------------------------------------------------------
def test_domain_server_v2_ack_subject_parses_and_acks():
    config = "jetstream { domain: hub }\nfeature_flags { js_ack_fc_v2: true }\n"
    with LocalNatsServer(config_text=config) as server:
        options = ConnectionOptions(servers=(server.url,), connect_timeout=2, domain="hub")
        assert options.api_prefix == "$JS.hub.API"
        with JetStreamSession(options) as js, JetStreamSession(options) as js2:
            js.run(js.admin.add_stream("D", ["d.>"]))
            pub(js, "d.x", 3)
            js.run(js.admin.create_consumer("D", ConsumerConfig(durable_name="c")))
            result = js.pull(js.puller("D", "c"), 10)
            assert result.end is PullEnd.NO_MESSAGES and len(result.messages) == 3
            first = result.messages[0]
            tokens = first.reply.split(".")
            assert len(tokens) == 11 and tokens[:3] == ["$JS", "ACK", "hub"]
            meta = first.metadata
            assert (meta.domain, meta.stream, meta.consumer) == ("hub", "D", "c")
            assert meta.account_hash == tokens[3] and len(meta.account_hash) == 8
            assert (meta.num_delivered, meta.stream_seq, meta.consumer_seq) == (1, 1, 1)
            assert meta.num_pending == 2
            assert meta.ack_prefix == ".".join(tokens[:6])

            rebuilt = [ack_subject(m.metadata.ack_prefix, m.metadata.num_delivered,
                                   m.metadata.stream_seq, m.metadata.consumer_seq)
                       for m in result.messages]
            assert all(len(s.split(".")) == 11 for s in rebuilt)
            assert js2.run(ack_confirmed(js2, rebuilt[0])) is True
            ack(js2, rebuilt[1:])
            info = wait_until(lambda: js.consumer_info("D", "c"),
                              lambda i: i.num_ack_pending == 0)
            assert info.ack_floor.stream_seq == 3


# --- the blocking facade in reused workers -------------------------------------------------------
def _session_round(options: ConnectionOptions, stream: str, name: str) -> int:
    with JetStreamSession(options) as js:
        result = js.pull(js.puller(stream, name), 2)
        ack(js, [m.reply for m in result.messages])
        return len(result.messages)


def test_facade_in_a_thread_that_already_ran_asyncio(js, names, stream, nats_options):
    pub(js, f"{names.prefix}.a", 4)
    consumer(js, stream, names.consumer)
    outcome: list[object] = []

    def worker():
        try:
            asyncio.run(asyncio.sleep(0))  # a previous task of a reused worker
            # Two sessions in sequence, as two tasks on the same worker.
            outcome.append(_session_round(nats_options, stream, names.consumer))
            outcome.append(_session_round(nats_options, stream, names.consumer))
        except BaseException as e:  # surfaced by the assertion below
            outcome.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(20)
    assert outcome == [2, 2]
    info = wait_until(lambda: js.consumer_info(stream, names.consumer),
                      lambda i: i.num_ack_pending == 0)
    assert info.ack_floor.stream_seq == 4


def test_facade_in_a_process_that_already_ran_asyncio(js, names, stream, nats_server):
    pub(js, f"{names.prefix}.a", 4)
    consumer(js, stream, names.consumer)
    script = textwrap.dedent(f"""
        import asyncio
        from js_etl.jetstream import ConnectionOptions, JetStreamSession
        asyncio.run(asyncio.sleep(0))
        options = ConnectionOptions(servers=({nats_server.url!r},), connect_timeout=2)
        counts = []
        for _ in range(2):
            with JetStreamSession(options) as js:
                result = js.pull(js.puller({stream!r}, {names.consumer!r}), 2)
                js.run(js.acker.ack([m.reply for m in result.messages]))
                counts.append(len(result.messages))
        print(counts)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2, 2]"
    info = wait_until(lambda: js.consumer_info(stream, names.consumer),
                      lambda i: i.num_ack_pending == 0)
    assert info.ack_floor.stream_seq == 4


def test_closed_session_is_idempotent(nats_options):
    session = JetStreamSession(nats_options)
    session.close()
    session.close()
    assert session.conn.nc.is_closed


# --- server restarts -----------------------------------------------------------------------------
def _reconnected(js: JetStreamSession, count: int) -> bool:
    js.run(asyncio.sleep(0.05))  # nats-py reconnects on the session's loop, so let it run
    return js.conn.reconnects >= count and js.conn.nc.is_connected


def test_pulls_across_a_server_restart():
    with LocalNatsServer() as server:
        options = ConnectionOptions(servers=(server.url,), connect_timeout=2)
        with JetStreamSession(options) as js:
            js.run(js.admin.add_stream("R", ["r.>"]))
            js.run(js.admin.create_consumer("R", ConsumerConfig(durable_name="c")))
            puller = js.puller("R", "c")

            # A pull waiting on the server when it shuts down is told so, and it is transient.
            async def pull_during_restart():
                task = asyncio.create_task(puller.pull(5, expires=5, timeout=3))
                await asyncio.sleep(0.2)
                await asyncio.to_thread(server.restart)
                return await task

            shut = js.run(pull_during_restart())
            assert shut.end is PullEnd.ERROR and str(shut.status) == "409 Server Shutdown"
            with pytest.raises(NatsUnavailableError) as err:
                shut.raise_for_status()
            assert isinstance(err.value, TransientError)

            # After the reconnect the same puller works again.
            wait_until(lambda: _reconnected(js, 1), bool, timeout=5)
            pub(js, "r.x", 3)
            # A no_wait pull answers 404 from the consumer's pending count (nats-server
            # processNextMsgRequest: numPending()), which counts a stored message a moment
            # after its PubAck: with two suites on the box a pull got 404 with all 3 stored.
            # Consumer info reports that same count: wait for it, then pull.
            wait_until(lambda: js.consumer_info("R", "c").num_pending, lambda n: n == 3)
            again = js.pull(puller, 5, timeout=3)
            assert again.end is PullEnd.NO_MESSAGES and len(again.messages) == 3

            # A pull sent on a connection that died under it (the client has not noticed yet, so
            # the request is lost) ends after a reconnect: reported as DISCONNECTED, never as a
            # drained consumer.
            server.stop()

            async def pull_while_down():
                task = asyncio.create_task(puller.pull(5, timeout=1.5))
                await asyncio.sleep(0.1)
                await asyncio.to_thread(server.start)
                return await task

            down = js.run(pull_while_down())
            assert down.end is PullEnd.DISCONNECTED and not drained(down.end)
            with pytest.raises(NatsUnavailableError, match="dropped"):
                down.raise_for_status()
            wait_until(lambda: _reconnected(js, 2), bool, timeout=5)
            ack(js, [m.reply for m in again.messages])
            info = wait_until(lambda: js.consumer_info("R", "c"), lambda i: i.num_ack_pending == 0)
            assert info.ack_floor.stream_seq == 3


def test_a_session_the_server_closed_as_stale_answers_its_next_request(tmp_path):
    """A synchronous session's loop runs only during calls, so while its caller works (a driver
    waiting on Spark) the server's PINGs go unanswered and the server closes the connection as
    stale. The next API request must still be answered, not time out into a failed run."""
    http = free_port()
    server = LocalNatsServer(tmp_path, config_text=(
        f'http: 127.0.0.1:{http}\nping_interval: "200ms"\nping_max: 1\n')).start()
    try:
        with JetStreamSession(ConnectionOptions(servers=(server.url,), name="idle")) as js:
            js.run(js.admin.add_stream("STALE", ["stale.>"]))

            def closed_as_stale() -> list[dict]:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{http}/connz?state=closed", timeout=5) as answer:
                    return [c for c in json.load(answer).get("connections") or []
                            if c.get("name") == "idle" and "Stale" in c.get("reason", "")]

            # We idle until every connection the session has had (reconnects + 1) is closed
            # as stale, the current one included.
            wait_until(lambda: len(closed_as_stale()) > js.conn.reconnects, bool, timeout=60)
            dropped = js.conn.reconnects
            assert js.stream_info("STALE").name == "STALE"  # answered, once resent ...
            # ... over a new connection. (More than one new one on a loaded box: with 200 ms
            # pings a connection can be closed as stale again before the answer comes; seen with
            # two copies of the suite side by side.)
            assert js.conn.reconnects > dropped
    finally:
        server.stop()


# --- websocket ---------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:parameter 'timeout' of type 'float':DeprecationWarning")
def test_a_websocket_url_carries_pulls_and_confirmed_acks():
    """A ``ws://`` URL (nats-py's websocket transport, ``js-etl[websocket]``) to a server's
    websocket listener: the pulls' frames reach js-etl's frame parser as over TCP, headers
    included, and an ack block is confirmed applied."""
    port = free_port()
    listener = f'websocket {{ listen: "127.0.0.1:{port}", no_tls: true }}\n'
    with LocalNatsServer(config_text=listener):
        options = ConnectionOptions(servers=(f"ws://127.0.0.1:{port}",), connect_timeout=2)
        with JetStreamSession(options) as js:
            js.run(js.admin.add_stream("WS", ["ws.>"]))
            js.run(js.conn.publish("ws.a", b"over websocket", {"Kind": "ws"}))
            pub(js, "ws.b", 2)
            consumer(js, "WS", "c")
            result = js.pull(js.puller("WS", "c"), 10)
            assert (result.end, len(result.messages)) == (PullEnd.NO_MESSAGES, 3)
            first = result.messages[0]
            assert (first.subject, bytes(first.data)) == ("ws.a", b"over websocket")
            assert first.headers == {"Kind": ["ws"]}
            assert ack(js, [m.reply for m in result.messages]) == 3
            info = js.consumer_info("WS", "c")
            assert (info.num_ack_pending, info.ack_floor.stream_seq) == (0, 3)


# --- subjects this user may not use ------------------------------------------------------------
_USERS = """
jetstream { domain: hub }
authorization {
  users = [
    {user: admin, password: a}
    {user: nopull, password: p, permissions: {
        publish: {deny: ["$JS.API.CONSUMER.MSG.NEXT.>"]}, subscribe: {allow: [">"]}}}
    {user: noack, password: p, permissions: {
        publish: {deny: ["$JS.ACK.>"]}, subscribe: {allow: [">"]}}}
    {user: noinbox, password: p, permissions: {subscribe: {deny: ["_INBOX.>"]}}}
  ]
}
"""


def test_a_subject_the_user_may_not_use_is_a_terminal_error_naming_it_not_a_timeout():
    """The server drops a command the user may not send and says so only in an ``-ERR``: a pull
    would end as if the consumer were at max_ack_pending (five empty rounds later a drain would
    end "nothing_fetched", exit 0), a request or an ack block as if JetStream did not answer
    (exit 75, retried for ever). Each is an AuthorizationError (exit 2) naming the subject to
    allow, as the server checks it: a JetStream domain's ``$JS.hub.API`` as ``$JS.API``."""
    with LocalNatsServer(config_text=_USERS) as server:
        def session(user: str) -> JetStreamSession:
            return JetStreamSession(ConnectionOptions(
                servers=(server.url,), connect_timeout=2, user=user, domain="hub",
                password=Secret("a" if user == "admin" else "p")))

        with session("admin") as admin:
            admin.run(admin.admin.add_stream("P", ["p.>"]))
            pub(admin, "p.x", 3)
            consumer(admin, "P", "c")
            pulled = admin.pull(admin.puller("P", "c"), 3)
            replies = [m.reply for m in pulled.messages]

        with session("nopull") as js:
            with pytest.raises(AuthorizationError) as denied:
                js.pull(js.puller("P", "c"), 10, timeout=1)
            assert "not allow this user to publish to $JS.API.CONSUMER.MSG.NEXT.P.c" in str(
                denied.value)
            assert js.consumer_info("P", "c").num_ack_pending == 3  # the rest works
        with session("noack") as js:
            acker = Acker(js.conn, confirm_timeout=0.5, attempts=1)
            with pytest.raises(AuthorizationError, match=r"publish to \$JS\.ACK\.P\.c\.> "):
                js.run(acker.ack(replies))
        with session("noinbox") as js:
            with pytest.raises(AuthorizationError, match=r"subscribe to _INBOX\.> "):
                js.run(js.conn.request("STREAM.INFO.P", timeout=0.5))

        assert isinstance(denied.value, TerminalError) and denied.value.exit_code == 2
        with session("admin") as admin:  # nothing was acked by the refused blocks
            assert admin.consumer_info("P", "c").num_ack_pending == 3
