"""The NATS connection js-etl talks JetStream over.

We use nats-py for what it does well (connecting, auth, TLS, reconnects, parsing) and hook
one private method, ``Client._process_msg``, for the subscriptions of our pulls only. That hook
hands each frame to the pull as raw bytes, which buys us two things nats-py cannot give:

* every value of a repeated header (nats-py's parsed ``headers`` dict keeps only the last), and
* no per-message ``Msg`` object, header dict or queue hop on the hot path.

The frames of those subscriptions are also cut from the read buffer by our own parser
(:class:`_FrameParser`), which leaves everything else to nats-py's.

Also ours, on nats-py's connect path (:class:`_TcpTransport`, ``_RawClient``'s connect
overrides): every connection attempt, TLS handshake included, ends within ``connect_timeout``;
a certificate that does not verify, or a server without TLS when TLS is required, ends the
connect at once (terminal).

None of these hooks is nats-py's public API, so ``pyproject.toml`` states the range of nats-py
whose two ends the suite runs (``tests/jetstream/test_nats_py_range.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import ParseResult

import nats.aio.client
import nats.errors
from nats.aio.transport import TcpTransport
from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE, Parser

from js_etl.errors import JsEtlError
from js_etl.jetstream.errors import (
    AuthorizationError,
    JetStreamError,
    NatsUnavailableError,
    TlsError,
    api_error,
)
from js_etl.jetstream.options import ConnectionOptions

# (subject, reply, payload, raw header block or None) -> None. The payload may be a view of
# the parser's read buffer, valid only during the call: a sink copies what it keeps (the parser
# releases the view after the call, so a view kept fails with ValueError when used).
FrameSink = Callable[[bytes, bytes, bytes | memoryview, bytes | None], None]


class _TlsStreamProtocol(asyncio.StreamReaderProtocol):
    """The stream protocol of an upgraded (STARTTLS-style) connection.

    ``loop.start_tls`` never calls ``connection_made`` on it, so asyncio's own protocol does not
    know it runs over TLS and answers EOF with "keep open", which asyncio's TLS layer logs as
    ``returning true from eof_received() has no effect when using ssl`` on every close.
    """

    def eof_received(self) -> bool:
        super().eof_received()
        return False


# How much a connection reads from its socket's stream at once (nats-py: 32 KiB), and how much
# that stream buffers before it pauses the socket. asyncio's stream copies what is left after
# each read to its front, and a pull's frames arrive far faster than 32 KiB at a time, so with
# small reads every byte was moved several times (docs/design/nats-client.md).
READ_SIZE = 256 << 10


class _TcpTransport(TcpTransport):
    """nats-py's TCP transport, fixed for a TLS handshake that fails or times out, and reading
    :data:`READ_SIZE` at a time.

    nats-py hands the socket to ``loop.start_tls``; when the handshake fails, asyncio closes the
    socket under the TLS layer, and the plain stream nats-py then waits on to close is never told:
    ``Client._close`` awaited it for ever, so a certificate the client cannot verify hung the
    connect past ``connect_timeout``. After a failed upgrade there is nothing left to wait for.
    """

    def __init__(self) -> None:
        super().__init__()
        self._upgrade_failed = False

    async def connect(self, uri: ParseResult, buffer_size: int, connect_timeout: float) -> None:
        self._upgrade_failed = False
        await super().connect(uri, READ_SIZE, connect_timeout)  # type: ignore[arg-type]

    async def read(self, buffer_size: int) -> bytes:
        return await super().read(READ_SIZE)

    async def connect_tls(self, uri: str | ParseResult, ssl_context: ssl.SSLContext,
                          buffer_size: int, connect_timeout: float) -> None:
        assert self._io_writer, "connect must be called first"
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=READ_SIZE)
        protocol = _TlsStreamProtocol(reader)
        hostname = uri if isinstance(uri, str) else uri.hostname
        try:
            transport = await asyncio.wait_for(
                loop.start_tls(self._io_writer.transport, protocol, ssl_context,
                               server_hostname=hostname), connect_timeout)
        except BaseException:
            self._upgrade_failed = True
            raise
        assert transport is not None  # start_tls returns a transport or raises
        self._io_reader = reader
        self._io_writer = asyncio.StreamWriter(transport, protocol, reader, loop)

    async def wait_closed(self) -> None:
        if self._upgrade_failed:
            return  # start_tls closed the socket itself; no callback will ever come
        await super().wait_closed()


class _ConnectRefused(Exception):
    """Ends nats-py's connect loop at once: not an ``OSError`` or ``nats.errors.Error``, which
    it would retry. Only raised on the first connect of a client (see ``_RawClient``)."""

    def __init__(self, error: JsEtlError) -> None:
        super().__init__(str(error))
        self.error = error


class _FrameParser(Parser):
    """nats-py's protocol parser with a fast path for the frames of raw sinks: ``MSG`` and
    ``HMSG`` frames of a registered sid are cut from the read buffer and handed to the sink
    directly, the payload as a view of the read buffer, and the buffer is trimmed once per
    read. Anything else (another sid, ``PING``, ``INFO``, ``-ERR``, a malformed line) stops the
    fast path and nats-py's parser reads the rest of the buffer as it always did.

    Why: nats-py's parser costs a regex match, a dict of arguments, two payload copies and a
    coroutine per frame, a large share of a fetch task's work on small messages
    (docs/design/nats-client.md). ``tests/unit/jetstream/test_frame_parser.py`` checks it hands
    over exactly what nats-py's parser does, split at every read boundary. nats-py's
    ``stats["in_msgs"]`` no longer counts these frames; nothing reads it.
    """

    _taken = 0  # bytes at the buffer's start already handed to sinks

    def reset(self) -> None:  # a new connection: nothing of the new buffer is handed over yet
        super().reset()
        self._taken = 0

    async def parse(self, data: bytes = b"") -> None:
        self.buf.extend(data)
        if self.state == AWAITING_CONTROL_LINE:
            try:
                with memoryview(self.buf) as view:
                    rest_for_nats_py = self._sink_frames(view)
            finally:  # the views released first: a viewed bytearray cannot shrink
                taken, self._taken = self._taken, 0
                del self.buf[:taken]
            if not rest_for_nats_py:
                return
        await super().parse()

    def _sink_frames(self, view: memoryview) -> bool:
        """Hands the buffer's leading complete frames of raw sinks to them; returns whether
        what follows is for nats-py's parser (rather than nothing, or an incomplete frame,
        which waits for the next read)."""
        buf, end = self.buf, len(self.buf)
        sinks: dict[int, FrameSink] = self.nc.raw_sinks
        while self._taken < end:
            pos = self._taken
            eol = buf.find(b"\r\n", pos, pos + MAX_CONTROL_LINE_SIZE)
            if eol < 0:  # a line nats-py refuses as too long, or one still arriving
                return end - pos >= MAX_CONTROL_LINE_SIZE
            line = view[pos:eol].tobytes()
            args = line.split(b" ")
            if args != line.split():  # other whitespace, doubled, leading or trailing: nats-py's
                return True  # regexes decide: they refuse some such lines
            n = len(args)
            # MSG <subject> <sid> [reply] <size> | HMSG <subject> <sid> [reply] <hsize> <size>
            if n in (4, 5) and args[0] == b"MSG":
                hsize, reply = b"0", args[3] if n == 5 else b""
            elif n in (5, 6) and args[0] == b"HMSG":
                hsize, reply = args[-2], args[3] if n == 6 else b""
            else:
                return True
            if not (args[2].isdigit() and hsize.isdigit() and args[-1].isdigit()):
                return True  # malformed: nats-py raises its ProtocolError
            sink = sinks.get(int(args[2]))
            header_size, size = int(hsize), int(args[-1])
            if sink is None or header_size > size:
                return True
            start = eol + 2
            if start + size + 2 > end:
                return False
            headers = view[start:start + header_size].tobytes() if header_size else None
            self._taken = start + size + 2  # before the sink runs, as nats-py does
            # The payload as a view, no copy here: the sink copies it once, where it keeps it.
            # Released after the call, also when the sink raised (its frame, kept by the
            # traceback, still holds the view): else the buffer could not be trimmed, and a
            # view a sink kept fails loudly (ValueError) instead.
            payload = view[start + header_size:start + size]
            try:
                sink(args[1], reply, payload, headers)
            finally:
                payload.release()
        return False


class _RawClient(nats.aio.client.Client):
    """A nats-py client that passes frames of registered sids straight to a sink, and whose
    connect attempts are bounded, verified and never downgraded (see the module docstring)."""

    def __init__(self, *, require_tls: bool = False) -> None:
        super().__init__()
        self._ps = _FrameParser(self)
        self.raw_sinks: dict[int, FrameSink] = {}
        self.require_tls = require_tls
        self._first_connect = False
        self._attempt_deadline = 0.0

    async def connect(self, *args: Any, **kwargs: Any) -> None:
        self._first_connect = True
        try:
            await super().connect(*args, **kwargs)
        finally:
            self._first_connect = False

    async def _connect_to_server(self, s: Any) -> None:
        # One deadline for the whole attempt: TCP connect, INFO, TLS handshake, CONNECT/PONG.
        # nats-py gives each step its own connect_timeout, so one attempt could take four.
        timeout = float(self.options["connect_timeout"])
        self._attempt_deadline = asyncio.get_running_loop().time() + timeout
        if s.uri.scheme in ("ws", "wss"):
            async with asyncio.timeout_at(self._attempt_deadline):
                await super()._connect_to_server(s)
            return
        s.last_attempt = time.monotonic()
        if not isinstance(self._transport, _TcpTransport):
            self._transport = _TcpTransport()
        async with asyncio.timeout_at(self._attempt_deadline):
            await self._transport.connect(s.uri, nats.aio.client.DEFAULT_BUFFER_SIZE, timeout)

    async def _process_connect_init(self) -> None:
        try:
            async with asyncio.timeout_at(self._attempt_deadline):
                await super()._process_connect_init()
        except ssl.SSLCertVerificationError as e:
            if not self._first_connect:
                raise  # a reconnect: nats-py retries, then gives up and reports it
            raise _ConnectRefused(_unverified(self._server_url(), e,
                                              self.options.get("tls") is not None)) from e

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False
                            ) -> None:
        await super()._process_info(info, initial_connection)
        server = self._current_server
        if not (initial_connection and self.require_tls) or server is None:
            return
        if server.uri.scheme == "wss" or info.get("tls_required"):
            return  # already TLS (websocket over TLS), or nats-py upgrades now
        if info.get("tls_available"):
            # The server allows both: nats-py upgrades only when TLS is required, so require it.
            info["tls_required"] = True
            return
        if not self._first_connect:
            raise nats.errors.Error("nats: secure connection not available")
        raise _ConnectRefused(TlsError(
            f"secure connection not available: {self._server_url()} does not offer TLS, and "
            "a tls:// URL or nats.tls.* setting requires it; enable TLS on the server, or use "
            "a nats:// URL without nats.tls settings"))

    def _server_url(self) -> str:
        server = self._current_server
        return server.uri.geturl() if server is not None else "the server"

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        sink = self.raw_sinks.get(sid)
        if sink is None:
            # nats-py passes None for a message without headers, though it annotates bytes.
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        sink(subject, reply, data, headers)

    async def publish_block(self, block: bytes, count: int) -> int:
        """Queue ``count`` ready-made PUB commands (``block``) as one write; returns the count."""
        if not self.is_connected:
            raise NatsUnavailableError("not connected to NATS: cannot publish acks")
        if count:
            await self._send_command(block)
            await self._flush_pending()
            self.stats["out_msgs"] += count
        return count



class JetStreamConnection:
    """One NATS connection plus JetStream request plumbing (async).

    >>> conn = await JetStreamConnection.open(ConnectionOptions(servers=("nats://127.0.0.1:4222",)))
    >>> info = await conn.request("STREAM.INFO.ORDERS")
    >>> await conn.close()
    """

    def __init__(self, nc: _RawClient, options: ConnectionOptions,
                 server_errors: _ServerErrors) -> None:
        self.nc = nc
        self.options = options
        self._server_errors = server_errors

    @classmethod
    async def open(cls, options: ConnectionOptions) -> JetStreamConnection:
        kwargs = options.connect_kwargs()  # a bad TLS file is a ConfigError here, not a retry
        nc = _RawClient(require_tls=options.requires_tls)
        server_errors = _ServerErrors()
        try:
            await nc.connect(error_cb=server_errors.record, **kwargs)
        except _ConnectRefused as e:
            await _abandon(nc)
            raise e.error from None
        except Exception as e:  # nats-py raises several unrelated types here
            await _abandon(nc)
            raise _connect_error(e, server_errors.of_connect, options) from e
        server_errors.connected = True
        return cls(nc, options, server_errors)

    def refused(self, subject: str) -> AuthorizationError | None:
        """Why a command this connection sent went unanswered, if the server refused it: a
        publish to ``subject`` (a prefix when it ends with ``.``) or a subscription (a
        request's or a pull's inbox) this user may not make. The server drops such a command
        and says so only in an ``-ERR``, which nats-py hands to its error callback: a request
        or a pull then just times out. Relies on that ``-ERR`` having come by then: the server
        sends it as it reads the command, and the callers ask only after a timeout of their
        own (a pull's deadline, a request's timeout). Not a ``PING`` to make sure: nats-py's
        ``flush`` that times out leaves its future behind, and the late ``PONG`` of a slow
        server then breaks the connection's reading (``InvalidStateError``)."""
        prefix = self.options.api_prefix + "."
        if subject.startswith(prefix):  # a domain's $JS.<domain>.API is checked as $JS.API
            subject = "$JS.API." + subject[len(prefix):]
        return self._server_errors.refusal(subject)

    @property
    def reconnects(self) -> int:
        return int(self.nc.stats["reconnects"])

    @property
    def auth_required(self) -> bool:
        """Whether the server's INFO asked for credentials. A server without authorization
        accepts a connection that sends a token or a password and ignores them."""
        return bool(self.nc._server_info.get("auth_required"))

    async def close(self) -> None:
        if not self.nc.is_closed:
            try:
                await self.nc.close()
            except Exception:  # closing a broken connection must not mask the real error
                pass

    async def request(self, api: str, body: dict[str, Any] | None = None,
                      timeout: float = 5.0) -> dict[str, Any]:
        """Send ``$JS.API.<api>`` and return the JSON answer, raising typed errors."""
        subject = f"{self.options.api_prefix}.{api}"
        payload = json.dumps(body).encode() if body is not None else b""
        try:
            reconnects = self.reconnects
            try:
                msg = await self.nc.request(subject, payload, timeout=timeout)
            except nats.errors.TimeoutError:
                if self.reconnects == reconnects:
                    raise
                # The request went out on a socket the server had already closed, and nats-py
                # reconnected while we waited: send it once more. This is what a synchronous
                # session meets after idling: its event loop runs only during calls, so the
                # server's PINGs go unanswered and the server closes the connection as stale
                # (defaults ping_interval 2 min, ping_max 2: after 4-6 idle minutes, e.g. a long
                # Spark phase; tests/jetstream/test_jetstream_connection.py). The API calls
                # js-etl makes are reads or idempotent (INFO, MSG.GET, consumer create with the
                # same config).
                msg = await self.nc.request(subject, payload, timeout=timeout)
        except nats.errors.NoRespondersError as e:
            raise NatsUnavailableError(
                f"no JetStream answered {subject}: is JetStream enabled on the server "
                f"(nats-server -js), and is the domain right?") from e
        except nats.errors.TimeoutError as e:
            raise self.refused(subject) or NatsUnavailableError(
                f"JetStream did not answer {subject} in {timeout}s") from e
        except nats.errors.ConnectionClosedError as e:
            raise NatsUnavailableError(f"connection closed during {subject}") from e
        data = json.loads(msg.data) if msg.data else {}
        if "error" in data:
            raise api_error(data["error"])
        return data


    async def publish(self, subject: str, payload: bytes, headers: dict[str, str],
                      timeout: float = 5.0) -> dict[str, Any]:
        """Publish into a stream and return its PubAck, raising typed errors (e.g. a
        ``Nats-Expected-Last-Subject-Sequence`` header that does not hold)."""
        try:
            msg = await self.nc.request(subject, payload, timeout=timeout, headers=headers)
        except nats.errors.NoRespondersError as e:
            raise NatsUnavailableError(f"no stream captures {subject}") from e
        except nats.errors.TimeoutError as e:
            raise self.refused(subject) or NatsUnavailableError(
                f"JetStream did not acknowledge {subject} in {timeout}s") from e
        except nats.errors.ConnectionClosedError as e:
            raise NatsUnavailableError(f"connection closed during a publish to {subject}"
                                       ) from e
        data = json.loads(msg.data) if msg.data else {}
        if "error" in data:
            raise api_error(data["error"])
        return data


