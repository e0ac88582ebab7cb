"""The job configuration: one typed, frozen tree built from defaults, YAML, environment and flags.

Everything is validated here, before Spark or NATS is touched, so a typo costs a second instead of
a cluster start. Each field declares its *kind* (how a raw value is checked and normalised) in the
dataclass itself; :func:`load_config` merges the layers into a flat ``{"section.key": value}`` map
and the dataclasses' ``__post_init__`` runs the same table-driven checks, so a config built
directly in code is held to the same rules as one loaded from a file.

Secrets are never part of the config: it holds the *names* of environment variables and the
*paths* of files that contain them, so :meth:`JobConfig.as_dict` is safe to log.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import yaml

from js_etl.errors import ConfigError

if TYPE_CHECKING:
    from js_etl.jetstream.options import ConnectionOptions

__all__ = [
    "ENV_PREFIX",
    "DecodeConfig",
    "FetchConfig",
    "JobConfig",
    "NatsConfig",
    "RunConfig",
    "SourceConfig",
    "SparkConfig",
    "TargetConfig",
    "TlsConfig",
    "load_config",
]

ENV_PREFIX = "JS_ETL__"

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Literal secrets are refused wherever they appear, and the value is never echoed back.
_SECRETS = {
    "nats.token": "use nats.token_env (name of an environment variable) or nats.token_file",
    "nats.password": (
        "use nats.password_env (name of an environment variable) or nats.password_file"
    ),
    "nats.nkey_seed": "use nats.nkey_seed_file (path of the seed file) or nats.creds_file",
    "nats.seed": "use nats.nkey_seed_file (path of the seed file) or nats.creds_file",
}


# --------------------------------------------------------------------------------------------
# Kinds: how one raw value is checked and normalised. Every parser is idempotent, because a
# value is coerced once by the loader (to name its origin in errors) and again by __post_init__.
# --------------------------------------------------------------------------------------------


class _Invalid(Exception):
    """A value failed its kind; ``detail`` replaces the generic "expected X, got Y" tail."""

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class _Kind:
    expected: str  # completes "expected ..., got ..."
    parse: Callable[[Any], Any]  # returns the normalised value or raises _Invalid
    keep_text: bool = False  # env/--set text is taken verbatim instead of YAML-typed
    entries: bool = False  # a mapping that also takes single entries: key.ENTRY=value
    why: str = ""  # appended after "got ...": the reason behind a limit that looks arbitrary
    optional: bool = False  # None is a valid value (set from the field's default)


def _bool(value: Any) -> bool:
    # Only real booleans: the string "false" would be truthy and 1/0 are ambiguous.
    if not isinstance(value, bool):
        raise _Invalid
    return value


def _count(*, unlimited: bool = False) -> _Kind:
    def parse(value: Any) -> int:
        # bool is an int subclass; YAML `true` must not silently become 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid
        if value >= 1 or (unlimited and value == -1):
            return value
        raise _Invalid

    expected = "-1 (unlimited) or a positive integer" if unlimited else "a positive integer"
    return _Kind(expected, parse)


_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
    "kib": KiB, "mib": MiB, "gib": GiB,
}  # fmt: skip
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")


def _fmt_size(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def _byte_size(*, minimum: int = 1, maximum: int | None = None, why: str = "") -> _Kind:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise _Invalid
        if isinstance(value, int):
            n = value
        elif isinstance(value, str) and (m := _SIZE_RE.fullmatch(value.strip())):
            unit = m[2].lower()
            if unit not in _SIZE_UNITS:
                raise _Invalid
            exact = Decimal(m[1]) * _SIZE_UNITS[unit]
            if exact != exact.to_integral_value():
                raise _Invalid
            n = int(exact)
        else:
            raise _Invalid
        if n < minimum or (maximum is not None and n > maximum):
            raise _Invalid
        return n

    if maximum is not None:
        expected = f"a byte size from {_fmt_size(minimum)} to {_fmt_size(maximum)}, e.g. 8MiB"
    else:
        expected = "a positive byte size (e.g. 512KiB, 8MiB, 1GB)"
    return _Kind(expected, parse, why=why)


_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")


def _seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise _Invalid
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.fullmatch(value.strip())):
        unit = m[2].lower()
        if unit not in _DURATION_UNITS:
            raise _Invalid
        seconds = float(m[1]) * _DURATION_UNITS[unit]
    else:
        raise _Invalid
    if not math.isfinite(seconds) or seconds <= 0:
        raise _Invalid
    return seconds


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid
    return value


def _pattern(regex: str, expected: str) -> _Kind:
    compiled = re.compile(regex)

    def parse(value: Any) -> str:
        if not isinstance(value, str) or not compiled.fullmatch(value):
            raise _Invalid
        return value

    return _Kind(expected, parse, keep_text=True)


def _env_name(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        return value
    # Never echo the value: the usual mistake is pasting the secret itself here.
    raise _Invalid(
        "expected the name of an environment variable (letters, digits, '_'), "
        "not the secret itself"
    )


def _choice(*options: str) -> _Kind:
    def parse(value: Any) -> str:
        if value not in options:
            raise _Invalid
        return value

    return _Kind("one of " + ", ".join(repr(o) for o in options), parse, keep_text=True)


def _split_commas(text: str) -> list[str]:
    # Commas inside parentheses belong to SQL expressions, e.g. "concat(a, b) AS k".
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def ddl_field_names(ddl: str) -> list[str] | None:
    """Top-level field names of a Spark DDL schema (``id BIGINT, `a b` STRING, c: INT``),
    without Spark; None when it cannot tell (Spark's own parser judges the schema later)."""
    names = []
    for item in _split_commas(ddl.replace("<", "(").replace(">", ")")):
        match = re.match(r"\s*(`(?:[^`]|``)+`|[^\s:`]+)\s*:?", item)
        if not match:
            return None
        name = match[1]
        names.append(name[1:-1].replace("``", "`") if name.startswith("`") else name)
    return names


def partition_column_name(expression: str) -> tuple[str | None, bool]:
    """The column name a ``target.partition_by`` expression gets, and whether the expression is
    only that column (``date``, ``date AS date``). ``(None, False)`` when Spark names it (an
    expression without ``AS``)."""
    identifier = r"(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)"

    def unquote(name: str) -> str:
        return name[1:-1].replace("``", "`") if name.startswith("`") else name

    aliased = re.fullmatch(rf"(?is)\s*(.*?)\s+AS\s+{identifier}\s*", expression)
    if aliased:
        alias, source = unquote(aliased[2]), aliased[1]
        plain = re.fullmatch(rf"\s*{identifier}\s*", source)
        return alias, plain is not None and unquote(plain[1]).lower() == alias.lower()
    bare = re.fullmatch(rf"\s*{identifier}\s*", expression)
    if bare:
        return unquote(bare[1]), True
    return None, False


def local_path_problem(path: str) -> str | None:
    """Why Spark could not create and write the local directory ``path``, or None (also None
    for non-local URLs like ``s3a://…``, which only the cluster can judge).

    Probes by creating (and removing) a directory next to where ``path`` would be created, so
    call it where the run starts, not on every config load (an Airflow DAG parse, a scheduler
    host)."""
    import tempfile

    scheme = urlsplit(path).scheme if "://" in path or path.startswith("file:") else ""
    if scheme not in ("", "file"):
        return None
    local = Path(path.split(":", 1)[1] if scheme == "file" else path).expanduser().absolute()
    existing = local
    while not existing.exists():
        if existing.parent == existing:
            return None
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == local else f"would be inside {existing}, which is a file"
        return f"{what}, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".js-etl-probe-", dir=existing))
    except OSError as e:
        return (f"cannot create directories in {existing} ({e.strerror}; a read-only or "
                "virtual filesystem, or no permission)")
    return None


def _strings(
    item: Callable[[str], str] | None = None,
    *,
    expected: str = "a list of strings (or one comma-separated string)",
    min_items: int = 0,
) -> _Kind:
    def parse(value: Any) -> list[str]:
        if isinstance(value, str):
            value = _split_commas(value)
        if not isinstance(value, list | tuple) or len(value) < min_items:
            raise _Invalid
        if not all(isinstance(v, str) and v.strip() for v in value):
            raise _Invalid
        return [item(v) if item else v for v in value]

    return _Kind(expected, parse, keep_text=True)


_SERVER_SCHEMES = ("nats", "tls", "ws", "wss")


def _server(given: str) -> str:
    given = given.strip()
    url = given if "://" in given else "nats://" + given
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.username is not None or parts.password is not None:
        raise _Invalid(
            "credentials in server URLs are never read from config; use nats.user with "
            "nats.password_env/nats.password_file, or nats.token_env/nats.token_file"
        )
    path_ok = parts.path in ("", "/") or parts.scheme in ("ws", "wss")  # websocket paths exist
    if (
        parts.scheme not in _SERVER_SCHEMES
        or not parts.hostname
        or port is None
        or not path_ok
        or parts.query
        or parts.fragment
    ):
        raise _Invalid(
            "expected server URLs like nats://host:4222 (schemes nats, tls, ws, wss; "
            f"or plain host:port), got {given!r}"
        )
    return url


_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+|\*|>")


def _subject_filter(subject: str) -> str:
    tokens = subject.split(".")
    if not all(_SUBJECT_TOKEN.fullmatch(t) for t in tokens) or ">" in tokens[:-1]:
        raise _Invalid(
            "expected subject filters like 'orders.>' or 'orders.*.created' "
            f"(dot-separated tokens, '*' and '>' as whole tokens, '>' last), got {subject!r}"
        )
    return subject


def _conf_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _Invalid
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not key or not isinstance(val, str | int | float | bool):
            raise _Invalid
        # Spark spells booleans in lowercase; str(True) would be "True".
        out[key] = str(val).lower() if isinstance(val, bool) else str(val)
    return out


_TEXT = _Kind("a non-empty string", _text, keep_text=True)
_ENV_NAME = _Kind("the name of an environment variable", _env_name, keep_text=True)
_BOOL = _Kind("true or false", _bool)
_SECONDS = _Kind("a positive duration in seconds (a number, or e.g. 250ms, 30s, 5m, 1h)", _seconds)
_JS_NAME = _pattern(r"[^\s.*>]+", "a JetStream name (non-empty; no whitespace, '.', '*' or '>')")
_CONF = _Kind("a mapping of Spark conf keys to scalar values", _conf_map, entries=True)

_REQUIRED: Any = dataclasses.MISSING


def _setting(default: Any, kind: _Kind) -> Any:
    """A dataclass field carrying its kind; ``None`` as default makes the field optional."""
    kind = dataclasses.replace(kind, optional=default is None)
    meta = {"kind": kind}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _section(cls: type, *, required: bool = False) -> Any:
    if required:
        return field(metadata={"section": cls})
    return field(default_factory=cls, metadata={"section": cls})


def _show(value: Any) -> str:
    shown = "null" if value is None else repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _origin(origin: str | None) -> str:
    return f" (from {origin})" if origin else ""


def _coerce(key: str, value: Any, kind: _Kind, origin: str | None = None) -> Any:
    if value is None:
        if kind.optional:
            return None
        raise ConfigError(f"{key}: expected {kind.expected}, got null{_origin(origin)}")
    try:
        return kind.parse(value)
    except _Invalid as bad:
        detail = bad.detail or f"expected {kind.expected}, got {_show(value)}{kind.why}"
        raise ConfigError(f"{key}: {detail}{_origin(origin)}") from None


class _Section:
    """Runs every field's kind, then the section's cross-field rules, on construction."""

    __slots__ = ()

    def __post_init__(self) -> None:
        prefix = _SECTION_PATHS[type(self)]
        for f in fields(self):  # type: ignore[arg-type]
            if "kind" in f.metadata:
                value = _coerce(_join(prefix, f.name), getattr(self, f.name), f.metadata["kind"])
                object.__setattr__(self, f.name, value)
        self._check()

    def _check(self) -> None:
        pass


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


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
    ca_file: str | None = _setting(None, _TEXT)
    cert_file: str | None = _setting(None, _TEXT)
    key_file: str | None = _setting(None, _TEXT)

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
    servers: list[str] = _setting(
        ["nats://127.0.0.1:4222"],
        _strings(
            _server,
            expected="a list of server URLs like nats://host:4222 (or one comma-separated string)",
            min_items=1,
        ),
    )
    name: str = _setting("js-etl", _TEXT)
    connect_timeout: float = _setting(5.0, _SECONDS)
    creds_file: str | None = _setting(None, _TEXT)
    nkey_seed_file: str | None = _setting(None, _TEXT)
    token_env: str | None = _setting(None, _ENV_NAME)
    token_file: str | None = _setting(None, _TEXT)
    user: str | None = _setting(None, _TEXT)
    password_env: str | None = _setting(None, _ENV_NAME)
    password_file: str | None = _setting(None, _TEXT)
    domain: str | None = _setting(None, _TEXT)
    tls: TlsConfig = _section(TlsConfig)

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
    stream: str = _setting(_REQUIRED, _JS_NAME)
    consumer: str = _setting(_REQUIRED, _JS_NAME)
    create_consumer: bool = _setting(False, _BOOL)
    filter_subjects: list[str] = _setting(
        [],
        _strings(
            _subject_filter,
            expected="a list of subject filters (or one comma-separated string)",
        ),
    )
    # The consumer settings below apply only when js-etl creates the consumer.
    ack_wait: float | None = _setting(None, _SECONDS)
    max_ack_pending: int | None = _setting(None, _count(unlimited=True))
    max_deliver: int | None = _setting(None, _count(unlimited=True))
    priority_group: str | None = _setting(
        None,
        _pattern(
            r"[A-Za-z0-9_=/-]{1,16}", "a priority group name matching ^[A-Za-z0-9_=/-]{1,16}$"
        ),
    )
    min_pending: int | None = _setting(None, _count())
    min_ack_pending: int | None = _setting(None, _count())

    def _check(self) -> None:
        for name in ("min_pending", "min_ack_pending"):
            if getattr(self, name) is not None and self.priority_group is None:
                raise ConfigError(
                    f"source.{name} requires source.priority_group; set source.priority_group "
                    f"or remove source.{name}"
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchConfig(_Section):
    partitions: int = _setting(2, _count())
    # Large enough that a pull of large messages ends at max_bytes rather than at the count
    # (bench, 200k x 4 KiB: 1000 -> 4000 gave 3 rounds instead of 4, +15% msg/s).
    batch: int = _setting(4000, _count())
    # A pull larger than the server's 64 MiB per-client pending limit gets the connection dropped
    # as a slow consumer; 48 MiB leaves headroom for protocol overhead and other subscriptions.
    max_bytes: int = _setting(
        8 * MiB,
        _byte_size(
            minimum=KiB,
            maximum=48 * MiB,
            why="; a larger pull can exceed the server's 64MiB per-client pending limit "
            "and get the connection dropped as a slow consumer",
        ),
    )
    partition_max_bytes: int = _setting(128 * MiB, _byte_size())
    pull_timeout: float = _setting(5.0, _SECONDS)

    def _check(self) -> None:
        if self.partition_max_bytes < self.max_bytes:
            partition, pull = _fmt_size(self.partition_max_bytes), _fmt_size(self.max_bytes)
            raise ConfigError(
                f"fetch.partition_max_bytes ({partition}) is smaller than fetch.max_bytes "
                f"({pull}); raise fetch.partition_max_bytes or lower fetch.max_bytes"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig(_Section):
    """Budgets of one run; ``None`` means unlimited (drain until the consumer is empty)."""

    max_messages: int | None = _setting(None, _count())
    max_bytes: int | None = _setting(None, _byte_size())
    max_rounds: int | None = _setting(None, _count())
    max_seconds: float | None = _setting(None, _SECONDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeConfig(_Section):
    format: Literal["raw", "text", "json"] = _setting("raw", _choice("raw", "text", "json"))
    schema: str | None = _setting(None, _TEXT)  # Spark DDL, e.g. "id BIGINT, kind STRING"
    merge_schema: bool = _setting(False, _BOOL)
    # json: also keep each good row's raw payload, in a binary column `data`.
    keep_raw: bool = _setting(False, _BOOL)
    # json: what a top-level field decode.schema does not name does to its payload.
    unknown_fields: Literal["ignore", "dead_letter"] = _setting(
        "ignore", _choice("ignore", "dead_letter"))

    def _check(self) -> None:
        for key, off in (("keep_raw", False), ("unknown_fields", "ignore")):
            if self.format != "json" and getattr(self, key) != off:
                raise ConfigError(
                    f"decode.{key} is set but decode.format is {self.format!r}; it applies only "
                    "to json (raw and text keep the whole payload): remove it or set "
                    "decode.format to 'json'"
                )
        if self.format == "json" and self.schema is not None:
            from js_etl.spark.decode import schema_field_problem

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
    path: str | None = _setting(None, _TEXT)
    table: str | None = _setting(None, _TEXT)
    partition_by: list[str] = _setting(
        [], _strings(expected="a list of Spark SQL expressions (or one comma-separated string)")
    )
    dead_letter_path: str | None = _setting(None, _TEXT)
    dead_letter_table: str | None = _setting(None, _TEXT)

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

    master: str = _setting("local[2]", _TEXT)
    app_name: str = _setting("js-etl", _TEXT)
    conf: dict[str, str] = _setting({}, _CONF)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobConfig(_Section):
    nats: NatsConfig = _section(NatsConfig)
    source: SourceConfig = _section(SourceConfig, required=True)
    fetch: FetchConfig = _section(FetchConfig)
    run: RunConfig = _section(RunConfig)
    decode: DecodeConfig = _section(DecodeConfig)
    target: TargetConfig = _section(TargetConfig, required=True)
    spark: SparkConfig = _section(SparkConfig)

    def _check(self) -> None:
        # A partition expression whose name the table already has is not added (the existing
        # column wins): `to_date(published_at) AS date` next to a JSON field `date` put every row
        # into __HIVE_DEFAULT_PARTITION__. Refused here, before anything is fetched.
        from js_etl.spark.decode import ORIGIN_COLUMNS

        columns = list(ORIGIN_COLUMNS)
        if self.decode.format == "json":
            columns += ddl_field_names(self.decode.schema or "") or []
            columns += ["data"] if self.decode.keep_raw else []
        else:
            columns.append("data" if self.decode.format == "raw" else "text")
        taken = {c.lower(): c for c in columns}
        for expression in self.target.partition_by:
            name, plain = partition_column_name(expression)
            if name is None or plain or name.lower() not in taken:
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


def _schema(cls: type, prefix: str = "") -> dict[str, type | _Kind]:
    out: dict[str, type | _Kind] = {prefix: cls}
    for f in fields(cls):
        key = _join(prefix, f.name)
        if "section" in f.metadata:
            out.update(_schema(f.metadata["section"], key))
        else:
            out[key] = f.metadata["kind"]
    return out


# "section.key" -> section class or leaf kind; "" is the top level.
_SCHEMA = _schema(JobConfig)
_SECTION_PATHS = {v: k for k, v in _SCHEMA.items() if isinstance(v, type)}


# --------------------------------------------------------------------------------------------
# Loading: layers -> flat {"section.key": (raw value, origin)} -> dataclasses
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Text:
    """A value from env or --set, still unparsed: how to read it depends on the key's kind."""

    text: str


def _parse_text(text: str, keep_text: bool) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        # e.g. "*.orders" reads as a YAML alias; as a plain value it is just text.
        return text
    # Keep string keys verbatim: YAML would turn "1.10" into 1.1 and ">" into "".
    if keep_text and value is not None and not isinstance(value, list | dict):
        return text.strip()
    return value


def _unknown_key(key: str, origin: str) -> ConfigError:
    candidates = [k for k in _SCHEMA if k]
    close = difflib.get_close_matches(key, candidates, n=1)
    if close:
        hint = f"did you mean {close[0]!r}?"
    else:
        parent = key.rpartition(".")[0]
        while not isinstance(_SCHEMA.get(parent), type):
            parent = parent.rpartition(".")[0]
        names = [f.name for f in fields(_SCHEMA[parent])]  # type: ignore[arg-type]
        hint = f"valid keys in {parent or 'the top level'}: {', '.join(names)}"
    return ConfigError(f"unknown key {key!r} ({hint}){_origin(origin)}")


def _put(out: dict[str, tuple[Any, str]], path: tuple[str, ...], value: Any, origin: str) -> None:
    """Place ``value`` at ``path`` in the flat map, expanding mappings given for sections."""
    key = ".".join(path)
    where = _origin(origin)
    if key in _SECRETS:
        raise ConfigError(f"{key}: secrets are never read from config; {_SECRETS[key]}{where}")
    node = _SCHEMA.get(key) if all(path) or not path else None  # "" only names the top level
    if isinstance(node, _Kind):
        if isinstance(value, _Text):
            value = _parse_text(value.text, node.keep_text)
        out[key] = (value, origin)
        return
    if isinstance(node, type):
        if isinstance(value, _Text):
            value = _parse_text(value.text, keep_text=False)
        if value is None:  # an empty section, e.g. "nats:" with nothing under it
            return
        name = key or "top level"
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}: expected a mapping of settings, got {_show(value)}{where}")
        for sub, sub_value in value.items():
            if not isinstance(sub, str):
                raise ConfigError(f"{name}: keys must be strings, got {_show(sub)}{where}")
            _put(out, (*path, sub), sub_value, origin)
        return
    # One entry of a mapping-valued key: "spark.conf.spark.sql.shuffle.partitions=8".
    for i in range(len(path) - 1, 0, -1):
        parent = ".".join(path[:i])
        parent_node = _SCHEMA.get(parent)
        if isinstance(parent_node, _Kind) and parent_node.entries:
            entry = _parse_text(value.text, keep_text=True) if isinstance(value, _Text) else value
            current = out.get(parent, ({}, origin))[0]
            merged = dict(current) if isinstance(current, Mapping) else {}
            if entry is None:  # "spark.conf.x=null" drops an entry set by a lower layer
                merged.pop(".".join(path[i:]), None)
            else:
                merged[".".join(path[i:])] = entry
            out[parent] = (merged, origin)
            return
    raise _unknown_key(key, origin)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, which PyYAML would silently resolve to the last."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(path: str | os.PathLike[str]) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read config file {os.fspath(path)}: {reason}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"invalid YAML in {os.fspath(path)}{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{os.fspath(path)}: the top level must be a mapping of sections "
            f"(nats, source, fetch, ...), got {type(data).__name__}"
        )
    return data


def _env_name_of(key: str) -> str:
    return ENV_PREFIX + key.upper().replace(".", "__")


def _build(cls: type, prefix: str, values: Mapping[str, tuple[Any, str]]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        key = _join(prefix, f.name)
        if "section" in f.metadata:
            kwargs[f.name] = _build(f.metadata["section"], key, values)
            continue
        raw, origin = values.get(key, (None, None))
        if raw is not None:
            kwargs[f.name] = _coerce(key, raw, f.metadata["kind"], origin)
        # null in any layer means "not set here": the default, which is None for optional keys.
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(
                f"{key} is required (set it in the YAML, {_env_name_of(key)} or --set {key}=NAME)"
            )
    return cls(**kwargs)


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> JobConfig:
    """Build the job config from defaults < YAML file < ``JS_ETL__*`` env < ``--set`` overrides.

    Env variables map ``JS_ETL__SECTION__KEY`` to ``section.key`` (lowercased; nested sections
    add levels, e.g. ``JS_ETL__NATS__TLS__CA_FILE``). Env and override values are read as YAML
    (``500`` is an int, ``[a, b]`` a list, ``null`` None); string keys keep their text as is.
    Every problem raises :class:`~js_etl.errors.ConfigError` with a one-line message naming the
    key and the fix.

    Example::

        cfg = load_config(
            "conf/example.yaml",
            overrides=["fetch.batch=500", "source.filter_subjects=[orders.>, refunds.>]"],
            environ={"JS_ETL__NATS__SERVERS": "nats://nats-1:4222,nats://nats-2:4222"},
        )
        cfg.fetch.batch  # 500
    """
    environ = os.environ if environ is None else environ
    if isinstance(overrides, str):  # a lone "k=v" is a Sequence[str] of characters
        overrides = (overrides,)
    values: dict[str, tuple[Any, str]] = {}
    if path is not None:
        _put(values, (), _read_yaml(path), os.fspath(path))
    # Sorted so that a whole section (JS_ETL__FETCH) comes before its keys (JS_ETL__FETCH__BATCH).
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX)):
        parts = tuple(name[len(ENV_PREFIX) :].lower().split("__"))
        _put(values, parts, _Text(environ[name]), f"env {name}")
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"invalid --set {item!r}: expected --set section.key=value, "
                "e.g. --set fetch.batch=500"
            )
        _put(values, tuple(key.split(".")), _Text(text), f"--set {key}")
    return _build(JobConfig, "", values)
