"""How to reach and authenticate to NATS: servers, credentials, TLS.

Secrets are wrapped in :class:`Secret`, which never shows its value in ``repr``/``str``/logs.
They are read from files or environment variables, never taken from config literals.
"""

from __future__ import annotations

import importlib.util
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from js_etl.errors import ConfigError


class Secret:
    """A string that masks itself. ``reveal()`` is the only way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    @classmethod
    def from_env(cls, name: str, environ: Mapping[str, str] | None = None, *,
                 key: str | None = None) -> Secret:
        """The secret in environment variable ``name``. ``key`` is the setting that named it
        (e.g. ``nats.token_env``): given, errors name the setting and never its value, because
        the usual mistake is pasting the secret itself where the variable's name belongs."""
        env = os.environ if environ is None else environ
        if name not in env or not env[name]:
            if key:
                raise ConfigError(f"{key}: the environment variable it names is not set or empty "
                                  "(its name is not shown: it may be the secret itself); set "
                                  f"that variable, or fix {key}")
            raise ConfigError(f"environment variable {name} (named as a NATS secret) is not set")
        return cls(env[name])

    @classmethod
    def from_file(cls, path: str, *, key: str | None = None) -> Secret:
        """The secret in file ``path`` (stripped). With ``key``, errors name the setting, not
        the path (which may be the secret itself, pasted in the wrong place)."""
        try:
            with open(path, encoding="utf-8") as f:
                return cls(f.read().strip())
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            if key:
                raise ConfigError(f"{key}: cannot read the file it names ({reason}; the path is "
                                  "not shown: it may be the secret itself)") from None
            raise ConfigError(f"cannot read NATS secret file {path}: {reason}") from None

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable so options can travel to Spark executors.
        return (Secret, (self._value,))


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """TLS trust and client certificate. Any of them set means the connection must be TLS.

    The files are read where the connection opens (on each Spark executor too). A file that
    cannot be used is a :class:`ConfigError` (exit 2): retrying cannot make it readable. The CA
    and certificate paths are named in errors; the key's path is not (a pasted key stays out of
    logs).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def check_files(self) -> None:
        """Raise ConfigError naming the setting when a TLS file is missing or unreadable."""
        for key, path, shown in (("ca_file", self.ca_file, True),
                                 ("cert_file", self.cert_file, True),
                                 ("key_file", self.key_file, False)):
            if path is None:
                continue
            try:
                with open(path, "rb") as f:
                    f.read(1)
            except OSError as e:
                where = f" {path}" if shown else ""
                raise ConfigError(f"nats.tls.{key}: cannot read{where} ({e.strerror}); point it "
                                  "at a readable PEM file") from None

    def context(self) -> ssl.SSLContext:
        self.check_files()
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        except ssl.SSLError as e:
            raise ConfigError(f"nats.tls.ca_file: {self.ca_file} holds no usable PEM CA "
                              f"certificate ({_ssl_reason(e)})") from None
        if self.cert_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (ssl.SSLError, ValueError) as e:
                raise ConfigError(
                    f"nats.tls.cert_file / nats.tls.key_file: cannot use {self.cert_file} and its "
                    f"key as a client certificate ({_ssl_reason(e)}); both must be PEM, the key "
                    "unencrypted and matching the certificate") from None
        return ctx


def _scheme(server: str) -> str:
    """A server URL's scheme, lowercased; empty for a plain ``host:port`` (nats://)."""
    return server.split("://", 1)[0].lower() if "://" in server else ""


def _ssl_reason(e: Exception) -> str:
    reason = getattr(e, "reason", None) or str(e) or type(e).__name__
    return str(reason).splitlines()[0]


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Everything needed to open a NATS connection; picklable, secrets masked.

    >>> ConnectionOptions(servers=("nats://127.0.0.1:4222",), token=Secret("s3cr3t"))
    ConnectionOptions(servers=('nats://127.0.0.1:4222',), ..., token=Secret('***'), ...)
    """

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    name: str = "js-etl"
    connect_timeout: float = 5.0
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    token: Secret | None = None
    user: str | None = None
    password: Secret | None = None
    tls: TlsOptions | None = None
    domain: str | None = None  # JetStream domain: API prefix $JS.<domain>.API

    @property
    def requires_tls(self) -> bool:
        """A ``tls://`` or ``wss://`` URL, or any TLS setting: TLS or no connection at all
        (never a silent plaintext fallback to a server that does not offer TLS)."""
        return self.tls is not None or any(_scheme(s) in ("tls", "wss") for s in self.servers)

    @property
    def api_prefix(self) -> str:
        return f"$JS.{self.domain}.API" if self.domain else "$JS.API"

    def check(self) -> None:
        """Raise ConfigError (exit 2, naming the setting) for what this machine cannot connect
        with, found where nats-py would only fail inside its connect loop, retried like an
        unreachable server (exit 75):

        * a credentials or TLS file that cannot be read (the paths of the credential files are
          not shown: a seed pasted in place of a path would be echoed);
        * ``ws://``/``wss://`` servers without aiohttp, which nats-py's websocket transport
          needs (``js-etl[websocket]``)."""
        for key, path in (("nats.creds_file", self.creds_file),
                          ("nats.nkey_seed_file", self.nkey_seed_file)):
            if path is not None:
                Secret.from_file(path, key=key)
        if self.tls is not None:
            self.tls.check_files()
        websocket = [s for s in self.servers if _scheme(s) in ("ws", "wss")]
        if websocket and importlib.util.find_spec("aiohttp") is None:
            raise ConfigError(
                f"nats.servers: websocket URLs ({websocket[0]}) need aiohttp, which is not "
                "installed here: pip install 'js-etl[websocket]' where js-etl runs (the driver "
                "and every Spark executor), or use nats:// or tls:// URLs")

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.aio.client.Client.connect``."""
        self.check()
        kw: dict[str, Any] = {
            "servers": list(self.servers),
            "name": self.name,
            "connect_timeout": self.connect_timeout,
            # A batch job must fail fast and say why, not reconnect for minutes.
            "allow_reconnect": True,
            "max_reconnect_attempts": 3,
            "reconnect_time_wait": 0.5,
        }
        if self.creds_file:
            kw["user_credentials"] = self.creds_file
        if self.nkey_seed_file:
            kw["nkeys_seed"] = self.nkey_seed_file
        if self.token:
            kw["token"] = self.token.reveal()
        if self.user:
            kw["user"] = self.user
            kw["password"] = self.password.reveal() if self.password else None
        if self.tls:
            kw["tls"] = self.tls.context()
        return kw