# The server's -ERR for a command this user may not send, as nats-py hands it on (lowercased).
_DENIED = re.compile(r'permissions violation for (publish|subscription) to "?([^"\s]+)')


class _ServerErrors:
    """nats-py's error callback of one connection: the errors of its connect (for the one line
    that says why it failed), then the last subjects the server refused this user
    (:meth:`JetStreamConnection.refused`); other errors reach the calls they break."""

    def __init__(self) -> None:
        self.connected = False
        self.of_connect: list[BaseException] = []
        # (publish|subscription, subject): a few are enough, and a refused ack block would
        # otherwise add one a message.
        self.denied: deque[tuple[str, str]] = deque(maxlen=16)

    async def record(self, error: BaseException) -> None:
        if not self.connected:
            self.of_connect.append(error)
        elif found := _DENIED.search(str(error)):
            self.denied.append((found[1], found[2]))

    def refusal(self, subject: str) -> AuthorizationError | None:
        wanted = subject.lower()  # nats-py lowercases the server's error
        for kind, denied in reversed(self.denied):
            if kind == "subscription":  # an inbox (nats-py's _INBOX): nothing here is answered
                what = "subscribe to _INBOX.>" if denied.startswith("_inbox.") else (
                    f"subscribe to {denied}")
            elif denied == wanted or (wanted.endswith(".") and denied.startswith(wanted)):
                what = f"publish to {subject}>" if wanted.endswith(".") else (
                    f"publish to {subject}")
            else:
                continue
            return AuthorizationError(
                f"NATS does not allow this user to {what} (the server's permissions "
                "violation): allow it for the user js-etl connects as (js-etl's docs, Running, "
                "\"Permissions\", list the subjects it uses)")
        return None


