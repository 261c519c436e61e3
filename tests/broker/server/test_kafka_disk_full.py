"""A real full filesystem under a real ``sluice serve``, driven by confluent-kafka (librdkafka).

The data directory sits on a 1 MiB tmpfs that the test mounts (root only; skipped otherwise). A
producer (acks=all, flush=always) writes several times what fits: the broker keeps answering —
KAFKA_STORAGE_ERROR once the disk is full — and stays up, and after the operator frees space (a
remount with a larger size) and restarts Sluice, every record that was acknowledged is read back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.server.conftest import SluiceProcess

TOPIC = "full"
RECORDS = 3000
VALUE_BYTES = 1024


def _mount(target: Path, size: str, *options: str) -> subprocess.CompletedProcess[str]:
    opts = ",".join((*options, f"size={size}"))
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(target)],
                          capture_output=True, text=True, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8): the disk-full run cannot be staged")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = _mount(disk, "1m")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): the disk-full run cannot be staged")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _produce_until_full(bootstrap: str) -> tuple[list[bytes], list[str]]:
    from confluent_kafka import KafkaError, Message, Producer

    acked: list[bytes] = []
    failed: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            value = msg.value()
            assert value is not None
            acked.append(value)
        else:
            failed.append(err.name())

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "message.timeout.ms": 4000, "retry.backoff.ms": 200})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"%08d:" % i + b"x" * (VALUE_BYTES - 9), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    return acked, failed


def _consume_all(bootstrap: str) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "disk-full-check", "enable.auto.commit": False})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        values: list[bytes] = []
        while len(values) < high:
            msg = consumer.poll(10)
            assert msg is not None, f"read {len(values)} of {high} records"
            assert msg.error() is None, msg.error()
            value = msg.value()
            assert value is not None
            values.append(value)
        return values
    finally:
        consumer.close()


def test_disk_full_answers_storage_error_and_loses_nothing_acknowledged(
    small_disk: Path, tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    server = sluice_factory(small_disk / "data", env={"SLUICE_STORAGE__FLUSH": "always"})
    server.stderr_path = tmp_path / "sluice.stderr.log"  # not on the full disk
    server.start()
    acked, failed = _produce_until_full(server.bootstrap)
    assert acked, "nothing fit on the disk"
    assert failed, "the disk never filled up"
    assert set(failed) <= {"KAFKA_STORAGE_ERROR", "_MSG_TIMED_OUT"}, set(failed)
    assert server.proc is not None and server.proc.poll() is None, "the broker died"
    # the broker still answers on a full disk: reads work
    assert set(acked) <= set(_consume_all(server.bootstrap))
    server.stop()

    remount = _mount(small_disk, "16m", "remount")
    assert remount.returncode == 0, remount.stderr
    server.start()
    stored = _consume_all(server.bootstrap)
    missing = set(acked) - set(stored)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
    server.stop()
    log = server.log_text()
    assert "Traceback" not in log, log[-3000:]
    failure_lines = [line for line in log.splitlines() if f"{TOPIC}-0" in line and "No space left" in line]
    assert len(failure_lines) == 1, failure_lines[:5]
