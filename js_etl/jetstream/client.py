"""The NATS connection js-etl talks JetStream over.

We use nats-py for what it does well (connecting, auth, TLS, reconnects, the parser) and hook
one private method, ``Client._process_msg``, for the subscriptions of our pulls only. That hook
hands each frame to the pull as raw bytes, which buys us two things nats-py cannot give:

* every value of a repeated header (nats-py's parsed ``headers`` dict keeps only the last), and
* no per-message ``Msg`` object, header dict or queue hop on the hot path.

nats-py is pinned exactly in ``pyproject.toml`` because of this hook.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import nats.aio.client
import nats.errors

from js_etl.jetstream.errors import (
    AuthorizationError,
    JetStreamError,
    NatsUnavailableError,
    api_error,
)
from js_etl.jetstream.options import ConnectionOptions

# (subject, reply, payload, raw header block or None) -> None
FrameSink = Callable[[bytes, bytes, bytes, bytes | None], None]


class _RawClient(nats.aio.client.Client):
    """A nats-py client that passes frames of registered sids straight to a sink."""

    def __init__(self) -> None:
        super().__init__()
        self.raw_sinks: dict[int, FrameSink] = {}

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        sink = self.raw_sinks.get(sid)
        if sink is None:
            await super()._process_msg(sid, subject, reply, data, headers)
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

    def __init__(self, nc: _RawClient, options: ConnectionOptions) -> None:
        self.nc = nc
        self.options = options
        self.last_error: BaseException | None = None

    @classmethod
    async def open(cls, options: ConnectionOptions) -> JetStreamConnection:
        nc = _RawClient()
        errors: list[BaseException] = []

        async def on_error(e: BaseException) -> None:
            errors.append(e)

        try:
            await nc.connect(error_cb=on_error, **options.connect_kwargs())
        except Exception as e:  # nats-py raises several unrelated types here
            raise _connect_error(e, errors, options) from e
        conn = cls(nc, options)

        async def keep_last(e: BaseException) -> None:
            conn.last_error = e

        nc._error_cb = keep_last
        return conn

    @property
    def reconnects(self) -> int:
        return int(self.nc.stats["reconnects"])

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
            msg = await self.nc.request(subject, payload, timeout=timeout)
        except nats.errors.NoRespondersError as e:
            raise NatsUnavailableError(
                f"no JetStream answered {subject}: is JetStream enabled on the server "
                f"(nats-server -js), and is the domain right?") from e
        except nats.errors.TimeoutError as e:
            raise NatsUnavailableError(f"JetStream did not answer {subject} in {timeout}s") from e
        except nats.errors.ConnectionClosedError as e:
            raise NatsUnavailableError(f"connection closed during {subject}") from e
        data = json.loads(msg.data) if msg.data else {}
        if "error" in data:
            raise api_error(data["error"])
        return data


def _connect_error(e: BaseException, seen: list[BaseException],
                   options: ConnectionOptions) -> JetStreamError:
    servers = ", ".join(options.servers)
    text = " ".join(str(x) for x in [*seen, e]).lower()
    refusals = ("authorization", "authentication", "permissions")
    if any(word in text for word in refusals):
        # After the retries nats-py raises NoServersError; name the server's refusal instead.
        cause = next(x for x in [*seen, e] if any(word in str(x).lower() for word in refusals))
        return AuthorizationError(f"NATS refused the credentials at {servers}: "
                                  f"check nats.creds_file / token / user settings ({cause})")
    if isinstance(e, ValueError | OSError) and "seed" in text:
        return AuthorizationError(f"cannot use the nkey seed/creds file: {e}")
    return NatsUnavailableError(f"cannot connect to NATS at {servers}: "
                                f"{type(e).__name__}: {e or (seen[-1] if seen else '')}")

