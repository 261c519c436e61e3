"""bench.mqtt_loadgen: the pre-encoded stream is what it claims, the bulk parsers agree with the codec, and a
real pub → Mosquitto → sub round delivers and acknowledges every message."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.mqtt_loadgen import _bulk_publishes, encode_stream, expected_acks, packet_id, payload
from ingest.mqtt.codec import Decoder, encode
from ingest.mqtt.packets import MQTT_5, Publish
from tests.ingest.mqtt.mosquitto import Mosquitto


def test_the_stream_decodes_to_the_promised_publishes_with_ids_wrapping_past_65535() -> None:
    stream, size = encode_stream("bench/dev007/reading", 7, 65_537, 1, 100)
    assert len(stream) == 65_537 * size
    packets = [p for p in Decoder(MQTT_5).feed(stream) if isinstance(p, Publish)]
    assert len(packets) == 65_537
    assert [p.packet_id for p in packets[:2]] == [1, 2] and packets[65_534].packet_id == 65_535
    assert [p.packet_id for p in packets[65_535:]] == [1, 2]  # never 0
    assert all(p.qos == 1 and p.topic == "bench/dev007/reading" for p in packets)
    assert packets[12].payload == payload(7, 12, 100) and len(set(p.payload for p in packets)) == 65_537
    acks = expected_acks(3)
    assert acks == b"\x40\x02\x00\x01\x40\x02\x00\x02\x40\x02\x00\x03"


@pytest.mark.parametrize("qos", [0, 1])
def test_bulk_subscriber_parse_matches_the_codec_and_refuses_a_run_with_another_packet(qos: int) -> None:
    topic = "bench/dev001/reading"
    wire = b"".join(encode(Publish(topic, payload(1, i, 100), qos, packet_id=(i + 1000) if qos else None), MQTT_5)
                    for i in range(50))
    size = len(wire) // 50
    header = wire[: size - (len(topic) + (2 if qos else 0) + 1 + 100)]
    id_at = len(header) + len(topic) if qos else -1
    acks = bytearray()
    assert _bulk_publishes(wire, 0, size, header, id_at, acks) == 50
    assert bytes(acks) == (b"".join(b"\x40\x02" + (i + 1000).to_bytes(2, "big") for i in range(50)) if qos else b"")
    odd = wire[:size * 10] + encode(Publish("bench/other", b"x", qos, packet_id=5 if qos else None), MQTT_5)
    assert _bulk_publishes(odd + wire[size * 10:], 0, size, header, id_at, bytearray()) == 0
    assert _bulk_publishes(wire[:size * 3 + 7], 0, size, header, id_at, bytearray()) == 3  # the partial tail waits


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    yield broker
    broker.stop()


def loadgen(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.mqtt_loadgen", *args], stdin=stdin,
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("qos", [0, 1])
def test_publishers_and_subscriber_through_mosquitto(mosquitto: Mosquitto, qos: int) -> None:
    # 3 connections x 2,000 messages through Mosquitto (Receive Maximum 100 here: the window follows it)
    port = str(mosquitto.port)
    sub = loadgen("sub", "127.0.0.1", port, "--qos", str(qos), "--count", "6000", "--idle-timeout", "10")
    assert sub.stdout is not None and sub.stdout.readline().strip() == "ready"
    pub = loadgen("pub", "127.0.0.1", port, "--qos", str(qos), "--connections", "3", "--messages", "2000",
                  stdin=subprocess.PIPE)
    assert pub.stdout is not None and pub.stdout.readline().strip() == "ready"
    out, _ = pub.communicate("go\n", timeout=60)
    done = json.loads(out)
    assert pub.returncode == 0 and done["messages"] == 6000, done
    if qos:
        assert done["window"] == 100 == done["receive_maximum"]  # Mosquitto's max_inflight_messages
    got = json.loads(sub.communicate(timeout=60)[0])
    assert sub.returncode == 0 and got["messages"] == 6000, got


def test_packet_ids_cycle_from_one() -> None:
    assert [packet_id(i) for i in (0, 1, 65_534, 65_535)] == [1, 2, 65_535, 1]
