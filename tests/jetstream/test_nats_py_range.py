"""The low end of the nats-py range ``pyproject.toml`` states: js-etl's JetStream tests run again
with that nats-py in front of this venv's (the rest of the suite runs the newest of the range).

``js_etl.jetstream.client`` hooks parts of nats-py's client that are not its public API (the
parser, ``_process_msg``, the connect path), so every version of the range must be tried: these
are the tests that touch each hook."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
HOOKED = ("tests/unit/jetstream/test_frame_parser.py", "tests/jetstream/test_tls.py",
          "tests/jetstream/test_jetstream_pull.py", "tests/jetstream/test_jetstream_ack.py",
          "tests/jetstream/test_jetstream_connection.py")
# Of the ack tests, those of the server's ack semantics (waits of seconds) touch no hook.
SERVER_SIDE = "not (nak_with_delay or in_progress or term_is_never or late_confirmation)"


def nats_py_range() -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return next(r for r in map(Requirement, project["dependencies"]) if r.name == "nats-py")


def lowest(requirement: Requirement) -> str:
    (low,) = [s.version for s in requirement.specifier if s.operator == ">="]
    return low if low.count(".") == 2 else f"{low}.0"


def test_the_range_has_a_low_end_and_an_upper_bound_the_suite_is_inside():
    from importlib.metadata import version

    requirement = nats_py_range()
    assert {s.operator for s in requirement.specifier} == {">=", "<"}
    assert requirement.specifier.contains(version("nats-py"))
    assert lowest(requirement) != version("nats-py")  # else the other end is never tried


@pytest.mark.slow
def test_the_hooked_tests_pass_on_the_lowest_nats_py_of_the_range(tmp_path):
    low = lowest(nats_py_range())
    overlay = tmp_path / "nats-py"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--target", str(overlay), f"nats-py=={low}"],
        capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(overlay), *filter(None, [os.environ.get("PYTHONPATH")])])}
    imported = subprocess.run(
        [sys.executable, "-c", "import nats.aio.client as c; print(c.__version__, c.__file__)"],
        capture_output=True, text=True, timeout=60, check=True, env=env, cwd=REPO)
    version, path = imported.stdout.split()
    assert version == low and Path(path).is_relative_to(overlay)
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", SERVER_SIDE,
         *HOOKED],
        capture_output=True, text=True, timeout=900, check=False, env=env, cwd=REPO)
    assert ran.returncode == 0, ran.stdout[-5000:] + ran.stderr[-2000:]
    summary = ran.stdout.splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary
    assert "4 deselected" in summary, summary  # the -k expression names existing tests
