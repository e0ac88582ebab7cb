"""Loading the job configuration: defaults < YAML file < ``JS_ETL__*`` env < ``--set``.

The layers are merged into a flat ``{"section.key": (raw value, origin)}`` map, so an error can
name where a bad value came from, then built into :class:`~js_etl.config.model.JobConfig`.
Secrets are never part of the config: it holds the *names* of environment variables and the
*paths* of files that contain them, so :meth:`JobConfig.as_dict` is safe to log.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from js_etl.config.model import SCHEMA, JobConfig
from js_etl.config.values import Kind, coerce, join_key, origin_note, show
from js_etl.errors import ConfigError

ENV_PREFIX = "JS_ETL__"

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
    candidates = [k for k in SCHEMA if k]
    close = difflib.get_close_matches(key, candidates, n=1)
    if close:
        hint = f"did you mean {close[0]!r}?"
    else:
        parent = key.rpartition(".")[0]
        while not isinstance(SCHEMA.get(parent), type):
            parent = parent.rpartition(".")[0]
        names = [f.name for f in fields(SCHEMA[parent])]
        hint = f"valid keys in {parent or 'the top level'}: {', '.join(names)}"
    return ConfigError(f"unknown key {key!r} ({hint}){origin_note(origin)}")


def _put(out: dict[str, tuple[Any, str]], path: tuple[str, ...], value: Any, origin: str) -> None:
    """Place ``value`` at ``path`` in the flat map, expanding mappings given for sections."""
    key = ".".join(path)
    where = origin_note(origin)
    if key in _SECRETS:
        raise ConfigError(f"{key}: secrets are never read from config; {_SECRETS[key]}{where}")
    node = SCHEMA.get(key) if all(path) or not path else None  # "" only names the top level
    if isinstance(node, Kind):
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
            raise ConfigError(f"{name}: expected a mapping of settings, got {show(value)}{where}")
        for sub, sub_value in value.items():
            if not isinstance(sub, str):
                raise ConfigError(f"{name}: keys must be strings, got {show(sub)}{where}")
            _put(out, (*path, sub), sub_value, origin)
        return
    # One entry of a mapping-valued key: "spark.conf.spark.sql.shuffle.partitions=8".
    for i in range(len(path) - 1, 0, -1):
        parent = ".".join(path[:i])
        parent_node = SCHEMA.get(parent)
        if isinstance(parent_node, Kind) and parent_node.entries:
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
        data = yaml.load(text, Loader=_StrictLoader)
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
        key = join_key(prefix, f.name)
        if "section" in f.metadata:
            kwargs[f.name] = _build(f.metadata["section"], key, values)
            continue
        raw, origin = values.get(key, (None, None))
        if raw is not None:
            kwargs[f.name] = coerce(key, raw, f.metadata["kind"], origin)
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