async def _abandon(nc: _RawClient) -> None:
    """Close the socket of a connect that failed or was refused (no task runs on it yet), and
    a websocket transport's aiohttp session (else "Unclosed client session" follows the run's
    error line at exit; the transport's own ``wait_closed`` waits for ever on nats-py 2.14 when
    no websocket was opened)."""
    transport = nc._transport
    if transport:
        transport.close()
        session = getattr(transport, "_client", None)
        if session is not None:
            with contextlib.suppress(Exception):
                await session.close()


def _unverified(server: str, e: ssl.SSLCertVerificationError, tls_given: bool) -> TlsError:
    if tls_given:
        fix = ("check nats.tls.ca_file: it must hold the CA that signed the server's "
               "certificate, and the URL's host must be named in that certificate")
    else:
        fix = ("the system's trust store was used: set nats.tls.ca_file to the CA that signed "
               "the server's certificate")
    return TlsError(f"the TLS certificate of {server} does not verify: "
                    f"{e.verify_message or e.reason} ({fix})")


def _connect_error(e: BaseException, seen: list[BaseException],
                   options: ConnectionOptions) -> JetStreamError:
    servers = ", ".join(options.servers)
    causes = [*seen, e]
    text = " ".join(str(x) for x in causes).lower()
    refusals = ("authorization", "authentication", "permissions")
    if any(word in text for word in refusals):
        # After the retries nats-py raises NoServersError; name the server's refusal instead.
        cause = next(x for x in causes if any(word in str(x).lower() for word in refusals))
        return AuthorizationError(f"NATS refused the credentials at {servers}: "
                                  f"check nats.creds_file / token / user settings ({cause})")
    if isinstance(e, ValueError | OSError) and "seed" in text:
        return AuthorizationError(f"cannot use the nkey seed/creds file: {e}")
    # A wss:// URL: aiohttp's connector error carries ssl's, after nats-py's retries.
    unverified = next((c for x in causes if isinstance(
        c := getattr(x, "certificate_error", None), ssl.SSLCertVerificationError)), None)
    if unverified is not None:
        return _unverified(servers, unverified, options.tls is not None)
    alert = next((x for x in causes if isinstance(x, ssl.SSLError)
                  and "alert" in str(x).lower()), None)
    if alert is not None:
        # The server ended the handshake with an alert: it does not accept our certificate
        # (or our lack of one). Retrying cannot change that.
        reason = getattr(alert, "reason", None) or str(alert)
        fix = ("it requires a client certificate: set nats.tls.cert_file and nats.tls.key_file"
               if "certificate_required" in str(alert).lower() else
               "check nats.tls.cert_file / nats.tls.key_file: the server must trust the CA "
               "that signed the client certificate")
        return TlsError(f"the server at {servers} refused the TLS connection ({reason}): {fix}")
    # The most telling cause: nats-py ends with NoServersError, which says nothing.
    cause = next((x for x in reversed(causes) if not isinstance(x, nats.errors.NoServersError)),
                 e)
    if isinstance(cause, TimeoutError | asyncio.TimeoutError):
        why = (f"no answer within nats.connect_timeout ({options.connect_timeout:g}s) on any "
               "attempt")
    else:
        why = f"{type(cause).__name__}: {cause}"
    return NatsUnavailableError(f"cannot connect to NATS at {servers}: {why}")
