"""A storage failure is not bad input: when the disk refuses a write, nothing is acknowledged and nothing
goes to ``_dead_letters``; the device keeps its data and, once the disk is back, sends it again.

The failing disk is real: ``sluice serve`` runs with the segment store under a file-size limit
(``RLIMIT_FSIZE``), so an append that would grow a segment past it fails in ``write(2)`` with EFBIG
and the store raises ``StorageError``, as on a full disk, while a dead letter of the same message would
still fit in a fresh ``_dead_letters`` segment (before the fix, that is where the message went, acked).
Raising the limit (``prlimit``) repairs the disk while Sluice keeps running. The clients are
mosquitto_pub, paho-mqtt and a plain TCP socket.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from broker.log.segment import SegmentLogStore
from ingest.mqtt.packets import Will
from tests.ingest.conftest import records
from tests.ingest.mqtt.conftest import RawClient, run

DISK_BYTES = 256 * 1024  # what "fits on the disk": no file of the server may grow past this
FILL = 200 * 1024  # stored first: the topic's segment is then nearly full
BIG = 100 * 1024  # does not fit after FILL, but would fit in a fresh file (a dead letter would be stored)
ENV = {"SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0", "SLUICE_HTTP__PORT": "0",
       "SLUICE_STORAGE__FLUSH": "always", "SLUICE_STORAGE__BACKEND": "segment", "SLUICE_TCP__ACK": "true",
       "SLUICE_TCP__MAX_LINE_BYTES": str(2 * FILL)}


class Sluice:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.log = data.parent / "sluice.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data)],
                env={**os.environ, **ENV}, stdout=out, stderr=out,
                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (DISK_BYTES, resource.RLIM_INFINITY)),
            )
        endpoints = data / "endpoints.json"
        deadline = time.monotonic() + 120  # a deadline for a loaded machine (tests/sluice_server.py), not a wait
        while not (endpoints.exists() and {"mqtt", "tcp", "http"} <= set(json.loads(endpoints.read_text()))):
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "sluice did not start"
            time.sleep(0.02)
        found = json.loads(endpoints.read_text())
        self.mqtt, self.tcp, self.http = (int(found[name]["port"]) for name in ("mqtt", "tcp", "http"))

    def repair_disk(self) -> None:
        resource.prlimit(self.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    def mqtt_status(self) -> dict[str, int]:
        status: dict[str, int] = httpx.get(f"http://127.0.0.1:{self.http}/mqtt", timeout=5).json()
        return status

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def sluice(tmp_path: Path) -> Iterator[Sluice]:
    data = tmp_path / "data"
    data.mkdir()
    server = Sluice(data)
    try:
        yield server
    finally:
        server.stop()


async def wait_until(predicate: object, what: str, timeout: float = 20.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class PahoDevice:
    """A paho device publishing at QoS 1; records each PUBACK's reason code."""

    def __init__(self, port: int, protocol: paho.MQTTProtocolVersion, client_id: str) -> None:
        self.acks: dict[int, int] = {}  # mid -> PUBACK reason code
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                                  clean_session=False if protocol == paho.MQTTv311 else None)
        self.client.reconnect_delay_set(1, 1)
        self.client.on_publish = lambda c, u, mid, reason, props: self.acks.__setitem__(mid, int(reason.value))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def publish(self, payload: bytes) -> paho.MQTTMessageInfo:
        return self.client.publish("meters/big", payload, qos=1)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def test_a_full_disk_is_never_acknowledged_nor_dead_lettered(sluice: Sluice, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * BIG)
    fill = tmp_path / "fill.bin"
    fill.write_bytes(b"f" * FILL)
    port = str(sluice.mqtt)
    # the disk works for what fits
    code, _, err = await run("mosquitto_pub", "-p", port, "-q", "1", "-t", "meters/fill", "-f", str(fill))
    assert code == 0, err

    # MQTT 3.1.1 has no negative ack: no PUBACK, the connection is closed
    code, out, err = await run("mosquitto_pub", "-p", port, "-V", "mqttv311", "-q", "1", "-t", "meters/big",
                               "-f", str(big), "-d")
    assert code != 0 and "Client (null) received PUBACK" not in out, (out, err)
    # MQTT 5: PUBACK with reason code 0x80 (unspecified error)
    code, out, err = await run("mosquitto_pub", "-p", port, "-V", "mqttv5", "-q", "1", "-t", "meters/big",
                               "-f", str(big), "-d")
    assert "received PUBACK (Mid: 1, RC:128)" in out, (code, out, err)

    # paho 5.0 gets 0x80 and can send again; paho 3.1.1 keeps the message and resends it on reconnect
    v5 = await asyncio.to_thread(PahoDevice, sluice.mqtt, paho.MQTTv5, "paho-v5")
    v311 = await asyncio.to_thread(PahoDevice, sluice.mqtt, paho.MQTTv311, "paho-v311")
    try:
        refused = v5.publish(b"v5:" + b"x" * BIG)
        await wait_until(lambda: refused.mid in v5.acks, "PUBACK for the 5.0 client")
        assert v5.acks[refused.mid] == 0x80
        kept = v311.publish(b"v311:" + b"x" * BIG)
        before = (await asyncio.to_thread(sluice.mqtt_status))["append_errors"]
        await wait_until(lambda: sluice.mqtt_status()["append_errors"] > before, "a refused 3.1.1 append")
        assert not kept.is_published()

        # a will that cannot be stored is logged (no traceback) and counted
        errors = (await asyncio.to_thread(sluice.mqtt_status))["append_errors"]
        raw = await RawClient.open(sluice.mqtt)
        await raw.connect("doomed", will=Will("status/doomed", b"w" * 60_000))  # past the full segment
        await raw.close()  # dropped without DISCONNECT: the will is due
        await wait_until(lambda: sluice.mqtt_status()["append_errors"] > errors, "the will's failed append")

        # TCP ack mode: FATAL (never ACK), then the connection closes
        reader, writer = await asyncio.open_connection("127.0.0.1", sluice.tcp)
        writer.write(b'{"device_id": "tcp", "fill": "' + b"f" * FILL + b'"}\n')
        assert (await asyncio.wait_for(reader.readline(), 20)).startswith(b"OK tcp")
        assert await asyncio.wait_for(reader.readline(), 20) == b"ACK 1\n"
        writer.write(b'{"device_id": "tcp", "blob": "' + b"y" * BIG + b'"}\n')
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 20)
        assert answer.startswith(b"FATAL storage failure") and b"ACK" not in answer, answer
        writer.close()

        sluice.repair_disk()
        await asyncio.to_thread(kept.wait_for_publish, 20)  # paho's own retry after its reconnect
        assert kept.is_published() and v311.acks[kept.mid] == 0
        again = v5.publish(b"v5:" + b"x" * BIG)
        await asyncio.to_thread(again.wait_for_publish, 20)
        assert v5.acks[again.mid] == 0
    finally:
        await asyncio.to_thread(v5.close)
        await asyncio.to_thread(v311.close)
    code, _, err = await run("mosquitto_pub", "-p", port, "-q", "1", "-t", "meters/big", "-f", str(big))
    assert code == 0, err
    reader, writer = await asyncio.open_connection("127.0.0.1", sluice.tcp)
    writer.write(b'{"device_id": "tcp", "n": 1}\n')
    assert (await asyncio.wait_for(reader.readline(), 20)).startswith(b"OK tcp")
    writer.close()

    await asyncio.to_thread(sluice.stop)
    log = sluice.log.read_text()
    assert "storage failure" in log and "will message not stored" in log and "Traceback" not in log, log[-3000:]
    store = SegmentLogStore(sluice.data / "logs")
    await store.start()
    try:
        assert not store.has_topic("_dead_letters")
        stored = [r.value or b"" for r in records(store, "mqtt")]
        assert stored.count(b"f" * FILL) == 1
        assert [len(v) for v in stored if v.startswith(b"v311:")] == [BIG + 5]
        assert [len(v) for v in stored if v.startswith(b"v5:")] == [BIG + 3]
        assert stored.count(b"x" * BIG) == 1  # mosquitto_pub's, once the disk was back
        assert len(records(store, "tcp")) == 2
    finally:
        await store.close()
