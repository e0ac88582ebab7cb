"""The ``nats`` connection type and its hook: the only code that reads an Airflow Connection.

One private builder (:func:`_resolve`) turns a Connection into a validated
:class:`~js_etl.config.NatsConfig` plus the secret values it names. Everything else derives from
that one result, so the client, ``test_connection()``, the trigger and the spark-submit job can
never disagree about how a connection is read:

* :meth:`JetStreamHook.connection_options` — :class:`~js_etl.jetstream.ConnectionOptions` for the
  JetStream layer (secrets wrapped in :class:`~js_etl.jetstream.Secret`);
* :meth:`JetStreamHook.job_environment` — ``JS_ETL__NATS__*`` variables for the spark-submit child
  process. Secrets travel as the *values* of two variables the config names
  (``nats.token_env``/``nats.password_env``), never on a command line and never in the YAML.
* :meth:`JetStreamHook.cluster_handoff` — the same for a driver in cluster deploy mode, which
  gets no environment from the worker: ``--set`` items and files shipped beside the driver,
  the secrets in files.

Connection fields (``conn_type: nats``):

============  ================================================================================
host          one server or a comma-separated list: ``nats-1:4222,nats-2``, ``tls://n:4222``
port          default port for hosts given without one (default 4222)
login         user name (needs password)
password      password (secret)
extra         ``token`` (secret), ``creds_file``, ``nkey_seed_file``, ``tls_ca_file``,
              ``tls_cert_file``, ``tls_key_file``, ``domain``, ``connect_timeout``, ``name``
============  ================================================================================
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from js_etl.config import ENV_PREFIX, NatsConfig, TlsConfig
from js_etl.config.values import as_url, with_port
from js_etl.errors import ConfigError, JsEtlError

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from js_etl.jetstream import ConnectionOptions, ConsumerInfo, JetStreamSession

DEFAULT_PORT = 4222

# The environment variables that carry secret *values* to the job; the config only names them.
TOKEN_ENV = "JS_ETL_NATS_TOKEN"
PASSWORD_ENV = "JS_ETL_NATS_PASSWORD"

# extra key -> what it is (shown in the error for an unknown key)
EXTRA_FIELDS: dict[str, str] = {
    "token": "auth token (secret)",
    "creds_file": "path of a .creds file (JWT + nkey seed)",
    "nkey_seed_file": "path of an nkey seed file",
    "tls_ca_file": "path of a CA bundle that verifies the servers",
    "tls_cert_file": "path of a client certificate (needs tls_key_file)",
    "tls_key_file": "path of the client certificate's key (needs tls_cert_file)",
    "domain": "JetStream domain (leaf-node setups)",
    "connect_timeout": "seconds to establish the connection (number, or e.g. '5s')",
    "name": "client name shown in server monitoring",
}


@dataclass(frozen=True)
class _Resolved:
    """A connection read once: the job's own validated NATS config, plus the secret values it
    names by environment variable. ``repr`` never shows the secrets."""

    config: NatsConfig
    secrets: dict[str, str] = dataclasses.field(repr=False)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _servers(conn_id: str, host: str | None, port: int | None) -> list[str]:
    if _blank(host):
        raise ConfigError(f"NATS connection {conn_id!r}: host is empty; set it to a server "
                          "(e.g. 127.0.0.1) or a comma-separated list (nats-1:4222,nats-2:4222)")
    # NatsConfig validates each URL afterwards, naming a bad entry.
    return [with_port(as_url(entry), port or DEFAULT_PORT)
            for entry in str(host).split(",") if entry.strip()]


def _resolve(conn_id: str, conn: Connection, extra: Mapping[str, Any]) -> _Resolved:
    """THE builder: Connection fields + extras -> validated NatsConfig + secret values.

    Connection-level mistakes are reported in connection terms (login, password, extra keys);
    everything else goes through the same :class:`NatsConfig` checks the job applies.
    """
    unknown = sorted(set(extra) - set(EXTRA_FIELDS))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key.replace("-", "_"), EXTRA_FIELDS, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"NATS connection {conn_id!r}: unknown extra {', '.join(hints)}; "
                          f"valid extras: {', '.join(EXTRA_FIELDS)}")
    given = {k: v for k, v in extra.items() if not _blank(v)}
    login = None if _blank(conn.login) else conn.login
    password = None if _blank(conn.password) else conn.password
    if password is not None and login is None:
        raise ConfigError(f"NATS connection {conn_id!r}: a password is set without a login; "
                          "set the login (user name) or use the 'token' extra for token auth")
    if login is not None and password is None:
        raise ConfigError(f"NATS connection {conn_id!r}: login {login!r} has no password; "
                          "set the password")
    kinds = [name for name, present in (("login/password", login is not None),
                                        ("token", "token" in given),
                                        ("creds_file", "creds_file" in given),
                                        ("nkey_seed_file", "nkey_seed_file" in given)) if present]
    if len(kinds) > 1:
        raise ConfigError(f"NATS connection {conn_id!r}: {' and '.join(kinds)} are set "
                          "together; use one kind of credentials")
    secrets: dict[str, str] = {}
    if "token" in given:
        secrets[TOKEN_ENV] = str(given["token"])
    if password is not None:
        secrets[PASSWORD_ENV] = password
    try:
        tls = TlsConfig(ca_file=given.get("tls_ca_file"), cert_file=given.get("tls_cert_file"),
                        key_file=given.get("tls_key_file"))
        optional: dict[str, Any] = {k: given[k] for k in ("name", "connect_timeout") if k in given}
        config = NatsConfig(
            servers=_servers(conn_id, conn.host, conn.port),
            creds_file=given.get("creds_file"), nkey_seed_file=given.get("nkey_seed_file"),
            token_env=TOKEN_ENV if "token" in given else None,
            user=login, password_env=PASSWORD_ENV if password is not None else None,
            domain=given.get("domain"), tls=tls, **optional)
    except ConfigError as e:
        raise ConfigError(f"NATS connection {conn_id!r}: {e}") from None
    return _Resolved(config, secrets)


def _settings(section: Any, path: tuple[str, ...] = ("nats",)
              ) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every key of a config section, defaults included, with its value as the config reads
    it from an environment variable or ``--set``: the connection owns the whole ``nats``
    section, so a YAML's own nats settings never mix with the connection's (e.g. a creds_file
    left in the YAML next to the connection's token). ``null`` resets a key."""
    for f in fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            yield from _settings(value, (*path, f.name))
        elif value is None:
            yield (*path, f.name), "null"
        else:
            yield (*path, f.name), ",".join(value) if isinstance(value, list) else str(value)


