"""Compaction seen by kcat (librdkafka's CLI) against a real ``sluice serve``: after the cleaner ran,
``-o beginning`` shows exactly the latest value per key at its original offset, and tombstones are
gone once ``delete.retention.ms`` has passed."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from broker.protocol.records import iter_batches
from tests.broker.server.conftest import SluiceProcess

KEYS = 20
N = 1000
DELETED = {f"k{i}" for i in range(5)}


def kcat_produce(bootstrap: str, topic: str, lines: str, *extra: str) -> None:
    done = subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", topic, "-K", "\t", "-Z", *extra],
                          input=lines, text=True, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


def kcat_read(bootstrap: str, topic: str) -> list[tuple[int, str, str]]:
    done = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-Z",
                           "-f", "%o\t%k\t%s\n"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [(int(o), k, v) for o, k, v in (line.split("\t") for line in done.stdout.splitlines())]


def test_kcat_sees_latest_value_per_key_after_cleaning(
    tmp_path: Path, sluice_factory: type[SluiceProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shutil.which("kcat")
    monkeypatch.setenv("SLUICE_STORAGE__CLEANER_INTERVAL_S", "0.1")
    server = sluice_factory(tmp_path / "data")
    server.start()
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    configs = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01",
               "delete.retention.ms": "1500"}
    admin.create_topics([NewTopic("compacted", 1, 1, config=configs)])["compacted"].result(10)

    kcat_produce(server.bootstrap, "compacted", "".join(f"k{i % KEYS}\tv{i}\n" for i in range(N)))
    # -Z: an empty value is a NULL (tombstone); a batch of its own, so cleaning empties it completely.
    kcat_produce(server.bootstrap, "compacted", "".join(f"{key}\t\n" for key in sorted(DELETED)))
    # One record per batch afterwards, so the segments holding the data above roll and become cleanable.
    kcat_produce(server.bootstrap, "compacted", "".join(f"filler{j}\t{'x' * 500}\n" for j in range(30)),
                 "-X", "batch.num.messages=1", "-X", "linger.ms=0")
    # One partition, produced in order: offsets are the input positions.
    produced = [f"k{i % KEYS}\tv{i}" for i in range(N)] + [f"{key}\tNULL" for key in sorted(DELETED)]
    produced += [f"filler{j}\t{'x' * 500}" for j in range(30)]
    latest: dict[str, tuple[int, str]] = {}
    for offset, line in enumerate(produced):
        key, value = line.split("\t")
        latest[key] = (offset, value)
    expected = sorted((offset, key, value) for key, (offset, value) in latest.items() if key not in DELETED)
    assert len(expected) == KEYS - len(DELETED) + 30

    deadline = time.monotonic() + 30
    while (seen := kcat_read(server.bootstrap, "compacted")) != expected:
        assert time.monotonic() < deadline, (sorted(set(seen) - set(expected)), sorted(set(expected) - set(seen)))
        time.sleep(0.2)
    # a reader sees the swapped segments before the pass logs (a directory fsync and the state file first)
    while "cleaned partition" not in server.log_text():
        assert time.monotonic() < deadline, "no 'cleaned partition' in the broker's log"
        time.sleep(0.05)
    # The gaps are there as Kafka leaves them: batches that kept no record are empty and kcat stepped over.
    stored = b"".join(p.read_bytes() for p in sorted((server.data_dir / "logs" / "compacted-0").glob("*.log")))
    assert any(header.record_count == 0 for _, header in iter_batches(stored))


def test_keyless_records_to_a_compacted_topic_are_refused(
    tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    from confluent_kafka import KafkaError, Message, Producer

    server = sluice_factory(tmp_path / "data")
    server.start()
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic("keyed-only", 1, 1, config={"cleanup.policy": "compact"})])["keyed-only"].result(10)
    outcomes: list[tuple[bytes | None, int | None]] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        outcomes.append((msg.key(), None if err is None else err.code()))

    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0, "retries": 0})
    producer.produce("keyed-only", value=b"no key", on_delivery=report)
    producer.flush(10)
    producer.produce("keyed-only", key=b"k", value=b"with key", on_delivery=report)
    producer.flush(10)
    assert outcomes == [(None, KafkaError.INVALID_RECORD), (b"k", None)]
    assert "Compacted topic cannot accept message without key" in server.log_text()
