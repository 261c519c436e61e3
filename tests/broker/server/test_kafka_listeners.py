"""Extra Kafka listeners: each connection is told the advertised address of the listener it arrived on.

This is what makes one broker usable from the host (``localhost:9092``) and from a compose network
(``sluice:29092``) at once. In-process over raw sockets (Metadata, FindCoordinator), then as a real
``sluice serve`` configured through ``SLUICE_KAFKA__EXTRA_LISTENERS`` with kcat and confluent-kafka
producing and consuming through both listeners.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka import ApiKey
from broker.server.kafka import KafkaListenerConfig, KafkaServer, KafkaServerConfig
from tests.broker.server.raw_client import RawClient

METADATA_ALL = {"topics": None, "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False}


@pytest.fixture
async def two_listeners() -> AsyncIterator[KafkaServer]:
    store = MemoryLogStore(default_partitions=1)
    coordinator = GroupCoordinator(MemoryOffsetStore())
    await coordinator.start()
    config = KafkaServerConfig(
        port=0, advertised_host="localhost", advertised_port=9092,
        extra_listeners=(KafkaListenerConfig("internal", 0, advertised_host="sluice"),),
    )
    srv = KafkaServer(store, coordinator, config)
    await srv.start()
    yield srv
    await srv.stop()
    await coordinator.stop()


async def _addresses(port: int) -> tuple[list[tuple[str, int]], tuple[str, int]]:
    client = await RawClient.connect(port)
    meta = await client.request(ApiKey.METADATA, 8, METADATA_ALL)
    coord = await client.request(ApiKey.FIND_COORDINATOR, 2, {"key": "g", "key_type": 0})
    await client.close()
    return [(b.host, b.port) for b in meta.brokers], (coord.host, coord.port)


async def test_each_listener_advertises_its_own_address(two_listeners: KafkaServer) -> None:
    internal_port = two_listeners.listener_ports["internal"]
    assert internal_port not in (0, two_listeners.port)
    assert await _addresses(two_listeners.port) == ([("localhost", 9092)], ("localhost", 9092))
    assert await _addresses(internal_port) == ([("sluice", internal_port)], ("sluice", internal_port))


async def test_stop_closes_every_listener(two_listeners: KafkaServer) -> None:
    ports = [two_listeners.port, two_listeners.listener_ports["internal"]]
    await two_listeners.stop()
    for port in ports:
        with pytest.raises(OSError):
            await RawClient.connect(port)


def test_listener_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        KafkaServerConfig(extra_listeners=(KafkaListenerConfig("a", 0), KafkaListenerConfig("a", 0)))
    with pytest.raises(ValueError, match="unique"):
        KafkaServerConfig(extra_listeners=(KafkaListenerConfig("default", 0),))


# -- a real `sluice serve` with two listeners, real clients ------------------------------------


@pytest.fixture
def serve_two_listeners(tmp_path: Path) -> Iterator[dict[str, int]]:
    """Main listener advertised as ``localhost``, the ``internal`` one as ``127.0.0.1`` (both bound on port 0)."""
    data = tmp_path / "data"
    env = {
        **os.environ,
        "SLUICE_KAFKA__PORT": "0",
        "SLUICE_KAFKA__ADVERTISED_HOST": "localhost",
        "SLUICE_KAFKA__EXTRA_LISTENERS": json.dumps([{"name": "internal", "port": 0, "advertised_host": "127.0.0.1"}]),
        "SLUICE_MQTT__ENABLED": "false",
        "SLUICE_TCP__ENABLED": "false",
        "SLUICE_HTTP__ENABLED": "false",
        "SLUICE_STORAGE__FLUSH": "os",
    }
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data)],
                            env=env, stdout=subprocess.DEVNULL, stderr=log)
    endpoints = data / "endpoints.json"
    deadline = time.monotonic() + 120  # a deadline for a loaded machine (tests/sluice_server.py), not a wait
    try:
        while True:
            found = json.loads(endpoints.read_text()) if endpoints.exists() else {}
            if "kafka" in found and "kafka:internal" in found:
                break
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "sluice did not start"
            time.sleep(0.05)
        yield {"main": int(found["kafka"]["port"]), "internal": int(found["kafka:internal"]["port"])}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _kcat_brokers(port: int) -> list[str]:
    out = subprocess.run(["kcat", "-b", f"127.0.0.1:{port}", "-L", "-J"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [b["name"] for b in json.loads(out.stdout)["brokers"]]


def _confluent_roundtrip(bootstrap: str, topic: str, values: list[bytes], read_from: str) -> list[bytes | None]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for v in values:
        producer.produce(topic, v)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": read_from, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes | None] = []  # as consumed (a record without a value would show as None)
    deadline = time.monotonic() + 30
    while len(got) < len(values) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    return got


def test_real_clients_through_both_listeners(serve_two_listeners: dict[str, int]) -> None:
    assert shutil.which("kcat"), "kcat is installed by scripts/install-system-deps.sh"
    main, internal = serve_two_listeners["main"], serve_two_listeners["internal"]
    assert _kcat_brokers(main) == [f"localhost:{main}"]
    assert _kcat_brokers(internal) == [f"127.0.0.1:{internal}"]

    lines = "".join(f"k{i % 7}\tvia-main-{i}\n" for i in range(500))
    produce = subprocess.run(["kcat", "-b", f"127.0.0.1:{main}", "-P", "-t", "both", "-K", "\t"],
                             input=lines, text=True, capture_output=True, timeout=60)
    assert produce.returncode == 0, produce.stderr
    consume = subprocess.run(["kcat", "-b", f"127.0.0.1:{internal}", "-C", "-t", "both", "-o", "beginning",
                              "-e", "-q", "-f", "%s\n"], capture_output=True, text=True, timeout=60)
    assert consume.returncode == 0, consume.stderr
    assert consume.stdout.splitlines() == [f"via-main-{i}" for i in range(500)]

    values = [f"via-internal-{i}".encode() for i in range(200)]
    assert _confluent_roundtrip(f"127.0.0.1:{internal}", "ck", values, f"localhost:{main}") == values
    back = [f"again-{i}".encode() for i in range(50)]
    assert _confluent_roundtrip(f"localhost:{main}", "ck2", back, f"127.0.0.1:{internal}") == back


def test_settings_reject_duplicate_listener_names() -> None:
    from pydantic import ValidationError

    from sluice.config import KafkaSettings

    with pytest.raises(ValidationError, match="unique"):
        KafkaSettings.model_validate({"extra_listeners": [{"name": "x", "port": 1}, {"name": "x", "port": 2}]})
    ok = KafkaSettings.model_validate({"extra_listeners": [{"name": "in", "port": 29092, "advertised_host": "s"}]})
    assert (ok.extra_listeners[0].port, ok.extra_listeners[0].advertised_host) == (29092, "s")
