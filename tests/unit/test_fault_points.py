"""The test-only fault points' own rules (js_etl/faults.py): pure logic, no server, no JVM."""

from __future__ import annotations

import threading
import time

import pytest

from js_etl import faults
from js_etl.errors import ConfigError


def test_an_unknown_fault_point_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "kill_after_fech")
    with pytest.raises(ConfigError, match="is not a fault point"):
        faults.armed()


def test_hold_without_a_gate_folder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "hold_after_fetch")
    monkeypatch.delenv(faults.GATE_ENV, raising=False)
    with pytest.raises(ConfigError, match="JS_ETL_FAULT_GATE"):
        faults.hold_here("hold_after_fetch")


def test_hold_waits_for_release_then_stays_open(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path) -> None:
    monkeypatch.setenv(faults.ENV, "hold_after_fetch")
    monkeypatch.setenv(faults.GATE_ENV, str(tmp_path))
    held = threading.Thread(target=faults.hold_here, args=("hold_after_fetch",), daemon=True)
    held.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "held").exists():  # wait for state: the holder said it is held
        assert time.monotonic() < deadline, "hold_here never wrote its held file"
        time.sleep(0.01)
    assert held.is_alive()  # held until released
    (tmp_path / "release").touch()
    held.join(30)
    assert not held.is_alive()
    (tmp_path / "held").unlink()
    faults.hold_here("hold_after_fetch")  # released: a later round passes at once
    assert not (tmp_path / "held").exists()


def test_an_unarmed_hold_does_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    monkeypatch.setenv(faults.GATE_ENV, str(tmp_path))
    faults.hold_here("hold_after_fetch")
    assert list(tmp_path.iterdir()) == []
