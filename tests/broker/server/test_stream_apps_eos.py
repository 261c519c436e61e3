"""The Quix Streams app of test_stream_apps with ``processing_guarantee="exactly-once"`` (Kafka
transactions: outputs, changelogs and input offsets commit together), killed with SIGKILL mid-stream
and restarted: a read_committed reader sees every window result exactly once, equal to the batch answer."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker.server.conftest import SluiceProcess
from tests.broker.server.test_stream_apps import (
    SECONDS,
    SENSORS,
    WINDOW_MS,
    batch_windows,
    produce_readings,
    sluice,
    start_app,
    stop_app,
)
from tests.processors.workloads import sensor_readings

__all__ = ["sluice"]  # the fixture, re-used

APP = "tests.broker.server.apps.quix_windows"


class CommittedReader:
    """Reads ``topic`` read_committed from the beginning, keeping every message (duplicates too)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-reader",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                  "isolation.level": "read_committed"})
        self.consumer.subscribe([topic])
        self.seen: list[tuple[str, Any]] = []

    def read_until(self, enough: int, timeout_s: float, log: Path) -> None:
        deadline = time.monotonic() + timeout_s
        while len({(k, v["start"]) for k, v in self.seen}) < enough:
            assert time.monotonic() < deadline, f"{len(self.seen)} results so far:\n{log.read_text()[-4000:]}"
            message = self.consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            self.seen.append((message.key().decode(), json.loads(message.value())))

    def drain(self, quiet_s: float) -> None:
        """Keep reading until nothing arrives for ``quiet_s`` (a duplicate would show up here)."""
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            message = self.consumer.poll(0.2)
            if message is not None and message.error() is None:
                self.seen.append((message.key().decode(), json.loads(message.value())))
                last = time.monotonic()

    def close(self) -> None:
        self.consumer.close()


@pytest.mark.slow
def test_quix_exactly_once_survives_kill_9(sluice: SluiceProcess, tmp_path: Path) -> None:
    rows = sensor_readings(SECONDS, sensors=SENSORS)
    expected = batch_windows(rows)
    admin = AdminClient({"bootstrap.servers": sluice.bootstrap})
    admin.create_topics([NewTopic("quix-readings", 1, 1)])["quix-readings"].result(10)
    half = len(rows) // 2
    produce_readings(sluice.bootstrap, "quix-readings", rows[:half])

    reader = CommittedReader(sluice.bootstrap, "quix-windows")
    state = str(tmp_path / "state")
    log = tmp_path / "quix-eos.log"
    app = start_app(APP, [sluice.bootstrap, state, "exactly-once"], log)
    try:
        reader.read_until(1, 90, log)  # some windows are out: the app is mid-stream
        app.send_signal(signal.SIGKILL)
        app.wait()
        later = [{"sensor": f"sensor_{n}", "temp": 0.0, "ts": rows[-1]["ts"] + 10 * WINDOW_MS}
                 for n in range(SENSORS)]
        produce_readings(sluice.bootstrap, "quix-readings", [*rows[half:], *later])
        app = start_app(APP, [sluice.bootstrap, state, "exactly-once"], log)
        reader.read_until(len(expected), 120, log)
        reader.drain(3.0)
    finally:
        stop_app(app)
        reader.close()

    counts = Counter((key, value["start"]) for key, value in reader.seen)
    assert [k for k, n in counts.items() if n > 1] == []  # no window result twice
    got = {(key, value["start"]): (value["value"]["count"], round(value["value"]["sum"], 6))
           for key, value in reader.seen}
    assert got == expected
    assert "Traceback" not in sluice.log_text()
