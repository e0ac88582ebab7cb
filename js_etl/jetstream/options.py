"""How to reach and authenticate to NATS: servers, credentials, TLS.

Secrets are wrapped in :class:`Secret`, which never shows its value in ``repr``/``str``/logs.
They are read from files or environment variables, never taken from config literals.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any

from js_etl.errors import ConfigError


class Secret:
    """A string that masks itself. ``reveal()`` is the only way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    @classmethod
    def from_env(cls, name: str, environ: dict[str, str] | None = None) -> Secret:
        env = os.environ if environ is None else environ
        if name not in env or not env[name]:
            raise ConfigError(f"environment variable {name} (named as a NATS secret) is not set")
        return cls(env[name])

    @classmethod
    def from_file(cls, path: str) -> Secret:
        try:
            with open(path, encoding="utf-8") as f:
                return cls(f.read().strip())
        except OSError as e:
            raise ConfigError(f"cannot read NATS secret file {path}: {e.strerror}") from e

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
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


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
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def api_prefix(self) -> str:
        return f"$JS.{self.domain}.API" if self.domain else "$JS.API"

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.aio.client.Client.connect``."""
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
        kw.update(self.extra)
        return kw
