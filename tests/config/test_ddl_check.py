"""decode.schema is checked without Spark (js_etl.config.ddl) so a typo fails before the JVM
starts. That check must never refuse a schema Spark accepts: every schema here goes through
both, and whatever the check calls wrong, Spark's own parser must refuse too."""

from __future__ import annotations

import pytest
from pyspark.sql.types import _parse_datatype_string

from js_etl.config.ddl import ddl_problem, field_types

ACCEPTED = [
    "id BIGINT, kind STRING", "id: bigint", "`a b` INT COMMENT 'the a', c DOUBLE NOT NULL",
    "a STRUCT<b: INT, c ARRAY<STRING>>", "m MAP<STRING, DECIMAL(10,2)>", "d DEC(5)",
    "t TIMESTAMP_NTZ, u TIMESTAMP_LTZ, v TIMESTAMP", "c CHAR(3), v VARCHAR(10)",
    "s STRING COLLATE UTF8_LCASE", "b BINARY, x BOOLEAN, y TINYINT, z SMALLINT, w LONG",
    "e STRUCT<>", "n NUMERIC(38, 0), f FLOAT, r REAL, by BYTE, sh SHORT", "v VARIANT",
    "i INTERVAL DAY TO SECOND", "`we``ird` STRING", "nested ARRAY<MAP<STRING, STRUCT<a: INT>>>",
]
TYPOS = [
    "id BIGINTT", "x STRNG NOT NULL", "x STRUCT<a INT", "x ARRAY<INT", "m MAP<STRING>",
    "a INT, b", "id BIGINT,", "x INT NOT NUL", "x STRUCT<a INT,>", "a INT b INT",
    "k ARRAY<>", "d DECIMAL(10,2", "s STRING COMMENT",
]


@pytest.mark.parametrize("ddl", ACCEPTED + TYPOS)
def test_the_check_refuses_only_what_spark_refuses(spark, ddl):
    problem = ddl_problem(ddl)
    try:
        _parse_datatype_string(ddl)
        spark_accepts = True
    except Exception:
        spark_accepts = False
    if problem is not None:
        assert not spark_accepts, f"Spark accepts {ddl!r}, the check says: {problem}"
    if ddl in ACCEPTED:
        assert spark_accepts and problem is None
    else:
        assert problem is not None, f"a typo the check missed: {ddl!r}"


def _shape(kind) -> str:
    """Spark's simple string of a type without nested field names: field_types' form."""
    from pyspark.sql import types as T

    if isinstance(kind, T.StructType):
        return f"struct<{','.join(_shape(f.dataType) for f in kind.fields)}>"
    if isinstance(kind, T.ArrayType):
        return f"array<{_shape(kind.elementType)}>"
    if isinstance(kind, T.MapType):
        return f"map<{_shape(kind.keyType)},{_shape(kind.valueType)}>"
    return kind.simpleString()


@pytest.mark.parametrize("ddl", ACCEPTED)
def test_the_field_types_read_without_spark_are_sparks(spark, ddl):
    """What expects_columnar reads before the JVM starts: Spark's types, or no answer."""
    types = field_types(ddl)
    if types is None:
        assert any(word in ddl for word in ("COLLATE", "INTERVAL")), ddl
        return
    schema = _parse_datatype_string(ddl)
    assert types == {f.name: _shape(f.dataType) for f in schema.fields}
