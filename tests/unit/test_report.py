"""The run report's types: stop reasons serialise as the README's strings, progress reaches its
reader (pure logic)."""

from __future__ import annotations

import io
import json
import logging

from js_etl.report import (
    LogProgress,
    RunReport,
    StopReason,
    TerminalProgress,
    progress_for,
    summary_table,
)


def report(**counts: object) -> RunReport:
    return RunReport(job="j", run_id="r", stream="S", consumer="c", target="t",
                     dead_letter_target="d", started_at="2026-11-24T00:00:00+00:00", **counts)


def test_stop_reasons_are_a_closed_set_serialised_as_plain_strings():
    r = report()
    assert json.loads(r.to_json())["stopped_because"] is None  # not stopped yet
    r.stopped_because = StopReason.DRAINED
    assert json.loads(r.to_json())["stopped_because"] == "drained"
    assert StopReason("below_min_pending") is StopReason.BELOW_MIN_PENDING
    assert {s.value for s in StopReason} == {
        "drained", "target_reached", "max_messages", "max_bytes", "max_rounds", "max_seconds",
        "below_min_pending", "nothing_fetched", "terminated", "range_done", "nothing_in_range",
        "nothing_pending"}


def test_log_progress_writes_one_line_a_round(caplog):
    progress = LogProgress(logging.getLogger("js_etl.test"))
    with caplog.at_level(logging.INFO, logger="js_etl.test"):
        progress.round_done(report(rounds=2, messages_written=40, dead_letters=1, first_seq=1,
                                   last_seq=41, delta_versions=[3, 4]))
    assert caplog.messages == ["round 2: 40 messages written, 1 dead letters so far, "
                               "seq 1..41, versions [4]"]


def test_terminal_progress_rewrites_one_line_with_rate_and_time_left_and_ends_it():
    out = io.StringIO()
    now = iter([0.0, 5.0, 10.0])  # the clock at the start and at each round's end
    progress = TerminalProgress(out, clock=lambda: next(now))
    r = report(pending_before=100_000, rounds=1, messages_written=25_000)
    progress.round_done(r)
    r.rounds, r.messages_written = 2, 100_000
    progress.round_done(r)
    progress.finished(r)
    first, second = out.getvalue().split("\r")[1:]
    # \x1b[K clears what a longer line (or a log line) left to the right.
    assert first == ("[########......................] 25,000/100,000 messages, 5,000/s, "
                     "15s left, round 1\x1b[K")
    assert second == ("[" + "#" * 30 + "] 100,000/100,000 messages, 10,000/s, round 2"
                      "\x1b[K\n")


def test_a_terminal_gets_the_bar_anything_else_log_lines():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(progress_for(Tty()), TerminalProgress)
    assert isinstance(progress_for(io.StringIO()), LogProgress)


def test_summary_table_is_what_a_task_log_ends_with():
    r = report(messages_written=4995, dead_letters=5, rounds=3, delta_versions=[0, 1, 2],
               first_seq=1, last_seq=5000, pending_after=0, ack_pending_after=0, seconds=19.5,
               phase_seconds={"fetch": 4.0, "write": 9.5})
    r.stopped_because = StopReason.DRAINED
    assert summary_table(json.loads(r.to_json())).splitlines() == [
        "stopped because    drained",
        "messages written   4995",
        "dead letters       5",
        "rounds             3",
        "Delta versions     0..2 (3)",
        "seq range          1..5000",
        "pending after      0",
        "ack-pending after  0",
        "seconds            19.5",
        "  fetch            4.0",
        "  write            9.5",
    ]
