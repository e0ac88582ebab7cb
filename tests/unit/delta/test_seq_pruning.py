"""Which files of a Delta table may hold a range of sequences (delta.files_holding_seqs): the
driver's answer, from the files' ``seq`` statistics, that lets a round skip Spark's planning job
when no file can hold its range. It must never leave out a file that may (no Spark here: a real
table written by ``deltalake``, and add actions as ``get_add_actions(flatten=True)`` gives)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from js_etl.delta.table import files_holding_seqs


def rows(seqs: range) -> pa.Table:
    return pa.table({"stream": pa.array(["S"] * len(seqs)),
                     "seq": pa.array(list(seqs), pa.int64())})


@pytest.fixture
def table(tmp_path: Path) -> DeltaTable:
    for seqs in (range(1, 11), range(11, 21), range(31, 41)):  # one file each
        write_deltalake(str(tmp_path), rows(seqs), mode="append")
    return DeltaTable(str(tmp_path))


@pytest.mark.parametrize(("first", "last", "expected"), [
    (1, 10, [(1, 10)]), (10, 11, [(1, 10), (11, 20)]), (20, 20, [(11, 20)]),
    (21, 30, []), (0, 0, []), (41, 99, []), (5, 35, [(1, 10), (11, 20), (31, 40)]),
])
def test_a_file_is_named_exactly_when_its_seq_statistics_overlap_the_range(
        table: DeltaTable, first: int, last: int, expected: list[tuple[int, int]]) -> None:
    files = files_holding_seqs(pa.table(table.get_add_actions(flatten=True)), first, last)
    assert sorted(zip(files.column("min.seq").to_pylist(),
                      files.column("max.seq").to_pylist(), strict=True)) == expected


def test_a_file_without_either_statistic_may_hold_any_seq() -> None:
    files = pa.table({"path": ["a", "b", "c"], "min.seq": pa.array([1, None, 50], pa.int64()),
                      "max.seq": pa.array([10, None, None], pa.int64())})
    assert files_holding_seqs(files, 20, 30).column("path").to_pylist() == ["b", "c"]
    assert files_holding_seqs(files, 5, 5).column("path").to_pylist() == ["a", "b", "c"]
    # A table whose files have no seq statistics at all: every file may hold the range.
    assert files_holding_seqs(files.drop_columns(["min.seq", "max.seq"]), 20, 30).num_rows == 3


def test_statistics_of_a_seq_that_is_not_an_integer_judge_nothing() -> None:
    """A string seq's statistics sort as text ('10' < '9'): every file may hold the range (a
    break-it review: comparing them with the range raised)."""
    files = pa.table({"path": ["a"], "min.seq": ["1"], "max.seq": ["9"]})
    assert files_holding_seqs(files, 10, 10).column("path").to_pylist() == ["a"]
