"""`sluice serve --processor module:pipeline`: the sensor example attached inside the broker,
fed and read over the Kafka protocol by aiokafka."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.processors.test_standalone import PARTITIONS, heartbeat_all, produce, topics, wait_for_windows
from tests.processors.workloads import T0, batch_window_means, sensor_readings
from tests.sluice_server import SluiceProcess

pytestmark = pytest.mark.slow


async def test_serve_runs_an_attached_processor(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {**os.environ, **topics("att"), "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__ENABLED": "false",
           "SLUICE_TCP__ENABLED": "false", "SLUICE_HTTP__PORT": "0",
           "SLUICE_STORAGE__DEFAULT_PARTITIONS": str(PARTITIONS), "SLUICE_STORAGE__FLUSH": "os"}
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data),
         "--processor", "processors.examples.sensors:pipeline"],
        env=env, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # a deadline for a loaded machine (tests/sluice_server.py), not a wait
        endpoints = data / "endpoints.json"
        while not (endpoints.exists() and "http" in endpoints.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        bootstrap = f"127.0.0.1:{json.loads(endpoints.read_text())['kafka']['port']}"
        readings = sensor_readings(40)
        await produce(bootstrap, "att-in", readings)
        await heartbeat_all(bootstrap, "att-in", readings[-1]["ts"] + 60_000)
        expected = batch_window_means(readings, 10_000)
        rows = await wait_for_windows(bootstrap, "att-avg", len(expected))
        assert {tuple(r["_key"]): r["value"] for r in rows} == {k: pytest.approx(v) for k, v in expected.items()}
        assert "processor started" in log.read_text()
        # the status the runner publishes, as the HTTP API serves it
        http = json.loads(endpoints.read_text())["http"]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http['port']}") as client:
            (status,) = (await client.get("/processors")).json()
        assert status["name"] == "att-group" and status["records_in"] == len(readings)
        assert status["offset_lag"] == 0 and status["late_records"] == 0
        assert {p["partition"] for p in status["partitions"]} == set(range(PARTITIONS))
        assert all(p["event_time_lag_ms"] is not None for p in status["partitions"])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    assert "processor stopped" in log.read_text()


async def read_records(bootstrap: str, topic: str) -> list[tuple[dict[str, Any], dict[str, bytes]]]:
    """Every record of ``topic`` (all partitions): JSON value and headers."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return []
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out += [(json.loads(m.value), dict(m.headers)) for m in messages]
        return out
    finally:
        await consumer.stop()


async def test_a_record_late_before_serve_restarts_is_late_after_it(tmp_path: Path) -> None:
    """Issue 12, item 7, end to end. Two of the four partitions get no data; the others go quiet and
    the all-idle policy closes every window (allowed lateness included). `sluice serve` restarts on
    the same data directory and a record for the first window arrives at once: it goes to the late
    topic with its reason. Before the fix the partitions without data came back as active with no
    time, the watermark restarted from nothing, and the record re-opened the window (a second
    `first` with a different value)."""
    env = {**topics("rst"), "SLUICE_STORAGE__BACKEND": "segment", "SLUICE_STORAGE__FLUSH": "os",
           "SLUICE_STORAGE__DEFAULT_PARTITIONS": str(PARTITIONS)}
    server = SluiceProcess(tmp_path / "data", env=env, args=["--processor", "tests.processors.pipelines:quick_idle"])
    readings = [r for r in sensor_readings(40) if r["sensor"] in ("sensor_0", "sensor_1")]
    expected = batch_window_means(readings, 10_000)
    server.start()
    try:
        await produce(server.bootstrap, "rst-in", readings)
        before = await wait_for_windows(server.bootstrap, "rst-avg", len(expected))  # the all-idle policy closed all
        async with httpx.AsyncClient(base_url=server.http) as client:
            deadline = time.monotonic() + 30
            while (await client.get("/processors")).json()[0]["watermark"] < readings[-1]["ts"] + 5_000:
                assert time.monotonic() < deadline  # allowed lateness of the last window over too
                await asyncio.sleep(0.2)
    finally:
        server.stop()  # SIGTERM: the final checkpoint
    server.start()
    try:
        late = {"sensor": "sensor_0", "temp": 999.0, "ts": T0 + 5_000}  # window [T0, T0 + 10 s): closed long ago
        await produce(server.bootstrap, "rst-in", [late])
        deadline = time.monotonic() + 30
        while not (rows := await read_records(server.bootstrap, "rst-late")):
            assert time.monotonic() < deadline, (await read_records(server.bootstrap, "rst-avg"))[-3:]
            await asyncio.sleep(0.2)
        assert [value for value, _ in rows] == [late]
        assert b"later than allowed" in rows[0][1]["sluice-late-reason"]
        after = await read_records(server.bootstrap, "rst-avg")
        assert len(after) == len(before)  # nothing re-emitted: the window stayed closed
    finally:
        server.stop()
