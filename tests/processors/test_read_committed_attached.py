"""In-process readers of transactional input read like Kafka's read_committed consumers: an attached
exactly-once processor (``sluice serve`` with ``SLUICE_PROCESSOR_GUARANTEE=exactly-once``) and the HTTP
API with ``isolation=read_committed`` see the committed transactions only, never an aborted one's
records, and stop at the last stable offset while a transaction is open (librdkafka writes them)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sluice_server import SluiceProcess

pytestmark = pytest.mark.slow

INPUT, OUTPUT, GROUP = "rc-in", "rc-out", "rc-pass"


@pytest.fixture
def sluice(tmp_path: Path) -> Iterator[SluiceProcess]:
    server = SluiceProcess(tmp_path / "data", env={
        "SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false",
        "SLUICE_STORAGE__DEFAULT_PARTITIONS": "1",
        "PASS_INPUT": INPUT, "PASS_OUTPUT": OUTPUT, "PASS_GROUP": GROUP,
        "SLUICE_PROCESSORS": json.dumps(["tests.processors.pipelines:passthrough"]),
        "SLUICE_PROCESSOR_GUARANTEE": "exactly-once", "SLUICE_PROCESSOR_CHECKPOINT_INTERVAL_MS": "200"})
    server.start()
    yield server
    server.stop()


def _producer(bootstrap: str, txn_id: str) -> Any:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 1})
    producer.init_transactions(30)
    return producer


def _send(producer: Any, values: list[str]) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(INPUT, json.dumps(value).encode(), partition=0)
    producer.flush(30)


def _committed_output(bootstrap: str, until: str) -> list[str]:
    """The processor's results, read_committed from the start, up to and including ``until``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "rc-check", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(OUTPUT, 0, OFFSET_BEGINNING)])
    values: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while until not in values:
            assert time.monotonic() < deadline, f"no {until!r} in the results; read {values}"
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(json.loads(msg.value()))
    finally:
        consumer.close()
    return values


def _http_values(sluice: SluiceProcess, isolation: str, **params: Any) -> tuple[list[str], dict[str, Any]]:
    answer = httpx.get(f"{sluice.http}/topics/{INPUT}/records",
                       params={"partition": 0, "offset": 0, "max": 100, "isolation": isolation, "format": "json",
                               **params})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return [r["value"] for r in body["records"]], body


def test_attached_exactly_once_processor_and_http_read_committed_see_only_committed_records(
        sluice: SluiceProcess) -> None:
    first, second = _producer(sluice.bootstrap, "rc-first"), _producer(sluice.bootstrap, "rc-second")
    committed = [f"c{i}" for i in range(1, 6)]
    _send(first, committed)
    first.commit_transaction(30)
    _send(first, ["a1", "a2", "a3"])
    first.abort_transaction(30)
    _send(second, ["o1", "o2"])  # left open: the last stable offset stays at o1
    _send(first, ["c6", "c7", "c8"])
    first.commit_transaction(30)

    # the processor passes the committed records, and nothing at or after the open transaction
    assert _committed_output(sluice.bootstrap, "c5") == committed
    values, body = _http_values(sluice, "read_committed")
    assert values == committed
    o1 = body["last_stable_offset"]
    assert body["next_offset"] == o1 < body["high_watermark"]
    everything, _ = _http_values(sluice, "read_uncommitted")
    assert everything == [*committed, "a1", "a2", "a3", "o1", "o2", "c6", "c7", "c8"]
    held, body = _http_values(sluice, "read_committed", offset=o1, timeout_ms=200)  # long-polls, then answers
    assert held == [] and body["next_offset"] == o1
    assert _committed_output(sluice.bootstrap, "c5") == committed  # still: held at the open transaction

    second.abort_transaction(30)
    after = [*committed, "c6", "c7", "c8"]
    assert _committed_output(sluice.bootstrap, "c8") == after
    values, body = _http_values(sluice, "read_committed")
    assert values == after
    assert body["next_offset"] == body["high_watermark"] == body["last_stable_offset"]

    with httpx.stream("GET", f"{sluice.http}/topics/{INPUT}/stream",
                      params={"partition": 0, "offset": 0, "limit": 8, "isolation": "read_committed", "format": "json"},
                      timeout=30) as stream:
        events = [json.loads(line[len("data: "):]) for line in stream.iter_lines()
                  if line.startswith("data: ") and '"offset"' in line]
    assert [e["value"] for e in events] == after
    assert "Traceback" not in sluice.log.read_text()
