"""`sluice serve` as a real process: starts, reports its endpoints, stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # sluice serve subprocesses started and stopped


def test_serve_starts_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {
        **os.environ,
        "SLUICE_KAFKA__PORT": "0",
        "SLUICE_MQTT__PORT": "0",
        "SLUICE_TCP__PORT": "0",
        "SLUICE_HTTP__PORT": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120  # a deadline for a loaded machine (tests/sluice_server.py), not a wait
        while not (data / "endpoints.json").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.05)
        json.loads((data / "endpoints.json").read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_unwritable_data_dir_is_a_one_sentence_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(blocker / "sub")],
        capture_output=True,
        text=True,
        timeout=120,  # a deadline: the interpreter alone took 30 s to start under load
    )
    assert proc.returncode == 1
    assert "error: cannot create data directory" in proc.stderr


def test_bad_config_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "serve", "--flush", "sometimes", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "invalid configuration" in proc.stderr
