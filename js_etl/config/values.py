"""Value kinds of the job configuration: how one raw setting is checked and normalised.

A kind pairs a parser with the phrase that completes "expected ..., got ..." in its error. Every
parser is idempotent, because a value is coerced once by the loader (to name its origin in
errors) and again by the section's ``__post_init__``. Also here: the Spark-free readers of DDL
and partition expressions that the config's cross-field checks need.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from js_etl.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

class Invalid(Exception):
    """A value failed its kind; ``detail`` replaces the generic "expected X, got Y" tail."""

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Kind:
    expected: str  # completes "expected ..., got ..."
    parse: Callable[[Any], Any]  # returns the normalised value or raises Invalid
    keep_text: bool = False  # env/--set text is taken verbatim instead of YAML-typed
    entries: bool = False  # a mapping that also takes single entries: key.ENTRY=value
    why: str = ""  # appended after "got ...": the reason behind a limit that looks arbitrary
    optional: bool = False  # None is a valid value (set from the field's default)


def _bool(value: Any) -> bool:
    # Only real booleans: the string "false" would be truthy and 1/0 are ambiguous.
    if not isinstance(value, bool):
        raise Invalid
    return value


def count(*, unlimited: bool = False) -> Kind:
    def parse(value: Any) -> int:
        # bool is an int subclass; YAML `true` must not silently become 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid
        if value >= 1 or (unlimited and value == -1):
            return value
        raise Invalid

    expected = "-1 (unlimited) or a positive integer" if unlimited else "a positive integer"
    return Kind(expected, parse)


_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
    "kib": KiB, "mib": MiB, "gib": GiB,
}  # fmt: skip
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")


def fmt_size(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def byte_size(*, minimum: int = 1, maximum: int | None = None, why: str = "") -> Kind:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise Invalid
        if isinstance(value, int):
            n = value
        elif isinstance(value, str) and (m := _SIZE_RE.fullmatch(value.strip())):
            unit = m[2].lower()
            if unit not in _SIZE_UNITS:
                raise Invalid
            exact = Decimal(m[1]) * _SIZE_UNITS[unit]
            if exact != exact.to_integral_value():
                raise Invalid
            n = int(exact)
        else:
            raise Invalid
        if n < minimum or (maximum is not None and n > maximum):
            raise Invalid
        return n

    if maximum is not None:
        expected = f"a byte size from {fmt_size(minimum)} to {fmt_size(maximum)}, e.g. 8MiB"
    else:
        expected = "a positive byte size (e.g. 512KiB, 8MiB, 1GB)"
    return Kind(expected, parse, why=why)


_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")


def _seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise Invalid
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.fullmatch(value.strip())):
        unit = m[2].lower()
        if unit not in _DURATION_UNITS:
            raise Invalid
        seconds = float(m[1]) * _DURATION_UNITS[unit]
    else:
        raise Invalid
    if not math.isfinite(seconds) or seconds <= 0:
        raise Invalid
    return seconds


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid
    return value


def pattern(regex: str, expected: str) -> Kind:
    compiled = re.compile(regex)

    def parse(value: Any) -> str:
        if not isinstance(value, str) or not compiled.fullmatch(value):
            raise Invalid
        return value

    return Kind(expected, parse, keep_text=True)


def _env_name(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        return value
    # Never echo the value: the usual mistake is pasting the secret itself here.
    raise Invalid(
        "expected the name of an environment variable (letters, digits, '_'), "
        "not the secret itself"
    )


def choice(*options: str) -> Kind:
    def parse(value: Any) -> str:
        if value not in options:
            raise Invalid
        return value

    return Kind("one of " + ", ".join(repr(o) for o in options), parse, keep_text=True)


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


def strings(
    item: Callable[[str], str] | None = None,
    *,
    expected: str = "a list of strings (or one comma-separated string)",
    min_items: int = 0,
) -> Kind:
    def parse(value: Any) -> list[str]:
        if isinstance(value, str):
            value = _split_commas(value)
        if not isinstance(value, list | tuple) or len(value) < min_items:
            raise Invalid
        if not all(isinstance(v, str) and v.strip() for v in value):
            raise Invalid
        return [item(v) if item else v for v in value]

    return Kind(expected, parse, keep_text=True)


_SERVER_SCHEMES = ("nats", "tls", "ws", "wss")


def as_url(given: str) -> str:
    """A server entry as a URL: a plain ``host:port`` means ``nats://host:port``."""
    given = given.strip()
    return given if "://" in given else "nats://" + given


