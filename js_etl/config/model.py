"""The job configuration's schema: one typed, frozen dataclass per section.

Each field declares its kind (:mod:`js_etl.config.values`) in the dataclass itself, and
``__post_init__`` runs the same checks the loader runs, then the section's cross-field rules, so a
config built directly in code is held to the same rules as one loaded from a file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from js_etl.config.ddl import ddl_problem
from js_etl.config.values import (
    BOOL,
    CONF,
    CONNECT_URL,
    ENV_NAME,
    JS_NAME,
    REQUIRED,
    SECONDS,
    TEXT,
    KiB,
    Kind,
    MiB,
    byte_size,
    choice,
    coerce,
    count,
    ddl_field_names,
    fmt_size,
    join_key,
    partition_column_name,
    pattern,
    section,
    server_url,
    setting,
    strings,
    subject_filter,
)
from js_etl.errors import ConfigError
from js_etl.schema import ORIGIN_COLUMNS, schema_field_problem

if TYPE_CHECKING:
    from js_etl.jetstream.options import ConnectionOptions

# The key-value bucket of the consumers' run leases (js_etl.durable.lease): source.lease_bucket,
# and the stream source's option lease_bucket.
DEFAULT_LEASE_BUCKET = "js-etl-leases"
LEASE_BUCKET = pattern(r"[A-Za-z0-9_-]{1,64}",
                       "a key-value bucket name matching ^[A-Za-z0-9_-]{1,64}$")


class _Section:
    """Runs every field's kind, then the section's cross-field rules, on construction."""

    __slots__ = ()

    def __post_init__(self) -> None:
        prefix = SECTION_PATHS[type(self)]
        for f in fields(self):  # type: ignore[arg-type]
            if "kind" in f.metadata:
                value = coerce(join_key(prefix, f.name), getattr(self, f.name), f.metadata["kind"])
                object.__setattr__(self, f.name, value)
        self._check()

    def _check(self) -> None:
        pass



def _exclusive(section: _Section, prefix: str, names: Sequence[str], fix: str) -> None:
    chosen = [f"{prefix}.{n}" for n in names if getattr(section, n) is not None]
    if len(chosen) > 1:
        listed = ", ".join(chosen[:-1]) + " and " + chosen[-1]
        raise ConfigError(f"{listed} are {'both' if len(chosen) == 2 else 'all'} set; {fix}")


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig(_Section):
    ca_file: str | None = setting(None, TEXT)
    cert_file: str | None = setting(None, TEXT)
    key_file: str | None = setting(None, TEXT)

    def _check(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            have, missing = ("cert_file", "key_file")
            if self.cert_file is None:
                have, missing = missing, have
            raise ConfigError(
                f"nats.tls.{have} is set without nats.tls.{missing}; a client certificate needs "
                f"both (set nats.tls.{missing} or remove nats.tls.{have})"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class NatsConfig(_Section):
    servers: list[str] = setting(
        ["nats://127.0.0.1:4222"],
        strings(
            server_url,
            expected="a list of server URLs like nats://host:4222 (or one comma-separated string)",
            min_items=1,
        ),
    )
    name: str = setting("js-etl", TEXT)
    connect_timeout: float = setting(5.0, SECONDS)
    creds_file: str | None = setting(None, TEXT)
    nkey_seed_file: str | None = setting(None, TEXT)
    token_env: str | None = setting(None, ENV_NAME)
    token_file: str | None = setting(None, TEXT)
    user: str | None = setting(None, TEXT)
    password_env: str | None = setting(None, ENV_NAME)
    password_file: str | None = setting(None, TEXT)
    domain: str | None = setting(None, TEXT)
    tls: TlsConfig = section(TlsConfig)

    def _check(self) -> None:
        _exclusive(self, "nats", ("token_env", "token_file"), "keep one, the token has one source")
        _exclusive(
            self, "nats", ("password_env", "password_file"), "keep one, the password has one source"
        )
        password = "password_env" if self.password_env is not None else "password_file"
        if getattr(self, password) is not None and self.user is None:
            raise ConfigError(
                f"nats.{password} is set without nats.user; set nats.user or remove nats.{password}"
            )
        if self.user is not None and getattr(self, password) is None:
            raise ConfigError(
                "nats.user is set without a password; set nats.password_env or nats.password_file"
            )
        plain_ws = [s for s in self.servers if s.lower().startswith("ws://")]
        if plain_ws and (self.tls.ca_file or self.tls.cert_file):
            raise ConfigError(
                f"nats.tls is set but nats.servers has plain websocket URL(s) ({plain_ws[0]}); "
                "TLS settings mean TLS: use wss:// URLs, or remove nats.tls"
            )
        token = "token_env" if self.token_env is not None else "token_file"
        _exclusive(
            self,
            "nats",
            ("creds_file", "nkey_seed_file", token, "user"),
            "use one credential kind: nats.creds_file, nats.nkey_seed_file, "
            "nats.token_env/token_file, or nats.user with a password",
        )

    def connection_options(self, environ: Mapping[str, str] | None = None) -> ConnectionOptions:
        """Resolve secrets (from their environment variables or files) into options for the
        JetStream layer. Called where the connection is opened, so secrets live only there."""
        from js_etl.jetstream.options import ConnectionOptions, Secret, TlsOptions

        env = dict(os.environ if environ is None else environ)

        def secret(kind: str, env_name: str | None, file: str | None) -> Secret | None:
            # Errors name the setting, never its value: it may be the secret pasted by mistake.
            if env_name:
                return Secret.from_env(env_name, env, key=f"nats.{kind}_env")
            return Secret.from_file(file, key=f"nats.{kind}_file") if file else None

        tls = None
        if self.tls.ca_file or self.tls.cert_file:
            tls = TlsOptions(self.tls.ca_file, self.tls.cert_file, self.tls.key_file)
        return ConnectionOptions(
            servers=tuple(self.servers), name=self.name, connect_timeout=self.connect_timeout,
            creds_file=self.creds_file, nkey_seed_file=self.nkey_seed_file,
            token=secret("token", self.token_env, self.token_file), user=self.user,
            password=secret("password", self.password_env, self.password_file), tls=tls,
            domain=self.domain)


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceConfig(_Section):
    stream: str = setting(REQUIRED, JS_NAME)
    consumer: str = setting(REQUIRED, JS_NAME)
    create_consumer: bool = setting(False, BOOL)
    filter_subjects: list[str] = setting(
        [],
        strings(
            subject_filter,
            expected="a list of subject filters (or one comma-separated string)",
        ),
    )
    # The consumer settings below apply only when js-etl creates the consumer.
    ack_wait: float | None = setting(None, SECONDS)
    max_ack_pending: int | None = setting(None, count(unlimited=True))
    max_deliver: int | None = setting(None, count(unlimited=True))
    priority_group: str | None = setting(
        None,
        pattern(
            r"[A-Za-z0-9_=/-]{1,16}", "a priority group name matching ^[A-Za-z0-9_=/-]{1,16}$"
        ),
    )
    min_pending: int | None = setting(None, count())
    min_ack_pending: int | None = setting(None, count())
    # The key-value bucket holding each consumer's run lease (js_etl.durable.lease).
    lease_bucket: str = setting(DEFAULT_LEASE_BUCKET, LEASE_BUCKET)

    def _check(self) -> None:
        for name in ("min_pending", "min_ack_pending"):
            if getattr(self, name) is not None and self.priority_group is None:
                raise ConfigError(
                    f"source.{name} requires source.priority_group; set source.priority_group "
                    f"or remove source.{name}"
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchConfig(_Section):
    partitions: int = setting(2, count())
    # Large enough that a pull of large messages ends at max_bytes rather than at the count
    # (docs/design/round-size.md).
    batch: int = setting(4000, count())
    # A pull larger than the server's 64 MiB per-client pending limit gets the connection dropped
    # as a slow consumer; 48 MiB leaves headroom for protocol overhead and other subscriptions.
    max_bytes: int = setting(
        8 * MiB,
        byte_size(
            minimum=KiB,
            maximum=48 * MiB,
            why="; a larger pull can exceed the server's 64MiB per-client pending limit "
            "and get the connection dropped as a slow consumer",
        ),
    )
    partition_max_bytes: int = setting(128 * MiB, byte_size())
    partition_max_messages: int | None = setting(None, count())
    pull_timeout: float = setting(5.0, SECONDS)

    def _check(self) -> None:
        if self.partition_max_bytes < self.max_bytes:
            partition, pull = fmt_size(self.partition_max_bytes), fmt_size(self.max_bytes)
            raise ConfigError(
                f"fetch.partition_max_bytes ({partition}) is smaller than fetch.max_bytes "
                f"({pull}); raise fetch.partition_max_bytes or lower fetch.max_bytes"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig(_Section):
    """Budgets of one run; ``None`` means unlimited (drain until the consumer is empty)."""

    max_messages: int | None = setting(None, count())
    max_bytes: int | None = setting(None, byte_size())
    max_rounds: int | None = setting(None, count())
    max_seconds: float | None = setting(None, SECONDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeConfig(_Section):
    format: Literal["raw", "text", "json"] = setting("raw", choice("raw", "text", "json"))
    schema: str | None = setting(None, TEXT)  # Spark DDL, e.g. "id BIGINT, kind STRING"
    merge_schema: bool = setting(False, BOOL)
    # json: also keep each good row's raw payload, in a binary column `data`.
    keep_raw: bool = setting(False, BOOL)
    # json: what a top-level field decode.schema does not name does to its payload.
    unknown_fields: Literal["ignore", "dead_letter"] = setting(
        "ignore", choice("ignore", "dead_letter"))

    @property
    def keeps_payload(self) -> bool:
        """Whether a good row keeps the payload's bytes in ``data``: a raw table's only column,
        or a json table's with keep_raw."""
        return self.format == "raw" or (self.format == "json" and self.keep_raw)

    def _check(self) -> None:
        for key, off in (("keep_raw", False), ("unknown_fields", "ignore")):
            if self.format != "json" and getattr(self, key) != off:
                raise ConfigError(
                    f"decode.{key} is set but decode.format is {self.format!r}; it applies only "
                    "to json (raw and text keep the whole payload): remove it or set "
                    "decode.format to 'json'"
                )
        if self.format == "json" and self.schema is not None:
            typo = ddl_problem(self.schema)
            if typo:
                raise ConfigError(typo)
            names = ddl_field_names(self.schema)
            problem = schema_field_problem(names) if names is not None else None
            if problem:
                raise ConfigError(problem)
        if self.format == "json" and self.schema is None:
            raise ConfigError(
                "decode.format is 'json' but decode.schema is not set; set decode.schema to a "
                "Spark DDL string, e.g. 'id BIGINT, kind STRING'"
            )
        if self.format != "json" and self.schema is not None:
            raise ConfigError(
                f"decode.schema is set but decode.format is {self.format!r}; set decode.format "
                "to 'json' or remove decode.schema"
            )
        if self.merge_schema and self.format != "json":
            raise ConfigError(
                f"decode.merge_schema is true but decode.format is {self.format!r}; "
                "merge_schema applies only to json, set decode.format to 'json' or remove it"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetConfig(_Section):
    path: str | None = setting(None, TEXT)
    table: str | None = setting(None, TEXT)
    partition_by: list[str] = setting(
        [], strings(expected="a list of Spark SQL expressions (or one comma-separated string)")
    )
    dead_letter_path: str | None = setting(None, TEXT)
    dead_letter_table: str | None = setting(None, TEXT)
    # How a drain writes the table's rows (js_etl.drain.writers.columnar): auto = the columnar
    # writer where it writes what Spark's would, else Spark's; columnar = refuse the run where it
    # cannot.
    writer: Literal["auto", "columnar", "spark"] = setting(
        "auto", choice("auto", "columnar", "spark"))

    def _check(self) -> None:
        if self.path is None and self.table is None:
            raise ConfigError(
                "target.path or target.table is required; set target.path (a Delta table "
                "directory) or target.table (a catalog table name)"
            )
        _exclusive(self, "target", ("path", "table"), "keep exactly one")
        _exclusive(self, "target", ("dead_letter_path", "dead_letter_table"), "keep at most one")
        if self.resolved_dead_letter_path is not None and self.path is not None and (
            self.resolved_dead_letter_path.rstrip("/") == self.path.rstrip("/")
        ):
            raise ConfigError(
                "target.dead_letter_path is the same as target.path; point dead letters elsewhere"
            )
        if self.dead_letter_table is not None and self.dead_letter_table == self.table:
            raise ConfigError(
                "target.dead_letter_table is the same as target.table; name another table"
            )

    @property
    def resolved_dead_letter_path(self) -> str | None:
        """Where dead letters go as a path; derived from ``path`` unless a table was chosen."""
        if self.dead_letter_path is not None:
            return self.dead_letter_path
        if self.path is not None and self.dead_letter_table is None:
            return self.path.rstrip("/") + "_dead_letters"
        return None

    @property
    def resolved_dead_letter_table(self) -> str | None:
        """Where dead letters go as a catalog table; derived from ``table`` unless a path is set."""
        if self.dead_letter_table is not None:
            return self.dead_letter_table
        if self.table is not None and self.dead_letter_path is None:
            return self.table + "_dead_letters"
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class SparkConfig(_Section):
    """Used only when js-etl starts Spark itself (not under spark-submit)."""

    master: str = setting("local[2]", TEXT)
    app_name: str = setting("js-etl", TEXT)
    conf: dict[str, str] = setting({}, CONF)
    remote: str | None = setting(None, CONNECT_URL)  # a Spark Connect server instead

    def remote_in(self, environ: Mapping[str, str]) -> str | None:
        """The Spark Connect server a job with the variables ``environ`` is a client of: the
        ``SPARK_REMOTE`` variable, which wins, else ``remote``; None for none."""
        return environ.get("SPARK_REMOTE") or self.remote


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamingConfig(_Section):
    """``js-etl stream``: a Structured Streaming query (Trigger.AvailableNow) instead of a
    drain (js_etl.streaming)."""

    checkpoint: str | None = setting(None, TEXT)  # the query's checkpoint location
    start: Literal["earliest", "latest"] = setting("earliest", choice("earliest", "latest"))
    from_seq: int | None = setting(None, count())  # instead of start: a stream sequence
    max_messages_per_batch: int | None = setting(None, count())
    max_bytes_per_batch: int | None = setting(None, byte_size())
    fail_on_data_loss: bool = setting(True, BOOL)
    commit_consumer: bool = setting(False, BOOL)  # move source.consumer to what is committed

    def _check(self) -> None:
        if self.from_seq is not None and self.start != "earliest":
            raise ConfigError("streaming.start and streaming.from_seq both say where the query "
                              "starts: keep one")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobConfig(_Section):
    nats: NatsConfig = section(NatsConfig)
    source: SourceConfig = section(SourceConfig, required=True)
    fetch: FetchConfig = section(FetchConfig)
    run: RunConfig = section(RunConfig)
    decode: DecodeConfig = section(DecodeConfig)
    target: TargetConfig = section(TargetConfig, required=True)
    spark: SparkConfig = section(SparkConfig)
    streaming: StreamingConfig = section(StreamingConfig)

    def _check(self) -> None:
        # A partition expression whose name the table already has is not added (the existing
        # column wins): `to_date(published_at) AS date` next to a JSON field `date` put every row
        # into __HIVE_DEFAULT_PARTITION__. Refused here, before anything is fetched.
        columns = list(ORIGIN_COLUMNS)
        if self.decode.format == "json":
            columns += ddl_field_names(self.decode.schema or "") or []
            columns += ["data"] if self.decode.keep_raw else []
        else:
            columns.append("data" if self.decode.format == "raw" else "text")
        taken = {c.lower(): c for c in columns}
        named: dict[str, str] = {}  # Delta refuses a table partitioned by a column twice
        for expression in self.target.partition_by:
            name, plain = partition_column_name(expression)
            if name is None:
                continue
            if name.lower() in named:
                raise ConfigError(
                    f"target.partition_by names the column {name!r} twice "
                    f"({named[name.lower()]!r} and {expression!r}; names are compared ignoring "
                    "case): keep one")
            named[name.lower()] = expression
            if plain or name.lower() not in taken:
                continue
            raise ConfigError(
                f"target.partition_by {expression!r} names its column {name!r}, but the table "
                f"already has a column {taken[name.lower()]!r} (names are compared ignoring "
                "case), so the expression would never be used: give it another name, e.g. "
                f"'... AS {name}_part', or rename the decode.schema field"
            )

    @property
    def job_id(self) -> str:
        """Stable identity of this drain, used as the Delta application-transaction id."""
        return f"js-etl:{self.source.stream}:{self.source.consumer}"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able copy for logs and reports (holds no secrets by construction)."""
        return dataclasses.asdict(self)


def schema_of(cls: type, prefix: str = "") -> dict[str, type | Kind]:
    out: dict[str, type | Kind] = {prefix: cls}
    for f in fields(cls):
        key = join_key(prefix, f.name)
        if "section" in f.metadata:
            out.update(schema_of(f.metadata["section"], key))
        else:
            out[key] = f.metadata["kind"]
    return out


# "section.key" -> section class or leaf kind; "" is the top level.
SCHEMA = schema_of(JobConfig)
SECTION_PATHS = {v: k for k, v in SCHEMA.items() if isinstance(v, type)}

