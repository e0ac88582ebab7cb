"""A typo in ``decode.schema`` found without Spark, so it fails in the first second of a run
rather than after the JVM has started.

Not Spark's parser: it reads field names and the types of Spark's DDL (primitives with their
parameters, ``ARRAY<…>``, ``MAP<…, …>``, ``STRUCT<…>``, ``NOT NULL``, ``COMMENT '…'``) and says
only what is certainly wrong — an unknown type word, a bracket that does not close. Anything it
does not know the shape of (``COLLATE``, ``INTERVAL …``, a future type's syntax) it leaves to
Spark, which judges the schema when the run starts. What it reads, :func:`field_types` gives,
for the choices made before Spark starts.
"""

from __future__ import annotations

import re

# Spark SQL's type names (DataTypeAstBuilder, Spark 4.x), lower case.
_PRIMITIVES = frozenset({
    "boolean", "tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long",
    "float", "real", "double", "date", "timestamp", "timestamp_ntz", "timestamp_ltz", "string",
    "binary", "void", "variant", "time",
})
_PARAMETERIZED = frozenset({"decimal", "dec", "numeric", "char", "character", "varchar"})
_LEAVE_TO_SPARK = frozenset({"interval", "geometry", "geography"})
# Spark's other names for a type, as field_types gives them.
_ALIASES = {"byte": "tinyint", "short": "smallint", "integer": "int", "long": "bigint",
            "real": "float", "timestamp_ltz": "timestamp", "dec": "decimal", "numeric": "decimal"}
_TOKEN = re.compile(r"\s*(`(?:[^`]|``)+`|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[A-Za-z_]\w*"
                    r"|\d+|[<>(),:])")


class _Undecided(Exception):
    """Something Spark's grammar may accept that this reader does not know."""


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items: list[str] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if not match:
                raise _Undecided
            self.items.append(match.group(1))
            pos = match.end()
        self.pos = 0

    def peek(self) -> str | None:
        return self.items[self.pos] if self.pos < len(self.items) else None

    def take(self) -> str | None:
        token = self.peek()
        self.pos += 1
        return token

    def expect(self, token: str, where: str) -> None:
        got = self.take()
        if got != token:
            raise ValueError(f"expected '{token}' {where}, found {_shown(got)}")


def _shown(token: str | None) -> str:
    return "the end" if token is None else f"'{token}'"


def ddl_problem(ddl: str) -> str | None:
    """What is certainly wrong with the Spark DDL schema ``ddl``, or None."""
    try:
        _read(ddl)
    except _Undecided:
        return None
    except ValueError as e:
        return f"decode.schema is not a valid Spark DDL schema: {e}"
    return None


def field_types(ddl: str) -> dict[str, str] | None:
    """The top-level fields of ``ddl`` as {name: type}, each type in lower case with Spark's
    aliases resolved and nested field names left out (``decimal(18,4)``,
    ``struct<bigint,array<string>>``, ``map<string,date>``); None for a schema this reader does
    not certainly know, or no fields."""
    try:
        fields = _read(ddl)
    except (_Undecided, ValueError):
        return None
    return dict(fields) or None


def _read(ddl: str) -> list[tuple[str, str]]:
    if not ddl.strip():
        return []  # Spark reads it as no fields; the config's other checks judge that
    tokens = _Tokens(ddl)
    fields = _fields(tokens, end=None)
    if tokens.peek() is not None:
        raise ValueError(f"unexpected {_shown(tokens.peek())}")
    return fields


def _fields(tokens: _Tokens, end: str | None) -> list[tuple[str, str]]:
    fields = []
    while True:
        name = tokens.take()
        if name is None or not re.fullmatch(r"`.+`|[A-Za-z_]\w*|\d+", name):
            raise ValueError(f"expected a field name, found {_shown(name)}")
        if tokens.peek() == ":":
            tokens.take()
        fields.append((name[1:-1].replace("``", "`") if name[0] == "`" else name,
                       _type(tokens, f"field {name.strip('`')!r}")))
        while tokens.peek() is not None and tokens.peek() not in (",", end):
            word = (tokens.take() or "").lower()
            if word == "not":
                if (tokens.take() or "").lower() != "null":
                    raise ValueError(f"expected NULL after NOT in field {name!r}")
            elif word == "comment":
                text = tokens.take() or ""
                if text[:1] not in ("'", '"'):
                    raise ValueError(f"expected a quoted text after COMMENT in field {name!r}")
            elif word in ("collate", "default", "generated"):
                raise _Undecided  # their syntax is Spark's to judge
            else:
                raise ValueError(f"unexpected '{word}' after the type of field {name!r} (a "
                                 "comma missing?)")
        if tokens.peek() != ",":
            return fields
        tokens.take()


def _type(tokens: _Tokens, where: str) -> str:
    """The type at ``tokens`` as :func:`field_types` gives it."""
    word = tokens.take()
    kind = (word or "").lower()
    if kind in _LEAVE_TO_SPARK:
        raise _Undecided
    if kind == "array":
        tokens.expect("<", f"after ARRAY in {where}")
        element = _type(tokens, where)
        tokens.expect(">", f"to close ARRAY<…> in {where}")
        return f"array<{element}>"
    if kind == "map":
        tokens.expect("<", f"after MAP in {where}")
        key = _type(tokens, where)
        tokens.expect(",", f"between MAP's key and value types in {where}")
        value = _type(tokens, where)
        tokens.expect(">", f"to close MAP<…> in {where}")
        return f"map<{key},{value}>"
    if kind == "struct":
        tokens.expect("<", f"after STRUCT in {where}")
        if tokens.peek() == ">":
            tokens.take()
            return "struct<>"
        fields = _fields(tokens, end=">")
        tokens.expect(">", f"to close STRUCT<…> in {where}")
        return f"struct<{','.join(kind for _, kind in fields)}>"
    if kind in _PARAMETERIZED:
        parameters = []
        if tokens.peek() == "(":
            tokens.take()
            while tokens.peek() not in (")", None):
                parameters.append(tokens.take() or "")
            tokens.expect(")", f"to close {kind.upper()}(…) in {where}")
        if _ALIASES.get(kind, kind) != "decimal":
            return f"{kind}({''.join(parameters)})"  # CHAR(n), VARCHAR(n)
        precision, _, scale = "".join(parameters).partition(",")
        return f"decimal({precision or 10},{scale or 0})"
    if kind in _PRIMITIVES:
        if tokens.peek() == "(":  # TIME(p), a precision
            tokens.take()
            digits = tokens.take()
            tokens.expect(")", f"to close {kind.upper()}(…) in {where}")
            return f"{kind}({digits})"
        return _ALIASES.get(kind, kind)
    raise ValueError(f"unknown type {_shown(word)} in {where} (Spark's types: BIGINT, INT, "
                     "DOUBLE, DECIMAL(p,s), STRING, BOOLEAN, DATE, TIMESTAMP, BINARY, "
                     "ARRAY<t>, MAP<k,v>, STRUCT<name: t, …>)")
