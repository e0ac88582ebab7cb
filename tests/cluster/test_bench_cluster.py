"""``python -m tools.bench --cluster``: a tiny real run (N=1: local[1] and a one-executor standalone
cluster, each a real spark-submit of the drain job; no timing assertions), and the one-line
exit-2 refusals when the cluster mode cannot run (no source checkout, no venv-pack).

Here (marker ``cluster``, ``make test-cluster``) because the real run starts its own Spark
standalone cluster. It reuses the packed environment of test_spark_cluster.py's fixture when
the sources did not change (the same key in ``.cache/executor-env``). Measured on the shared
2-core box beside a soak: 172 s at load about 11, 449 s beside a full ``js-etl bench --cluster
1,2,4`` as well (load 14-17); the same command with 500 messages ran in 238 s at load 10-12 (40 s
packing the environment, then 75 s and 86 s for the two spark-submits): the JVMs are the cost,
not the 300 messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tools.shipping as shipping
from tools.bench.cli import main as bench_main
from tools.bench.cluster import cluster_ratios, format_cluster

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# Not in `make test`: with it the suite went over its 15 minutes (125-182 s, two spark-submits and
# a second Spark cluster beside test_spark_cluster.py's); `make test-cluster` runs it.
@pytest.mark.bench_cluster
def test_cluster_mode_runs_local_and_cluster_legs_verified_and_prints_ratios(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "TZ": "UTC"}
    proc = subprocess.run([str(BIN / "python"), "-m", "tools.bench", "--cluster", "1",
                           "--messages", "300", "--size", "256", "--json", str(out),
                           "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    result = json.loads(last_line(proc.stdout))
    assert json.loads(out.read_text()) == result
    assert result["ok"] is True and result["failed_legs"] == []
    assert [leg["leg"] for leg in result["legs"]] == ["local[1]", "cluster-1"]
    for leg in result["legs"]:
        assert leg["verified"] is True, (leg["leg"], leg["problems"])
        assert leg["exit_code"] == 0 and leg["messages"] == 300
        counts = leg["table_counts"]
        assert counts["rows"] == counts["distinct_seq"] == counts["distinct_id"] == 300
        assert leg["consumer"]["num_pending"] == leg["consumer"]["num_ack_pending"] == 0
        assert {"fetch", "write", "ack"} <= set(leg["phase_seconds"])
        assert leg["load_average_start"] >= 0 and leg["load_average_end"] >= 0
    assert result["legs"][0]["master"] == "local[1]"
    assert result["legs"][1]["master"].startswith("spark://127.0.0.1:")
    # The cluster leg really ran as an application of the standalone master, on one core.
    assert [(a["cores"], a["state"]) for a in result["cluster_apps"]] == [(1, "FINISHED")]
    ratios = result["ratios"]
    assert ratios["cluster_vs_local"]["1"] is not None and ratios["cluster_vs_local"]["1"] > 0
    assert ratios["local_vs_local1"]["1"] == ratios["cluster_vs_cluster1"]["1"] == 1.0
    assert "cluster-N / local[N]: N=1 " in proc.stdout
    assert "result: every leg verified" in proc.stdout


def _leg(mode: str, n: int, rate: int, verified: bool = True) -> dict[str, object]:
    return {"leg": f"{mode}{n}", "mode": mode, "executors": n, "msg_per_s": rate,
            "wall_msg_per_s": rate // 2, "verified": verified}


def test_ratios_compare_cluster_with_local_and_each_with_its_n1_leg_verified_only():
    legs = [_leg("local", 1, 100), _leg("cluster", 1, 50), _leg("local", 2, 150),
            _leg("cluster", 2, 100), _leg("local", 4, 160), _leg("cluster", 4, 90, False)]
    r = cluster_ratios(legs)
    assert r["cluster_vs_local"] == {"1": 0.5, "2": 0.667, "4": None}
    assert r["local_vs_local1"] == {"1": 1.0, "2": 1.5, "4": 1.6}
    assert r["cluster_vs_cluster1"] == {"1": 1.0, "2": 2.0, "4": None}
    assert r["cluster_vs_local_wall"]["2"] == 0.667


def test_a_failed_leg_is_printed_with_its_problems():
    leg = {**_leg("cluster", 1, 0, False), "leg": "cluster-1", "messages": 0, "seconds": 0.0,
           "wall_seconds": 30.0, "rounds": None, "load_average_start": 1.0,
           "load_average_end": 2.0, "problems": ["spark-submit exited 1: boom"]}
    result = {"machine": {"cpus": 2, "memory_gib": 8, "platform": "p", "python": "3.11",
                          "versions": {"nats-server": "2", "pyspark": "4", "delta-spark": "4",
                                       "pyarrow": "1"}},
              "settings": {"messages": 10, "size": 256, "executor_memory": "1g"},
              "legs": [leg], "ratios": cluster_ratios([leg]), "failed_legs": ["cluster-1"],
              "ok": False}
    text = format_cluster(result)
    assert "FAILED: spark-submit exited 1: boom" in text
    assert "cluster-N / local[N]: N=1 n/a" in text
    assert text.rstrip().endswith("FAILED: cluster-1")


def test_cluster_mode_without_a_source_checkout_exits_2_with_one_line(monkeypatch, capsys,
                                                                      tmp_path):
    monkeypatch.setattr(shipping, "REPO", None)  # as when js-etl runs from an installed wheel
    assert bench_main(["--cluster", "1", "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("js-etl: ShippingError:") and "source checkout" in err


def test_cluster_mode_without_venv_pack_exits_2_with_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(shipping, "PYTHON", str(tmp_path / "bin" / "python"))  # no venv-pack
    assert bench_main(["--cluster", "1", "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("js-etl: ShippingError:") and "venv-pack" in err
    assert "pip install -e '.[dev]'" in err


def test_cluster_mode_runs_one_workload(capsys, tmp_path):
    import argparse

    from tools.bench.cli import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def settings(*argv: str):
        return settings_from_args(parser.parse_args([*argv, "--workdir", str(tmp_path)]))

    assert settings("--cluster", "1,2,4").workloads == [(20_000, 1024)]  # README's default
    assert settings("--cluster", "1", "--messages", "300", "--size", "256").workloads == [
        (300, 256)]
    assert bench_main(["--cluster", "1", "--messages", "1,2", "--workdir", str(tmp_path)]) == 2
    assert "one workload" in capsys.readouterr().err
    assert bench_main(["--cluster", "0", "--workdir", str(tmp_path)]) == 2
    assert ">= 1" in capsys.readouterr().err
