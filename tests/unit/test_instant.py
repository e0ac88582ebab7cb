"""User times as the nanoseconds NATS compares (pure logic; the server's wrap-around outside
them is shown against a real server in tests/source/test_source.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from js_etl.errors import ConfigError
from js_etl.instant import NS_MAX, NS_MIN, clamp_ns, format_instant, parse_instant


def test_the_ends_of_the_times_nats_compares_are_accepted_and_beyond_them_refused():
    assert parse_instant("2262-04-11T23:47:16.854775807Z") == NS_MAX
    assert parse_instant("1677-09-21T00:12:43.145224192Z") == NS_MIN
    assert format_instant(NS_MIN) == "1677-09-21T00:12:43.145224192Z"
    assert format_instant(NS_MAX) == "2262-04-11T23:47:16.854775807Z"
    for text in ("2262-04-11T23:47:16.854775808Z", "2300-01-01", "1600-01-01T00:00:00Z"):
        with pytest.raises(ConfigError, match=f"option from_time '{text}' is outside the times "
                                              "NATS compares, 1677-09-21T00:12:43.145224192Z "
                                              "to 2262-04-11T23:47:16.854775807Z"):
            parse_instant(text, "option from_time")


def test_a_filters_time_is_clamped_to_them():
    assert clamp_ns(datetime(2300, 1, 1, tzinfo=UTC)) == NS_MAX
    assert clamp_ns(datetime(1600, 1, 1, tzinfo=UTC)) == NS_MIN
    moment = datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=UTC)
    assert clamp_ns(moment) == parse_instant("2026-11-29T10:00:00.123456Z")
