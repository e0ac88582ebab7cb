"""The options of ``spark.read.format("nats_jetstream")``: checked, typed, secrets refused.

Options are checked by the job config's own kinds (:mod:`js_etl.config.model`), so a value that
the YAML config would refuse is refused here with the same reason, named as the option. They are
visible in query plans, the Spark UI and logs: credentials are taken only by file path or
environment-variable name, and a literal secret (by option name, or a value that looks like a
JWT or an nkey seed) is refused without being echoed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from js_etl.config.model import (
    DEFAULT_LEASE_BUCKET,
    LEASE_BUCKET,
    DecodeConfig,
    FetchConfig,
    JobConfig,
    NatsConfig,
    TlsConfig,
)
from js_etl.config.values import byte_size, coerce
from js_etl.errors import ConfigError, RangeError
from js_etl.instant import format_instant, parse_instant
from js_etl.source.read_range import RangeRequest

# option -> the config key that checks it (same kinds and rules as the job config's)
_CONNECTION = {
    "servers": "servers", "name": "name", "connect_timeout": "connect_timeout",
    "domain": "domain", "creds_file": "creds_file", "nkey_seed_file": "nkey_seed_file",
    "token_env": "token_env", "token_file": "token_file", "user": "user",
    "password_env": "password_env", "password_file": "password_file",
}
_TLS = {"tls_ca_file": "ca_file", "tls_cert_file": "cert_file", "tls_key_file": "key_file"}
_FETCH = {"partitions": "partitions", "batch": "batch", "max_bytes": "max_bytes",
          "pull_timeout": "pull_timeout"}
_DECODE = {"decode": "format", "schema": "schema", "keep_raw": "keep_raw"}
_RANGE = ("from_seq", "to_seq", "from_time", "to_time")
# spark.readStream only (a batch read refuses them when it is planned)
STREAMING = ("start", "max_messages_per_batch", "max_bytes_per_batch", "fail_on_data_loss",
             "commit_consumer", "lease_bucket")
OPTIONS = (*_CONNECTION, *_TLS, "stream", "filter_subjects", *_RANGE, *_FETCH, *_DECODE,
           *STREAMING)
# Options are shown in query plans, the Spark UI and logs: a secret given as an option leaks.
_SECRET_OPTIONS = {
    "token": "token_env (name of an environment variable) or token_file",
    "password": "password_env (name of an environment variable) or password_file",
    "pass": "password_env (name of an environment variable) or password_file",
    "nkey_seed": "nkey_seed_file (path of the seed file) or creds_file",
    "seed": "nkey_seed_file (path of the seed file) or creds_file",
    "nkey": "nkey_seed_file (path of the seed file) or creds_file",
    "creds": "creds_file (path of the .creds file)",
    "jwt": "creds_file (path of the .creds file)",
    "user_jwt": "creds_file (path of the .creds file)",
}
_SECRET_VALUE = re.compile(r"-----BEGIN NATS USER JWT-----|^S[A-Z]A[A-Z2-7]{50,}$", re.M)



# --- parsing --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StreamingOptions:
    """What only ``spark.readStream`` takes; its start is otherwise ``from_seq``/``from_time``."""

    start: Literal["earliest", "latest"] = "earliest"  # without from_seq/from_time
    max_messages_per_batch: int | None = None  # sequences per micro-batch (admission control)
    max_bytes_per_batch: int | None = None  # ... by the stream's average stored message size
    fail_on_data_loss: bool = True  # messages gone before the query read them: fail, or skip
    commit_consumer: str | None = None  # a durable consumer moved to what the sink committed
    lease_bucket: str = DEFAULT_LEASE_BUCKET  # where a drain of commit_consumer holds its lease
    given: tuple[str, ...] = ()  # which of these options were set


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The checked options of one read (no NATS needed to build them)."""

    nats: NatsConfig
    stream: str
    filter_subjects: tuple[str, ...]
    request: RangeRequest
    fetch: FetchConfig
    decode: DecodeConfig
    streaming: StreamingOptions = StreamingOptions()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        given = {k.lower(): v for k, v in options.items() if k.lower() != "path"}
        for key, value in given.items():
            if key in _SECRET_OPTIONS:
                raise ConfigError(
                    f"option {key!r} is refused: options are visible in query plans, the Spark "
                    f"UI and logs, so a secret must not be one; use {_SECRET_OPTIONS[key]}")
            if key not in OPTIONS:
                close = difflib.get_close_matches(key, OPTIONS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"unknown option {key!r}{hint}; options: {', '.join(OPTIONS)}")
            if _SECRET_VALUE.search(str(value)):
                raise ConfigError(
                    f"option {key!r} looks like a credential itself (a JWT or an nkey seed): "
                    "options are visible in query plans, the Spark UI and logs; give the path "
                    "of the file instead (creds_file, nkey_seed_file)")
        stream = given.get("stream")
        if not stream:
            raise ConfigError("option 'stream' is required: the stream to read")
        with _naming_options():
            nats = NatsConfig(**{_CONNECTION[k]: _typed(v) for k, v in given.items()
                                 if k in _CONNECTION},
                              tls=TlsConfig(**{_TLS[k]: v for k, v in given.items()
                                               if k in _TLS}))
            fetch = FetchConfig(**{_FETCH[k]: _typed(v) for k, v in given.items()
                                   if k in _FETCH})
            decoding: dict[str, Any] = {_DECODE[k]: v if k != "keep_raw" else _typed(v)
                                        for k, v in given.items() if k in _DECODE}
            # Its checks name clashes with js-etl's columns; Spark itself parses the DDL when
            # load() gets the schema (a Python worker has no SparkContext to parse it with).
            decode = DecodeConfig(**decoding)
        filters = tuple(s.strip() for s in given.get("filter_subjects", "").split(",")
                        if s.strip())
        request = _request(given)
        return cls(nats, stream, filters, request, fetch, decode, _streaming(given, request))


