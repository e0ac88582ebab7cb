"""The run report's types: stop reasons serialise as the README's strings, progress reaches its
reader (pure logic)."""

from __future__ import annotations

import io
import json
import logging

from js_etl.report import LogProgress, RunReport, StopReason, TerminalProgress, progress_for


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
        "below_min_pending", "nothing_fetched", "terminated", "range_done", "nothing_in_range"}


def test_log_progress_writes_one_line_a_round(caplog):
    progress = LogProgress(logging.getLogger("js_etl.test"))
    with caplog.at_level(logging.INFO, logger="js_etl.test"):
        progress.round_done(report(rounds=2, messages_written=40, dead_letters=1, first_seq=1,
                                   last_seq=41, delta_versions=[3, 4]))
    assert caplog.messages == ["round 2: 40 messages written, 1 dead letters so far, "
                               "seq 1..41, versions [4]"]


def test_terminal_progress_rewrites_one_line_and_ends_it():
    out = io.StringIO()
    progress = TerminalProgress(out)
    r = report(pending_before=100, rounds=1, messages_written=25)
    progress.round_done(r)
    r.rounds, r.messages_written = 2, 100
    progress.round_done(r)
    progress.finished(r)
    first, second = out.getvalue().split("\r")[1:]
    assert first == "[########......................] 25/100 messages, round 1"
    assert second == "[" + "#" * 30 + "] 100/100 messages, round 2\n"


def test_a_terminal_gets_the_bar_anything_else_log_lines():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(progress_for(Tty()), TerminalProgress)
    assert isinstance(progress_for(io.StringIO()), LogProgress)