def _job_environment(resolved: _Resolved) -> dict[str, str]:
    """Every ``nats.*`` key as a ``JS_ETL__NATS__*`` variable, plus the secrets' variables."""
    env = {ENV_PREFIX + "__".join(key).upper(): value
           for key, value in _settings(resolved.config)}
    env.update(resolved.secrets)
    return env


@dataclass(frozen=True)
class ClusterHandoff:
    """A connection handed to a driver that runs elsewhere (cluster deploy mode): every
    ``nats`` key as a ``--set`` item, none of them secret, and the files spark-submit ships
    beside the driver (``--files local#name``): the token or password written to a file, and
    the connection's credential and TLS files."""

    overrides: tuple[str, ...]
    files: tuple[str, ...]


class JetStreamHook(BaseHook):
    """Reads a ``nats`` Airflow connection; gives JetStream sessions and the job's environment.

    >>> hook = JetStreamHook("nats_default")
    >>> hook.consumer_info("ORDERS", "orders_to_delta").num_pending
    1200
    >>> with hook.get_conn() as js:          # a js_etl.jetstream.JetStreamSession
    ...     js.stream_info("ORDERS").state.messages
    >>> hook.job_environment()               # for spark-submit's child process
    {'JS_ETL__NATS__SERVERS': 'nats://nats-1:4222', ..., 'JS_ETL_NATS_TOKEN': '...'}
    """

    conn_name_attr = "nats_conn_id"
    default_conn_name = "nats_default"
    conn_type = "nats"
    hook_name = "NATS JetStream"

    def __init__(self, nats_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nats_conn_id = nats_conn_id

    # -- the one way in ---------------------------------------------------------------------
    def _undefined(self) -> ConfigError:
        """A missing connection needs a fix, not a retry: terminal, like every config error,
        for the operator, the sensor and the trigger alike."""
        return ConfigError(f"NATS connection {self.nats_conn_id!r} is not defined: add it "
                           f"(Admin > Connections, or AIRFLOW_CONN_{self.nats_conn_id.upper()}) "
                           "or pass the nats_conn_id of one that exists")

    def _resolved(self) -> _Resolved:
        try:
            conn = self.get_connection(self.nats_conn_id)
        except AirflowNotFoundException:
            raise self._undefined() from None
        resolved = _resolve(self.nats_conn_id, conn, conn.extra_dejson)
        self._mask(resolved)
        return resolved

    async def _aresolved(self) -> _Resolved:
        try:
            conn = await self.aget_connection(self.nats_conn_id)
        except AirflowNotFoundException:
            raise self._undefined() from None
        resolved = _resolve(self.nats_conn_id, conn, await conn.aextra_dejson())
        from airflow.sdk.log import amask_secret

        for value in resolved.secrets.values():
            await amask_secret(value)
        return resolved

    @staticmethod
    def _mask(resolved: _Resolved) -> None:
        # Airflow masks the password and "token"-named extras already; say so explicitly anyway,
        # since these values are about to be handed to a child process.
        from airflow.sdk.log import mask_secret

        for value in resolved.secrets.values():
            mask_secret(value)

    # -- what the rest of js_etl.airflow uses ------------------------------------------------
    def connection_options(self) -> ConnectionOptions:
        """Options for :class:`~js_etl.jetstream.JetStreamSession` / ``JetStreamConnection``."""
        return self._options(self._resolved())

    async def aconnection_options(self) -> ConnectionOptions:
        """Same as :meth:`connection_options`, safe to call inside a trigger's event loop."""
        return self._options(await self._aresolved())

    @staticmethod
    def _options(resolved: _Resolved) -> ConnectionOptions:
        return resolved.config.connection_options(environ=resolved.secrets)

    def job_environment(self) -> dict[str, str]:
        """Environment variables that hand this connection to the job under spark-submit.

        ``JS_ETL__NATS__*`` override every key of the config's ``nats`` section (keys the
        connection leaves empty are reset to their defaults); a token or password travels as
        the value of ``JS_ETL_NATS_TOKEN`` / ``JS_ETL_NATS_PASSWORD``, which the config names via
        ``nats.token_env`` / ``nats.password_env``.
        """
        return _job_environment(self._resolved())

    def cluster_handoff(self, folder: Path) -> ClusterHandoff:
        """This connection for a driver in cluster deploy mode, the secret values written into
        ``folder`` (mode 0600; remove it once spark-submit has uploaded them). A file the
        connection names travels under a fixed name (``js-etl-nats-*``), which the driver opens
        in its working directory, where YARN puts ``--files``."""
        resolved = self._resolved()
        config = resolved.config
        files: list[str] = []

        def ship(local: str | Path | None, name: str) -> str | None:
            if local is None:
                return None
            files.append(f"{local}#{name}")
            return name

        def secret(env: str | None, name: str) -> str | None:
            if env is None:
                return None
            path = folder / name
            path.touch(mode=0o600)
            path.write_text(resolved.secrets[env])
            return ship(path, name)

        tls = dataclasses.replace(config.tls, **{
            key: ship(getattr(config.tls, key), f"js-etl-nats-tls-{key}")
            for key in ("ca_file", "cert_file", "key_file")})
        shipped = dataclasses.replace(
            config, tls=tls, token_env=None, password_env=None,
            token_file=secret(config.token_env, "js-etl-nats-token"),
            password_file=secret(config.password_env, "js-etl-nats-password"),
            creds_file=ship(config.creds_file, "js-etl-nats-creds"),
            nkey_seed_file=ship(config.nkey_seed_file, "js-etl-nats-nkey-seed"))
        return ClusterHandoff(tuple(f"{'.'.join(key)}={value}"
                                    for key, value in _settings(shipped)), tuple(files))

    def get_conn(self) -> JetStreamSession:
        """An open :class:`~js_etl.jetstream.JetStreamSession`; close it (a context manager)."""
        from js_etl.jetstream import JetStreamSession

        return JetStreamSession(self.connection_options())

    def consumer_info(self, stream: str, consumer: str) -> ConsumerInfo:
        with self.get_conn() as js:
            return js.consumer_info(stream, consumer)

    def test_connection(self) -> tuple[bool, str]:
        """Connect with exactly the options the job would use and ask JetStream for the account
        info; ``(False, reason)`` says whether the server was unreachable, refused the
        credentials, or has no JetStream."""
        try:
            options = self.connection_options()
            from js_etl.jetstream import JetStreamSession

            with JetStreamSession(options) as js:
                info = js.run(js.conn.request("INFO"))
                auth_required = js.conn.auth_required
        except JsEtlError as e:
            return False, f"{type(e).__name__}: {e}"
        except Exception as e:  # an Airflow lookup error, a bad TLS file, ...
            return False, f"{type(e).__name__}: {e}"
        streams, consumers = info.get("streams", 0), info.get("consumers", 0)
        message = (f"Connected to {', '.join(options.servers)}: JetStream account has "
                   f"{streams} stream(s) and {consumers} consumer(s)")
        credentials = (options.token or options.user or options.creds_file
                       or options.nkey_seed_file)
        if credentials and not auth_required:
            message += ("; note: the server did not ask for credentials, so the connection's "
                        "token, user or key was not checked")
        # `airflow connections test` prints only "Connection success!" and silences logging
        # unless --verbose: with it, this line shows what was seen (the UI shows the message).
        logging.getLogger(__name__).info("%s", message)
        return True, message
