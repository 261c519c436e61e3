"""`sluice serve --processor module:pipeline`: the sensor example attached inside the broker,
fed and read over the Kafka protocol by aiokafka."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.processors.test_standalone import PARTITIONS, heartbeat_all, produce, topics, wait_for_windows
from tests.processors.workloads import batch_window_means, sensor_readings

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
        deadline = time.monotonic() + 30
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
