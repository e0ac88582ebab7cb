"""The benchmark (``python -m tools.bench``): a smoke run of the real command (no timing
assertions — speed is measured by the benchmark, never by a test), plus the pure pieces that
decide "verified" and the output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from js_etl.errors import TerminalError
from tools.bench.cli import main as bench_main
from tools.bench.cli import settings_from_args
from tools.bench.report import format_results
from tools.bench.settings import client_target, payload
from tools.bench.verify import table_problems

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
LEGS = {"client_limit", "simple_peer", "js_etl", "js_etl_connect"}  # every default leg
N = 2000  # messages of the smoke run's one cell
RATIOS = {"js_etl_vs_client_limit", "js_etl_vs_simple_peer"}


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_bench_quick_runs_every_leg_verified_into_s3_with_the_rich_schema(tmp_path):
    """One small cell of ``--quick`` with every default leg, their tables in a real S3 store
    (SeaweedFS, started by the bench) and the rich schema (a timestamp, a decimal, a nested
    struct): every leg verified (the tables as read from the bucket with deltalake, every rich
    column filled), the ratios and the figures reported, the store's CPU apart. Every leg and
    every figure is the same code for any size or target."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "TZ": "UTC"}
    proc = subprocess.run([str(BIN / "python"), "-m", "tools.bench", "--quick", "--target", "s3",
                           "--schema", "rich", "--messages", str(N), "--size", "512",
                           "--json", str(out), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    result = json.loads(last_line(proc.stdout))
    assert json.loads(out.read_text()) == result
    assert result["ok"] is True and result["failed_legs"] == []
    assert result["store"]["endpoint"].startswith("http://127.0.0.1:")
    [cell] = result["workloads"]
    assert (cell["messages"], cell["size"], cell["target"], cell["schema"]) == (N, 512, "s3",
                                                                                "rich")
    assert cell["publish"]["last_seq"] - cell["publish"]["first_seq"] + 1 == N
    assert set(cell["legs"]) == LEGS
    for name, leg in cell["legs"].items():
        assert leg["verified"] is True, (name, leg["problems"])
        assert leg["problems"] == []
        assert leg["messages"] == N
        assert leg["consumer"]["num_pending"] == 0
        assert leg["consumer"]["num_ack_pending"] == 0
        assert set(leg["peak_rss_mib"]) >= {"driver", "jvm", "workers", "total"}
        assert "store" in leg["cpu_seconds"] and "store" not in leg["cpu_seconds"]["by_kind"]
    assert cell["legs"]["client_limit"]["processes"] == 2
    for name in LEGS - {"client_limit"}:
        leg = cell["legs"][name]
        assert leg["table"].startswith("s3://js-etl-bench-")
        assert leg["verified_with"] == "deltalake (S3 storage options)"
        counts = leg["table_counts"]
        assert counts["rows"] == counts["distinct_seq"] == counts["distinct_id"] == N
        assert counts["filled"] == N
    ours = cell["legs"]["js_etl"]
    assert ours["processes"] == 2
    assert ours["peak_rss_mib"]["jvm"] > 0 and ours["peak_rss_mib"]["driver"] > 0
    assert set(ours["phase_seconds"]) >= {"fetch", "write", "ack"}
    by_kind = ours["cpu_seconds"]["by_kind"]
    assert by_kind["server"] > 0 and by_kind["workers"] > 0 and by_kind["jvm"] > 0
    assert sum(by_kind.values()) == pytest.approx(ours["cpu_seconds"]["ours"], abs=0.1)
    # The writer js-etl picked is reported, with the reason when it is Spark's.
    assert ours["writer"] in ("columnar", "spark")
    assert ours["writer"] == "columnar" or ours["writer_note"]
    assert set(cell["ratios"]) == RATIOS and set(cell["targets"]) == RATIOS
    assert set(cell["cpu_ratios_all_runs"]) == RATIOS
    for key in RATIOS:
        assert isinstance(cell["ratios"][key], float) and cell["ratios"][key] > 0
    # The Connect leg: the same drain as a Spark Connect client, on its own table, its figures
    # as ratios over the classic leg's.
    remote = cell["legs"]["js_etl_connect"]
    assert remote["table"] != ours["table"] and remote["writer"] == ours["writer"]
    assert remote["peak_rss_mib"]["jvm"] > 0 and remote["peak_rss_mib"]["driver"] > 0
    assert set(remote["phase_seconds"]) >= {"fetch", "write", "ack"}
    for key in ("js_etl_connect_vs_js_etl", "per_cpu_second"):
        assert isinstance(cell["connect_ratios"][key], float) and cell["connect_ratios"][key] > 0
    # The human table, with the client-limit path named.
    assert "js-etl / client limit" in proc.stdout
    assert "CPU seconds by process kind: client limit " in proc.stdout
    assert "Puller.pull" in proc.stdout
    assert "js-etl over Spark Connect / js-etl on a classic session" in proc.stdout
    assert f"{N:,} x 512 B, target s3, schema rich" in proc.stdout
    assert "counted apart from every leg" in proc.stdout


def test_payloads_are_json_of_the_requested_size():
    pad = b"x" * 4096
    for schema in ("flat", "rich"):
        for size in (256, 4096):
            body = payload(7, size, pad, schema)
            assert len(body) == size
            assert json.loads(body)["id"] == 7
    assert json.loads(payload(123_456, 10, pad))["kind"] == "order"  # minimum size wins


def test_rich_payloads_fill_every_field_the_peer_declares():
    """The rich schema's payloads, read by pyarrow with the simple peer's Arrow schema (as the
    peer reads them), have every field filled: a timestamp, a decimal of scale 4 and a nested
    struct."""
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.json as pj

    from tools.bench.legs import peer_arrow_schema
    from tools.bench.settings import SCHEMAS

    schema = peer_arrow_schema("rich")
    assert schema.names == ["id", "kind", "amount", "pad", "ts", "price", "customer"]
    assert SCHEMAS["rich"].startswith(SCHEMAS["flat"] + ", ts TIMESTAMP, price DECIMAL(18,4), "
                                      "customer STRUCT<id: BIGINT, name: STRING, address: ")
    pad = b"x" * 4096
    rows = pj.read_json(pa.BufferReader(b"\n".join(payload(i, 256, pad, "rich")
                                                    for i in (0, 1_234, 999_999))),
                        parse_options=pj.ParseOptions(explicit_schema=schema)).to_pylist()
    assert [row["id"] for row in rows] == [0, 1_234, 999_999]
    assert rows[1]["ts"] == datetime.datetime(2026, 1, 1, 0, 0, 1, 234_000,
                                              tzinfo=datetime.UTC)
    assert rows[1]["price"] == decimal.Decimal("1234.1234")
    assert rows[1]["customer"] == {"id": 1_234, "name": "customer-1234",
                                   "address": {"city": "Osaka", "zip": "01234"}}
    assert all(value is not None for row in rows for value in row.values())


def test_a_table_that_is_not_the_published_set_fails_verification():
    good = {"rows": 3, "distinct_seq": 3, "min_seq": 1, "max_seq": 3, "distinct_id": 3,
            "min_id": 0, "max_id": 2}
    assert table_problems(good, 3, 1, 3) == []
    duplicated = {**good, "rows": 4}
    assert table_problems(duplicated, 3, 1, 3) == ["table rows 4 != 3"]
    missing = {**good, "rows": 2, "distinct_seq": 2, "distinct_id": 2, "max_seq": 2, "max_id": 1}
    assert len(table_problems(missing, 3, 1, 3)) == 5
    # A decoded table must have its ids; a raw one is counted by its sequences, each row with
    # a payload; a rich one has every rich column filled.
    seqs = {k: v for k, v in good.items() if not k.endswith("_id")}
    assert table_problems(seqs, 3, 1, 3) == [
        "table has no column for distinct_id", "table has no column for min_id",
        "table has no column for max_id"]
    assert table_problems({**seqs, "payload_rows": 3}, 3, 1, 3, ids=False) == []
    assert table_problems({**seqs, "payload_rows": 2}, 3, 1, 3, ids=False) == [
        "table payload_rows 2 != 3"]
    assert table_problems({**good, "filled": 2}, 3, 1, 3, filled=True) == ["table filled 2 != 3"]
    assert table_problems(good, 3, 1, 3, filled=True) == ["table has no column for filled"]


def _leg(name: str, problems: list[str]) -> dict:
    return {"leg": name, "processes": 2, "messages": 10, "seconds": 1.0, "msg_per_s": 10,
            "mb_per_s": 0.0, "verified": not problems, "problems": problems,
            "peak_rss_mib": {"driver": 1.0, "jvm": 2.0, "workers": 3.0, "total": 6.0},
            "cpu_seconds": {"ours": 1.0, "box_busy": 2.0}}


_MACHINE = {"cpus": 2, "memory_gib": 24, "platform": "p", "python": "3.11",
            "versions": {k: "x" for k in ("nats-server", "nats-py", "pyspark", "delta-spark",
                                          "deltalake", "pyarrow")}}


def test_a_failed_leg_is_printed_as_failed():
    result = {
        "machine": _MACHINE,
        "workloads": [{
            "messages": 10, "size": 256, "target": "s3", "schema": "rich",
            "publish": {"msg_per_s": 1},
            "legs": {"client_limit": _leg("client_limit", []),
                     "simple_peer": _leg("simple_peer", []),
                     "js_etl": _leg("js_etl", ["consumer num_ack_pending 3"])},
            "ratios": {"js_etl_vs_client_limit": 1.0, "js_etl_vs_simple_peer": 1.0},
            "targets": {"js_etl_vs_client_limit": 0.6, "js_etl_vs_simple_peer": 1.0}}],
        "failed_legs": ["10x256/s3/rich:js_etl"], "ok": False}
    result["workloads"][0]["legs"]["js_etl"]["cpu_seconds"]["store"] = 0.7
    text = format_results(result)
    assert "10 x 256 B, target s3, schema rich" in text  # each cell says where and what
    assert "FAILED: consumer num_ack_pending 3" in text
    assert "store (SeaweedFS) CPU seconds, apart from the legs': js-etl 0.7" in text
    assert text.rstrip().endswith("FAILED: 10x256/s3/rich:js_etl")


def test_repeats_print_the_per_cpu_ratios_over_all_runs_too():
    runs = [{"run": 1, "msg_per_s": 9}, {"run": 2, "msg_per_s": 10}]
    legs = {name: {**_leg(name, []), "runs": runs}
            for name in ("client_limit", "simple_peer", "js_etl")}
    result = {
        "machine": _MACHINE,
        "workloads": [{
            "messages": 10, "size": 256, "publish": {"msg_per_s": 1}, "legs": legs,
            "ratios": {"js_etl_vs_client_limit": 1.0, "js_etl_vs_simple_peer": 1.0},
            "cpu_ratios": {"js_etl_vs_client_limit": 0.5, "js_etl_vs_simple_peer": 0.9},
            "cpu_ratios_all_runs": {"js_etl_vs_client_limit": 0.55,
                                    "js_etl_vs_simple_peer": 1.02},
            "targets": {"js_etl_vs_client_limit": 0.6, "js_etl_vs_simple_peer": 1.0}}],
        "failed_legs": [], "ok": True}
    text = format_results(result)
    assert "js-etl / simple peer 0.9\n" in text
    assert "over all runs pooled: js-etl / client limit 0.55; js-etl / simple peer 1.02" in text


def test_workload_arguments_pair_messages_with_sizes(tmp_path):
    import argparse

    from tools.bench.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def settings(*argv: str):
        return settings_from_args(parser.parse_args([*argv, "--workdir", str(tmp_path)]))

    assert settings().workloads == [(1_000_000, 256), (200_000, 4096)]
    assert settings("--quick").workloads == [(20_000, 256), (5_000, 4096)]
    assert settings("--quick").warmup is False and settings().warmup is True
    assert settings("--messages", "1000", "--size", "512").workloads == [(1000, 512)]
    assert settings("--messages", "1000,2000").workloads == [(1000, 256), (2000, 4096)]
    assert settings("--messages", "1000,2000,3000", "--size", "64").workloads == [
        (1000, 64), (2000, 64), (3000, 64)]
    assert settings("--memory-check", "--quick").memory_n == 20_000
    assert (settings().targets, settings().schemas) == (("local",), ("flat",))
    both = settings("--target", "local,s3", "--schema", "rich,flat")
    assert (both.targets, both.schemas) == (("local", "s3"), ("rich", "flat"))
    with pytest.raises(SystemExit):
        settings("--target", "gcs")
    with pytest.raises(TerminalError):  # the memory check drains local flat tables only
        settings("--memory-check", "--target", "s3")
    with pytest.raises(TerminalError):
        settings("--messages", "1,2,3", "--size", "1,2")
    assert client_target(256) == 0.6 and client_target(4096) == 0.8


def test_bad_arguments_exit_2_with_one_line(capsys):
    assert bench_main(["--messages", "1,2,3", "--size", "1,2"]) == 2
    assert "--messages has 3 values" in capsys.readouterr().err


def test_repeats_report_the_fastest_verified_run_and_fail_if_any_run_failed():
    from tools.bench.report import Leg, summarize

    def leg(run: int, seconds: float, problems: list[str], cpu: float = 1.0) -> Leg:
        return Leg("js_etl", 2, 100, seconds, 25_600, problems,
                   {"cpu_seconds": {"ours": cpu}}, {"run": run})

    best = summarize([leg(1, 2.0, [], cpu=3.0), leg(2, 1.0, [])])
    assert best["verified"] is True and best["msg_per_s"] == 100 and best["run"] == 2
    assert [r["msg_per_s"] for r in best["runs"]] == [50, 100]
    # Per CPU-second: the fastest run's own, and over every verified run pooled.
    assert best["msg_per_cpu_s"] == 100 and best["msg_per_cpu_s_all_runs"] == 50
    # A run without a CPU figure adds neither messages nor seconds (a break-it review).
    assert summarize([leg(1, 2.0, [], cpu=3.0), leg(2, 1.0, [], cpu=0.0)]
                     )["msg_per_cpu_s_all_runs"] == 33
    failed = summarize([leg(1, 2.0, []), leg(2, 1.0, ["consumer num_pending 3"])])
    assert failed["verified"] is False and failed["msg_per_s"] == 50
    assert failed["problems"] == ["run 2: consumer num_pending 3"]


def test_the_fallback_reader_counts_a_deltalake_table_in_a_child_process(tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    from tools.bench.verify import table_counts_deltalake

    table = pa.table({"seq": pa.array([1, 2, 3, 3], pa.int64()),
                      "id": pa.array([0, 1, 2, 2], pa.int64())})
    write_deltalake(str(tmp_path / "t"), table, mode="append")  # writes never abort at exit
    counts = table_counts_deltalake(str(tmp_path / "t"))
    assert counts == {"rows": 4, "distinct_seq": 3, "min_seq": 1, "max_seq": 3,
                      "distinct_id": 3, "min_id": 0, "max_id": 2}
    assert table_problems(counts, 3, 1, 3) == ["table rows 4 != 3"]


def test_the_fallback_reader_counts_a_raw_table_by_its_sequences(tmp_path):
    """A raw drain's table has no id, its payload in ``data``: read, not refused (the reader
    used to ask for an ``id`` column and print nothing)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from tools.bench.verify import table_counts_deltalake

    write_deltalake(str(tmp_path / "raw"), pa.table({
        "seq": pa.array([5, 6, 7], pa.int64()), "data": pa.array([b"{}", b"{}", None])}))
    counts = table_counts_deltalake(str(tmp_path / "raw"))
    assert counts == {"rows": 3, "distinct_seq": 3, "min_seq": 5, "max_seq": 7, "payload_rows": 2}
    assert table_problems(counts, 3, 5, 7, ids=False) == ["table payload_rows 2 != 3"]


def test_the_performance_page_is_the_rendering_of_the_last_results_file():
    """docs/performance.md and its charts are generated (tools/bench/page.py) from
    docs/performance.json, the results of `make bench`: no figure on them is typed by hand, and
    they cannot drift from them."""
    from tools.bench.page import CHARTS, PAGE, charts, render, results

    result, partitions, memory, stream = results()
    page = render(result, partitions, memory, stream)
    assert PAGE.read_text() == page
    svgs = charts(result, partitions, memory)
    assert sorted(path.name for path in CHARTS.iterdir()) == sorted(svgs)  # none stale either
    for name, svg in svgs.items():
        assert (CHARTS / name).read_text() == svg, name
        assert f"]({CHARTS.name}/{name})" in page  # embedded, relative to the page
    assert result["ok"] and len(result["workloads"]) == 8  # local and S3, flat and rich, 2 sizes
    # The same make bench's sweep (1, 2 and 4 partitions, 2 sizes) and memory check (N, 4N):
    assert partitions is not None and partitions["ok"] and len(partitions["workloads"]) == 6
    assert memory is not None and len(memory["memory_check"]["runs"]) == 2
    # and its stream job against the drain (local and S3, 2 sizes):
    assert stream is not None and stream["ok"] and len(stream["workloads"]) == 4
    assert {"## By partitions", "## Memory against backlog",
            "## Structured Streaming against the drain"} <= set(page.splitlines())


def _matrix(workloads: list[dict[str, Any]]) -> dict[str, Any]:
    """A results file of the matrix, its machine and settings made up, for the page's tests."""
    return {"machine": {"cpus": 2, "memory_gib": 1, "platform": "p", "python": "3",
                        "versions": {}},
            "settings": {"partitions": 2, "spark_master": "local[2]", "peer_batch": 5000,
                         "repeat": 1, "decode_schemas": {"flat": "id BIGINT"}},
            "workloads": workloads}


def test_the_performance_page_marks_a_missed_target():
    from tools.bench.page import render

    leg = {"verified": True, "msg_per_s": 100, "msg_per_cpu_s": 50}
    result = _matrix([{"target": "local", "schema": "flat", "messages": 10, "size": 256,
                       "legs": {"simple_peer": leg, "js_etl": {**leg, "writer": "columnar"}},
                       "ratios": {"js_etl_vs_simple_peer": 1.1},
                       "targets": {"js_etl_vs_simple_peer": 1.2},
                       "cpu_ratios": {"js_etl_vs_simple_peer": 1.0},
                       "cpu_targets": {"js_etl_vs_simple_peer": 1.0}}])
    (row,) = [line for line in render(result).splitlines() if line.startswith("| local")]
    assert "| 1.10 (≥ 1.2: **not met**) |" in row and "| 1.00 (≥ 1: met) |" in row, row


def test_the_stream_job_gets_a_table_against_the_drain():
    from tools.bench.page import render

    leg = {"verified": True, "msg_per_s": 1000, "msg_per_cpu_s": 500}
    result = _matrix([])
    stream = {"settings": {"spark_master": "local[2]", "repeat": 2},
              "workloads": [
                  {"target": target, "schema": "flat", "messages": 10, "size": 4096,
                   "legs": {"js_etl": leg, "js_etl_stream": {"verified": ok, "msg_per_s": 800,
                                                             "msg_per_cpu_s": 400}},
                   "stream_ratios": {"js_etl_stream_vs_js_etl": 0.8 if ok else None,
                                     "per_cpu_second": 0.8 if ok else None}}
                  for target, ok in (("local", True), ("s3", False))],
              "failed_legs": ["10x4096/s3/flat:js_etl_stream"]}
    page = render(result, None, None, stream).splitlines()
    assert "## Structured Streaming against the drain" in page
    assert [line for line in page if line.startswith(("| local", "| s3"))] == [
        "| local | flat | 10 × 4 KiB | 1,000 | 800 | 0.8 | 500 | 400 | 0.8 |",
        "| s3 | flat | 10 × 4 KiB | 1,000 | FAILED | – | 500 | FAILED | – |"]
    assert page[-1] == "Legs that failed verification: 10x4096/s3/flat:js_etl_stream."


def test_the_sweep_and_the_memory_check_get_a_section_and_a_chart_each():
    """With the partitions sweep's and the memory check's results, the page has a section for
    each, its chart embedded; the sweep's chart has a group per payload size and partition
    count, the memory chart one per backlog with a bar per kind of process."""
    import xml.etree.ElementTree as ET

    from tools.bench.page import charts, render

    leg = {"verified": True, "msg_per_s": 100, "msg_per_cpu_s": 50}
    result = _matrix([])
    sweep = {"settings": {"partitions_swept": [1, 4], "spark_master": "local[4]", "repeat": 2},
             "workloads": [{"size": size, "partitions": p,
                            "legs": {"client_limit": {**leg, "msg_per_s": 10 * p},
                                     "js_etl": {**leg, "msg_per_s": 5 * p}}}
                           for size in (4096, 256) for p in (4, 1)],
             "failed_legs": []}
    memory = {"memory_check": {
        "size": 256, "round_max_messages": 10, "target": 1.1, "within_target": True,
        "peak_rss_ratio": {"total": 1.02},
        "runs": [{"messages": n, "verified": True,
                  "peak_rss_mib": {"driver": 100.4, "jvm": 200, "workers": 300, "total": 600}}
                 for n in (10, 40)]}}
    page = render(result, sweep, memory)
    assert "## By partitions" in page and "(performance/msg_per_s_by_partitions.svg)" in page
    assert "(performance/msg_per_cpu_s_by_partitions.svg)" in page
    assert "## Memory against backlog" in page and "(performance/peak_rss_by_backlog.svg)" in page
    assert "1.02× the smaller's (target ≤ 1.1: met)" in page
    svgs = charts(result, sweep, memory)
    ns = {"svg": "http://www.w3.org/2000/svg"}
    texts = [t.text for t in ET.fromstring(svgs["msg_per_s_by_partitions.svg"])
             .iterfind(".//svg:text", ns)]
    assert [t for t in texts if t and ", " in t] == [
        "256 B, 1 partition", "256 B, 4 partitions", "4 KiB, 1 partition", "4 KiB, 4 partitions"]
    assert texts[1:3] == ["client limit", "js-etl"]
    memory_texts = [t.text for t in ET.fromstring(svgs["peak_rss_by_backlog.svg"])
                    .iterfind(".//svg:text", ns)]
    first = memory_texts.index("10 messages")  # its group label, then its bars' labels
    assert memory_texts[first:first + 6] == ["10 messages", "100", "200", "300", "600",
                                             "40 messages"]


def test_the_performance_charts_have_a_labelled_bar_per_leg_and_skip_a_missing_one():
    """Each chart is one group per workload, by payload size, the peer's bar above js-etl's,
    each bar as long as its value on the axis and labelled with it; a leg a workload lacks has
    no bar, one that failed verification is marked as in the table."""
    import re
    import xml.etree.ElementTree as ET

    from tools.bench.page import _ticks, charts

    def leg(msg_per_s: int, msg_per_cpu_s: int, verified: bool = True) -> dict:
        return {"verified": verified, "msg_per_s": msg_per_s, "msg_per_cpu_s": msg_per_cpu_s}

    result = {"workloads": [
        {"target": "local", "schema": "flat", "size": 4096,
         "legs": {"simple_peer": leg(10_000, 5_000), "js_etl": leg(30_000, 6_000)}},
        {"target": "s3", "schema": "rich", "size": 256,
         "legs": {"js_etl": leg(40_000, 8_000)}},  # no peer leg
        {"target": "s3", "schema": "flat", "size": 256,
         "legs": {"simple_peer": leg(20_000, 7_000, verified=False),
                  "js_etl": leg(35_000, 9_000)}}]}
    svgs = charts(result)
    assert sorted(svgs) == ["msg_per_cpu_s.svg", "msg_per_s.svg"]
    assert charts(result) == svgs  # deterministic
    ns = {"svg": "http://www.w3.org/2000/svg"}
    root = ET.fromstring(svgs["msg_per_s.svg"])
    texts = [t.text for t in root.iterfind(".//svg:text", ns)]
    assert texts[0] == "Messages per second" and texts[1:3] == ["simple peer", "js-etl"]
    # By payload size, then the file's order; "FAILED" for the peer that failed verification.
    assert [t for t in texts if t and t[0].isalpha()][3:] == [
        "s3 rich 256 B", "s3 flat 256 B", "FAILED", "local flat 4 KiB"]
    assert [t for t in texts if re.fullmatch(r"[\d,]+", t or "")][:5] == [
        "40,000", "35,000", "10,000", "30,000", "0"]  # the bars' labels, then the axis'
    assert _ticks(40_000) == [0, 10_000, 20_000, 30_000, 40_000]
    # The bars (the legend's swatches are 12 px high): the missing and the failed leg have none;
    # each as long as its value at the axis' scale (480 px for 40,000).
    bars = [r for r in root.iterfind("svg:rect", ns) if r.get("height") == "14"]
    assert [(r.get("fill"), float(r.get("width"))) for r in bars] == [
        ("#3f51b5", 480), ("#3f51b5", 420), ("#9e9e9e", 120), ("#3f51b5", 360)]
    cpu = ET.fromstring(svgs["msg_per_cpu_s.svg"])
    assert "9,000" in [t.text for t in cpu.iterfind(".//svg:text", ns)]
    # A workload with no leg at all, or legs without the figure, draws an empty chart.
    empty = charts({"workloads": [{"target": "local", "schema": "flat", "size": 256,
                                   "legs": {"js_etl": {"verified": True}}}]})
    assert all('height="14"' not in svg for svg in empty.values())
