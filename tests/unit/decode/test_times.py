"""js_etl.decode.times against what Spark 4.2's from_json gave for the same JSON values (a UTC
session, the drain's options; the one-off comparison behind docs/design/json-decoding.md).
tests/decode/test_decoder_parity.py::test_dates_and_timestamps_decode_alike compares the
three types with Spark itself; the values Python's datetime cannot hold are pinned here."""

from __future__ import annotations

import pytest

from js_etl.decode import times


@pytest.mark.parametrize(("text", "micros"), [
    ("2026-11-28T10:00:00", 1795860000000000),
    ("2026-11-28 10:00:00", 1795860000000000),
    ("2026", 1767225600000000),
    ("2026-11-28T10:00:00.123456789", 1795860000123456),  # truncated, not rounded
    ("12026-11-28", 317365344000000000),
    ("-2026-11-28", -126072979200000000),
    ("12345", 327403382400000000),
    ("-141428", -4525203801600000000),
    ("2026-11-28T10:00:00Z", None),  # any zone: not a TIMESTAMP_NTZ
    ("2026-11-28T10:00:00 UTC", None),
    ("10:00:00", None),  # a time alone
    ("2026-11-28T", None),
    ("2026GMT", None),  # no legacy fallback
    ("1234567-01-01", None),
    ("", None),
])
def test_timestamp_ntz_reads_as_spark_does(text, micros):
    assert times.json_timestamp_ntz(text) == micros


@pytest.mark.parametrize(("text", "days"), [
    ("-12345678", -12345437),  # Spark 1.5's day count, Julian before 0001-01-01
    ("-2147483648", -2147439564),
    ("2147483648", None),
    ("\uff11\uff12\uff13", 123),  # Integer.parseInt takes any decimal digits
    ("1234567-01-01", 450196810),
    ("-5877641-06-23", -2147483648),
    ("-5877641-06-22", None),
])
def test_dates_beyond_pythons_read_as_spark_does(text, days):
    assert times.json_date(text) == days


@pytest.mark.parametrize(("text", "micros"), [
    ("2026-03-08T02:30:00 America/New_York", 1772955000000000),  # in the gap
    ("2026-11-01T01:30:00 America/New_York", 1793511000000000),  # in the overlap: the earlier
    ("1850-01-01T00:00:00 Europe/Paris", -3786826161000000),  # local mean time
    ("20000-06-01T00:00:00 America/New_York", 568984968000000000),  # the last rules, far on
    ("2026-11-28T10:00:00 SystemV/EST5", 1795878000000000),  # only Java has it
    ("2026-11-28T10:00:00 Factory", None),  # only Python's zoneinfo has it
    ("2026-11-28T10:00:00+01:5", 1795856100000000),
])
def test_zones_read_by_the_jvms_own_rules(text, micros):
    if times.java_tzdb() is None:
        pytest.skip("no JVM here")
    assert times.json_timestamp(text) == micros


def test_json_integers_are_seconds_wrapping_past_the_longs():
    assert times.json_seconds(1764324000) == 1764324000000000
    assert times.json_seconds(9223372036855) == -9223372036854551616
    assert times.json_seconds(9223372036854775807) == -1000000
    assert times.json_seconds(2**63) is None


@pytest.mark.parametrize(("text", "offset_hours"), [
    ("10:00:00", 0), ("T10:00:00", 0), ("10:00", 0), ("T10:00:00Z", 0),
    ("T10:00:00+02:00", 2),
])
def test_a_time_alone_is_a_timestamp_today(text, offset_hours):
    """Spark reads a time alone as today's, in the text's zone. Kept out of the differential
    test (tests/drain/test_columnar.py): a run across midnight would compare two days. Here
    today is read before and after, and either day is right."""
    from datetime import UTC, datetime, timedelta, timezone

    zone = timezone(timedelta(hours=offset_hours))
    days = {datetime.now(zone).date()}
    micros = times.json_timestamp(text)
    days.add(datetime.now(zone).date())
    expected = {int((datetime(d.year, d.month, d.day, 10, tzinfo=zone)
                     - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000
                for d in days}
    assert micros in expected