def _typed(text: str) -> Any:
    """Option values are strings; read them as the YAML config reads env/--set values."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _request(given: Mapping[str, str]) -> RangeRequest:
    seqs: dict[str, int | None] = {}
    for key in ("from_seq", "to_seq"):
        text = given.get(key)
        if text is None:
            seqs[key] = None
        elif not text.strip().isdigit() or int(text) < 1:
            raise RangeError(f"option {key} must be a stream sequence (1 or more), got {text!r}")
        else:
            seqs[key] = int(text)
    times = {k: parse_instant(given[k], f"option {k}") if k in given else None
             for k in ("from_time", "to_time")}
    if seqs["from_seq"] is not None and times["from_time"] is not None:
        raise RangeError("give at most one start: from_seq or from_time")
    if seqs["to_seq"] is not None and times["to_time"] is not None:
        raise RangeError("give at most one end: to_seq or to_time")
    lo, hi = seqs["from_seq"], seqs["to_seq"]
    if lo is not None and hi is not None and hi < lo:
        raise RangeError(f"empty range: to_seq {hi} is before from_seq {lo}")
    start, end = times["from_time"], times["to_time"]
    if start is not None and end is not None and end < start:
        raise RangeError(f"empty range: to_time {format_instant(end)} is before from_time "
                         f"{format_instant(start)}")
    return RangeRequest(lo, hi, start, end)


def _streaming(given: Mapping[str, str], request: RangeRequest) -> StreamingOptions:
    start = given.get("start", "earliest").strip().lower()
    if start not in ("earliest", "latest"):
        raise ConfigError(f"option start must be earliest or latest, got {given['start']!r}; "
                          "a sequence or a time is from_seq or from_time")
    if "start" in given and (request.from_seq is not None or request.from_time is not None):
        raise ConfigError("give at most one start: start, from_seq or from_time")
    limit = given.get("max_messages_per_batch")
    if limit is not None and (not limit.strip().isdigit() or int(limit) < 1):
        raise ConfigError(f"option max_messages_per_batch must be a count (1 or more), "
                          f"got {limit!r}")
    size = given.get("max_bytes_per_batch")
    max_bytes = None if size is None else coerce("option max_bytes_per_batch", size, byte_size())
    fail = given.get("fail_on_data_loss", "true").strip().lower()
    if fail not in ("true", "false"):
        raise ConfigError(f"option fail_on_data_loss must be true or false, got {fail!r}")
    consumer = given.get("commit_consumer")
    if consumer is not None and not re.fullmatch(r"[^.*>\s]+", consumer):
        raise ConfigError(f"option commit_consumer must be a consumer name (no '.', '*', '>' "
                          f"or spaces), got {consumer!r}")
    bucket = coerce("option lease_bucket", given.get("lease_bucket", DEFAULT_LEASE_BUCKET),
                    LEASE_BUCKET)
    if "lease_bucket" in given and consumer is None:
        raise ConfigError("option lease_bucket goes with commit_consumer (where a drain of that "
                          "consumer would hold its lease)")
    return StreamingOptions("latest" if start == "latest" else "earliest",
                            None if limit is None else int(limit), max_bytes, fail == "true",
                            consumer, bucket, tuple(k for k in STREAMING if k in given))


def job_options(config: JobConfig) -> dict[str, str]:
    """The options that read ``config``'s stream as its job would: its connection (credentials
    by file path or variable name, as the config holds them), filter, fetch and decode
    settings, and its ``streaming`` section."""
    def text(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value)
        return str(value).lower() if isinstance(value, bool) else str(value)

    sections = ((_CONNECTION, config.nats), (_TLS, config.nats.tls), (_FETCH, config.fetch),
                (_DECODE, config.decode))
    options = {option: text(getattr(section, key)) for keys, section in sections
               for option, key in keys.items() if getattr(section, key) not in (None, False)}
    options["stream"] = config.source.stream
    if config.source.filter_subjects:
        options["filter_subjects"] = text(config.source.filter_subjects)
    streaming = config.streaming
    if streaming.from_seq is not None:
        options["from_seq"] = str(streaming.from_seq)
    else:
        options["start"] = streaming.start
    for key in ("max_messages_per_batch", "max_bytes_per_batch"):
        if getattr(streaming, key) is not None:
            options[key] = str(getattr(streaming, key))
    options["fail_on_data_loss"] = text(streaming.fail_on_data_loss)
    if streaming.commit_consumer:
        options["commit_consumer"] = config.source.consumer
        options["lease_bucket"] = config.source.lease_bucket
    return options


_CONFIG_KEYS = {**{f"nats.{v}": k for k, v in _CONNECTION.items()},
                **{f"nats.tls.{v}": k for k, v in _TLS.items()},
                **{f"fetch.{v}": k for k, v in _FETCH.items()},
                **{f"decode.{v}": k for k, v in _DECODE.items()}}
_CONFIG_KEY = re.compile("|".join(re.escape(k) for k in sorted(_CONFIG_KEYS, key=len,
                                                                reverse=True)))


class _naming_options:
    """Rewrite the config's key names (``nats.token_env``) in errors as option names."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: object) -> None:
        if isinstance(error, ConfigError):
            text = _CONFIG_KEY.sub(lambda m: f"option {_CONFIG_KEYS[m.group(0)]}", str(error))
            raise type(error)(text.replace("--set ", "")) from None