def with_port(url: str, default_port: int) -> str:
    """``url`` with ``default_port`` added when it names no port (an Airflow connection's Port
    field applies to host entries without one). An invalid port is left for
    :func:`server_url` to name."""
    try:
        has_port = urlsplit(url).port is not None
    except ValueError:
        has_port = True
    if has_port or ":" in urlsplit(url).netloc.rsplit("]", 1)[-1]:  # "]": an IPv6 literal
        return url
    return f"{url.rstrip('/')}:{default_port}"


# Spark Connect's default port, where a sc:// URL names none.
CONNECT_PORT = 15002


def connect_address(url: str) -> tuple[str, int]:
    """The host and port of a Spark Connect URL, ``sc://host[:port]`` (port 15002 by default).
    Anything else is :class:`Invalid`, saying what is wrong but never showing the URL: its
    parameters may hold a token."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:  # a port that is no number from 0 to 65535, a broken IPv6 address
        raise Invalid("not a Spark Connect URL: its host or port does not parse (it must be "
                      "sc://host[:port]; the URL is not shown: it may hold a token)") from None
    if parts.scheme != "sc" or not parts.hostname or port == 0:
        raise Invalid(f"not a Spark Connect URL: it must be sc://host[:port], not "
                      f"{parts.scheme or 'no'}:// with {'a' if parts.hostname else 'no'} host "
                      "(the URL is not shown: it may hold a token)")
    return parts.hostname, port or CONNECT_PORT


def _connect_url(value: Any) -> str:
    text = _text(value).strip()
    connect_address(text)
    return text


def server_url(given: str) -> str:
    given = given.strip()
    url = as_url(given)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.username is not None or parts.password is not None:
        raise Invalid(
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
        raise Invalid(
            "expected server URLs like nats://host:4222 (schemes nats, tls, ws, wss; "
            f"or plain host:port), got {given!r}"
        )
    return url


_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+|\*|>")


def subject_filter(subject: str) -> str:
    tokens = subject.split(".")
    if not all(_SUBJECT_TOKEN.fullmatch(t) for t in tokens) or ">" in tokens[:-1]:
        raise Invalid(
            "expected subject filters like 'orders.>' or 'orders.*.created' "
            f"(dot-separated tokens, '*' and '>' as whole tokens, '>' last), got {subject!r}"
        )
    return subject


def _conf_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise Invalid
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not key or not isinstance(val, str | int | float | bool):
            raise Invalid
        # Spark spells booleans in lowercase; str(True) would be "True".
        out[key] = str(val).lower() if isinstance(val, bool) else str(val)
    return out


TEXT = Kind("a non-empty string", _text, keep_text=True)
ENV_NAME = Kind("the name of an environment variable", _env_name, keep_text=True)
BOOL = Kind("true or false", _bool)
SECONDS = Kind("a positive duration in seconds (a number, or e.g. 250ms, 30s, 5m, 1h)", _seconds)
JS_NAME = pattern(r"[^\s.*>]+", "a JetStream name (non-empty; no whitespace, '.', '*' or '>')")
CONF = Kind("a mapping of Spark conf keys to scalar values", _conf_map, entries=True)
CONNECT_URL = Kind("a Spark Connect URL, sc://host[:port]", _connect_url, keep_text=True)

REQUIRED: Any = dataclasses.MISSING


def setting(default: Any, kind: Kind) -> Any:
    """A dataclass field carrying its kind; ``None`` as default makes the field optional."""
    kind = dataclasses.replace(kind, optional=default is None)
    meta = {"kind": kind}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, *, required: bool = False) -> Any:
    if required:
        return field(metadata={"section": cls})
    return field(default_factory=cls, metadata={"section": cls})


def show(value: Any) -> str:
    shown = "null" if value is None else repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def origin_note(origin: str | None) -> str:
    return f" (from {origin})" if origin else ""


def coerce(key: str, value: Any, kind: Kind, origin: str | None = None) -> Any:
    if value is None:
        if kind.optional:
            return None
        raise ConfigError(f"{key}: expected {kind.expected}, got null{origin_note(origin)}")
    try:
        return kind.parse(value)
    except Invalid as bad:
        detail = bad.detail or f"expected {kind.expected}, got {show(value)}{kind.why}"
        raise ConfigError(f"{key}: {detail}{origin_note(origin)}") from None


def join_key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name

