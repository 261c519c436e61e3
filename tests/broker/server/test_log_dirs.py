"""DescribeLogDirs against a real ``sluice serve`` with the segment store, read by kafka-python's
``describe_log_dirs`` (what ``kafka-log-dirs`` and admin UIs showing topic sizes call)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient

from tests.sluice_server import SluiceProcess


@pytest.fixture(scope="module")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    server = SluiceProcess(Path(tmp_path_factory.mktemp("log-dirs")) / "data",
                           env={"SLUICE_STORAGE__BACKEND": "segment"}).start()
    yield server
    server.stop()


def test_log_dirs_report_each_partitions_size(sluice: SluiceProcess) -> None:
    bootstrap = f"127.0.0.1:{sluice.endpoints['kafka']['port']}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("sized", 2)])["sized"].result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for _ in range(10):
        producer.produce("sized", b"x" * 100, partition=0)
    assert producer.flush(10) == 0
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        [broker] = client.describe_log_dirs()
        [log_dir] = broker["log_dirs"]
        assert log_dir["error_code"] == 0 and log_dir["log_dir"] == str((sluice.data_dir / "logs").resolve())
        assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"], "the volume's sizes (v4)"
        sizes = {(t["name"], p["partition_index"]): (p["partition_size"], p["offset_lag"], p["is_future_key"])
                 for t in log_dir["topics"] for p in t["partitions"]}
        assert sizes[("sized", 1)] == (0, 0, False)
        size, lag, future = sizes[("sized", 0)]
        assert size > 10 * 100 and (lag, future) == (0, False)
        # Asked for some partitions: Kafka lists the directory's topics with only those partitions.
        [broker] = client.describe_log_dirs({"sized": [1], "never-created": [0]})
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
                for t in broker["log_dirs"][0]["topics"] if t["name"] == "sized"] == [("sized", [1])]
        assert "never-created" not in {t["name"] for t in broker["log_dirs"][0]["topics"]}
    finally:
        client.close()
