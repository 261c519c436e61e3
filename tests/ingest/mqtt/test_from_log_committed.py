"""Records that Kafka producers write in transactions reach MQTT subscribers (``deliver_from_topics``)
once committed and never when aborted (ingest/mqtt/from_log.py rule 3). A real ``sluice serve``, a
transactional librdkafka producer (confluent-kafka) and mosquitto_sub."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.broker.server.conftest import SluiceProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def sluice(tmp_path: Path) -> Iterator[SluiceProcess]:
    server = SluiceProcess(tmp_path / "data", env={
        "SLUICE_MQTT__ENABLED": "true", "SLUICE_MQTT__PORT": "0",
        "SLUICE_MQTT__DELIVER_FROM_TOPICS": json.dumps(["commands"])})
    server.start()
    yield server
    server.stop()


def _send(producer: Producer, value: bytes, topic: str = "cmd/1") -> None:
    producer.produce("commands", value, headers=[("mqtt_topic", topic.encode())])


PROBE = b"cmd/probe probe\n"  # what mosquitto_sub prints for a probe record


async def _next_command(stdout: asyncio.StreamReader) -> bytes:
    """The next line mosquitto_sub prints that is not a probe: a probe stored before the subscription counted
    may still come, at any time the server's follower gets to it."""
    while (line := await stdout.readline()) == PROBE:
        pass
    return line


async def test_mqtt_subscribers_get_committed_transactional_records_only(sluice: SluiceProcess) -> None:
    mqtt_port = json.loads((sluice.data_dir / "endpoints.json").read_text())["mqtt"]["port"]
    plain = Producer({"bootstrap.servers": sluice.bootstrap})
    plain.produce("commands", b"no mqtt_topic: skipped")  # creates the topic the follower picks up
    assert plain.flush(10) == 0
    sub = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-p", str(mqtt_port), "-V", "5", "-q", "1", "-t", "cmd/#", "-F", "%t %p",
        stdout=asyncio.subprocess.PIPE)
    assert sub.stdout is not None
    try:
        # subscribed once a record from the log reaches it (the follower found the topic too)
        line = b""
        for _ in range(100):
            _send(plain, b"probe", "cmd/probe")
            assert plain.flush(10) == 0
            try:
                line = await asyncio.wait_for(sub.stdout.readline(), 0.5)
                break
            except TimeoutError:
                continue
        assert line == PROBE

        txn = Producer({"bootstrap.servers": sluice.bootstrap, "transactional.id": "mqtt-commands"})
        txn.init_transactions(10)
        txn.begin_transaction()
        _send(txn, b"aborted")
        assert txn.flush(10) == 0
        txn.abort_transaction(10)
        txn.begin_transaction()
        _send(txn, b"committed-1")
        assert txn.flush(10) == 0
        _send(plain, b"plain-while-open")  # behind the open transaction: held until it ends
        assert plain.flush(10) == 0
        with pytest.raises(TimeoutError):  # nothing passes the open transaction
            await asyncio.wait_for(_next_command(sub.stdout), 1.5)
        txn.commit_transaction(10)
        txn.begin_transaction()
        _send(txn, b"committed-2")
        txn.commit_transaction(10)
        got = [await asyncio.wait_for(_next_command(sub.stdout), 15) for _ in range(3)]
        assert got == [b"cmd/1 committed-1\n", b"cmd/1 plain-while-open\n", b"cmd/1 committed-2\n"]
    finally:
        sub.kill()
        await sub.wait()
    assert "Traceback" not in sluice.log_text()
