"""`sluice simulate` additions for the compose stack: --transport kafka (the cluster profile), --first-id,
--jump-every and --duration 0 (until SIGTERM), against a real Sluice read back with kcat."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import NotRequired, TypedDict

import pytest

from tests.sluice_server import SluiceProcess

pytestmark = pytest.mark.slow  # sluice serve and sluice simulate subprocesses


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    proc = SluiceProcess(Path(tmp_path_factory.mktemp("sim")) / "data",
                         env={"SLUICE_STORAGE__DEFAULT_PARTITIONS": "2"}).start()
    yield proc
    proc.stop()


class Reading(TypedDict):
    """One simulated reading as `sluice simulate` publishes it (``Sensor.reading`` in sluice/cli_simulate.py)."""

    device_id: str
    sensor: str
    temp: float
    ts: int
    jump: NotRequired[bool]


def _sluice(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, timeout=timeout)


def _read(bootstrap: str, topic: str) -> list[tuple[str, Reading]]:
    out = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k\t%s\n"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [(k, json.loads(v)) for k, v in (line.split("\t", 1) for line in out.stdout.splitlines())]


def _stored(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` so far (0 while it does not exist yet): the sum of its high watermarks."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "count", "allow.auto.create.topics": False})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in meta.partitions)
    finally:
        consumer.close()


def test_kafka_transport_with_jumps(server: SluiceProcess) -> None:
    result = _sluice("simulate", "--transport", "kafka", "--bootstrap", server.bootstrap, "--topic", "sim-k",
                     "--sensors", "4", "--first-id", "10", "--profile", "steady", "--jump-every", "5",
                     "--duration", "1.5", "--seed", "3", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["transport"] == "kafka" and report["address"] == server.bootstrap
    records = _read(server.bootstrap, "sim-k")
    by_sensor: dict[str, list[Reading]] = defaultdict(list)
    for key, value in records:
        assert key == value["sensor"]
        by_sensor[key].append(value)
    assert sorted(by_sensor) == ["sensor_10", "sensor_11", "sensor_12", "sensor_13"]
    for row in report["sensors"]:
        readings = by_sensor[row["sensor"]]
        assert len(readings) == row["sent"] == row["delivered"] >= 10
        jumps = [i for i, r in enumerate(readings) if r.get("jump")]
        assert jumps == list(range(4, len(readings), 5)) and len(jumps) == row["jumps"]
        for i in jumps:  # a jump is 1.5x the previous absolute temperature + 10: always above 1.1x
            prev, temp = float(readings[i - 1]["temp"]), float(readings[i]["temp"])
            assert temp == pytest.approx(abs(prev) * 1.5 + 10, abs=0.002)


def test_duration_zero_runs_until_sigterm(server: SluiceProcess) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "simulate", "--transport", "kafka",
                             "--bootstrap", server.bootstrap, "--topic", "sim-forever", "--sensors", "2",
                             "--profile", "steady", "--duration", "0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait for 20 stored readings (not a fixed time: a loaded machine starts the process slowly),
        # and the process must still be running then: no deadline.
        deadline = time.monotonic() + 60
        while _stored(server.bootstrap, "sim-forever") < 20:
            assert proc.poll() is None, "simulate --duration 0 ended by itself"
            assert time.monotonic() < deadline, "simulate stored fewer than 20 readings in 60 s"
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - stopped < 10
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    report = json.loads(out)
    delivered = sum(r["delivered"] for r in report["sensors"])
    assert delivered >= 20 and delivered == len(_read(server.bootstrap, "sim-forever"))


def test_kafka_transport_unreachable_exits_3() -> None:
    result = _sluice("simulate", "--transport", "kafka", "--bootstrap", "127.0.0.1:1", "--duration", "0.5")
    assert result.returncode == 3, result.stderr
    assert "--bootstrap" in result.stderr


def test_topics_create_if_not_exists(server: SluiceProcess) -> None:
    assert _sluice("topics", "create", "once", "-p", "2", "--bootstrap", server.bootstrap).returncode == 0
    again = _sluice("topics", "create", "once", "-p", "2", "--bootstrap", server.bootstrap)
    assert again.returncode != 0
    ok = _sluice("topics", "create", "once", "-p", "2", "--if-not-exists", "--bootstrap", server.bootstrap)
    assert ok.returncode == 0 and "already exists" in ok.stdout
