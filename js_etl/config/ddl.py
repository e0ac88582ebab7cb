"""A typo in ``decode.schema`` found without Spark, so it fails in the first second of a run
rather than after the JVM has started.

Not Spark's parser: it reads field names and the types of Spark's DDL (primitives with their
parameters, ``ARRAY<…>``, ``MAP<…, …>``, ``STRUCT<…>``, ``NOT NULL``, ``COMMENT '…'``) and says
only what is certainly wrong — an unknown type word, a bracket that does not close. Anything it
does not know the shape of (``COLLATE``, ``INTERVAL …``, a future type's syntax) it leaves to
Spark, which judges the schema when the run starts.
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
    if not ddl.strip():
        return None  # Spark reads it as no fields; the config's other checks judge that
    try:
        tokens = _Tokens(ddl)
        _fields(tokens, end=None)
        if tokens.peek() is not None:
            raise ValueError(f"unexpected {_shown(tokens.peek())}")
    except _Undecided:
        return None
    except ValueError as e:
        return f"decode.schema is not a valid Spark DDL schema: {e}"
    return None


def _fields(tokens: _Tokens, end: str | None) -> None:
    while True:
        name = tokens.take()
        if name is None or not re.fullmatch(r"`.+`|[A-Za-z_]\w*|\d+", name):
            raise ValueError(f"expected a field name, found {_shown(name)}")
        if tokens.peek() == ":":
            tokens.take()
        _type(tokens, f"field {name.strip('`')!r}")
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
            return
        tokens.take()


def _type(tokens: _Tokens, where: str) -> None:
    word = tokens.take()
    kind = (word or "").lower()
    if kind in _LEAVE_TO_SPARK:
        raise _Undecided
    if kind == "array":
        tokens.expect("<", f"after ARRAY in {where}")
        _type(tokens, where)
        tokens.expect(">", f"to close ARRAY<…> in {where}")
    elif kind == "map":
        tokens.expect("<", f"after MAP in {where}")
        _type(tokens, where)
        tokens.expect(",", f"between MAP's key and value types in {where}")
        _type(tokens, where)
        tokens.expect(">", f"to close MAP<…> in {where}")
    elif kind == "struct":
        tokens.expect("<", f"after STRUCT in {where}")
        if tokens.peek() == ">":
            tokens.take()
            return
        _fields(tokens, end=">")
        tokens.expect(">", f"to close STRUCT<…> in {where}")
    elif kind in _PARAMETERIZED:
        if tokens.peek() == "(":
            tokens.take()
            while tokens.peek() not in (")", None):
                tokens.take()
            tokens.expect(")", f"to close {kind.upper()}(…) in {where}")
    elif kind in _PRIMITIVES:
        if tokens.peek() == "(":  # TIME(p), a precision
            tokens.take()
            tokens.take()
            tokens.expect(")", f"to close {kind.upper()}(…) in {where}")
    else:
        raise ValueError(f"unknown type {_shown(word)} in {where} (Spark's types: BIGINT, INT, "
                         "DOUBLE, DECIMAL(p,s), STRING, BOOLEAN, DATE, TIMESTAMP, BINARY, "
                         "ARRAY<t>, MAP<k,v>, STRUCT<name: t, …>)")
