"""Stream-processing frameworks people use, run unmodified against ``sluice serve``: a Quix Streams
app with a stateful tumbling-window aggregation (changelog topics) and a Faust app with a windowed
table produce the same window results as a plain-Python batch computation over the same input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tests.broker.server.conftest import SluiceProcess
from tests.processors.workloads import sensor_readings

WINDOW_MS = 10_000
SECONDS = 60
SENSORS = 5

Windows = dict[tuple[str, int], tuple[int, float]]


def batch_windows(rows: list[dict[str, Any]]) -> Windows:
    """The plain-Python answer: (sensor, window start) -> (count, sum) in input order."""
    out: dict[tuple[str, int], list[Any]] = defaultdict(lambda: [0, 0.0])
    for row in rows:
        acc = out[(row["sensor"], row["ts"] - row["ts"] % WINDOW_MS)]
        acc[0] += 1
        acc[1] += row["temp"]
    return {key: (count, round(total, 6)) for key, (count, total) in out.items()}


def produce_readings(bootstrap: str, topic: str, rows: list[dict[str, Any]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    for row in rows:
        producer.produce(topic, key=row["sensor"].encode(), value=json.dumps(row).encode(), timestamp=row["ts"])
        producer.poll(0)
    assert producer.flush(30) == 0


def read_topic(
    bootstrap: str, topic: str, done: Callable[[list[tuple[str, Any]]], bool], app: subprocess.Popen[bytes], log: Path
) -> list[tuple[str, Any]]:
    """(key, JSON value) of every message of ``topic`` from the beginning, until ``done`` says so."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen: list[tuple[str, Any]] = []
    deadline = time.monotonic() + 120
    try:
        while not done(seen):
            assert app.poll() is None, f"the app exited ({app.returncode}):\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"{len(seen)} messages:\n{log.read_text()[-4000:]}"
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            seen.append((message.key().decode(), json.loads(message.value())))
    finally:
        consumer.close()
    return seen


def start_app(module: str, args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": os.getcwd(), **env})


def stop_app(app: subprocess.Popen[bytes]) -> None:
    if app.poll() is None:
        app.send_signal(signal.SIGTERM)
        try:
            app.wait(30)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()


def cleanup_policy(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = next(iter(admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()))
    return str(described.result(10)["cleanup.policy"].value)


@pytest.fixture
def sluice(tmp_path: Path, sluice_factory: type[SluiceProcess], monkeypatch: pytest.MonkeyPatch) -> SluiceProcess:
    monkeypatch.setenv("SLUICE_STORAGE__CLEANER_INTERVAL_S", "0.5")
    server = sluice_factory(tmp_path / "data")
    server.start()
    return server


def test_quix_streams_tumbling_window_matches_batch(sluice: SluiceProcess, tmp_path: Path) -> None:
    rows = sensor_readings(SECONDS, sensors=SENSORS)
    expected = batch_windows(rows)
    admin = AdminClient({"bootstrap.servers": sluice.bootstrap})
    admin.create_topics([NewTopic("quix-readings", 1, 1)])["quix-readings"].result(10)
    # Quix closes a key's window once that key's event time passes its end: one later reading per
    # sensor closes the last real windows (its own window stays open and is never emitted).
    later = [{"sensor": f"sensor_{n}", "temp": 0.0, "ts": rows[-1]["ts"] + 10 * WINDOW_MS} for n in range(SENSORS)]
    produce_readings(sluice.bootstrap, "quix-readings", [*rows, *later])

    log = tmp_path / "quix.log"
    app = start_app("tests.broker.server.apps.quix_windows", [sluice.bootstrap, str(tmp_path / "state")], log)
    try:
        seen = read_topic(sluice.bootstrap, "quix-windows",
                          lambda seen: len({(k, v["start"]) for k, v in seen}) >= len(expected), app, log)
    finally:
        stop_app(app)
    got = {(key, value["start"]): (value["value"]["count"], round(value["value"]["sum"], 6)) for key, value in seen}
    assert got == expected
    changelogs = [t for t in admin.list_topics(timeout=10).topics if t.startswith("changelog__")]
    assert changelogs, "Quix created its changelog topics"
    assert all(cleanup_policy(sluice.bootstrap, t) == "compact" for t in changelogs)
    assert "INVALID_CONFIG" not in sluice.log_text()


def test_faust_windowed_table_matches_batch(sluice: SluiceProcess, tmp_path: Path) -> None:
    rows = sensor_readings(SECONDS, sensors=SENSORS)
    expected = batch_windows(rows)
    admin = AdminClient({"bootstrap.servers": sluice.bootstrap})
    admin.create_topics([NewTopic("faust-readings", 1, 1)])["faust-readings"].result(10)
    produce_readings(sluice.bootstrap, "faust-readings", rows)

    log = tmp_path / "faust.log"
    app = start_app("tests.broker.server.apps.faust_windows", ["worker", "--loglevel", "info"], log,
                    SLUICE_BOOTSTRAP=sluice.bootstrap)
    try:
        # Every reading updates its window; the last update of each window is its result.
        seen = read_topic(sluice.bootstrap, "faust-windows", lambda seen: len(seen) >= len(rows), app, log)
    finally:
        stop_app(app)
    got: Windows = {}
    for key, value in seen:
        got[(key, value["start"])] = (value["count"], round(value["sum"], 6))
    assert got == expected
    # Faust creates windowed-table changelogs compact,delete (with the window expiry as retention).
    assert cleanup_policy(sluice.bootstrap, "faust-windows-faust-totals-changelog") == "compact,delete"
    assert "INVALID_CONFIG" not in sluice.log_text()
