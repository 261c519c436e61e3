"""Durability: Sluice as a real process (segment store, flush=always) is killed with SIGKILL right
after sending PUBACKs; after a restart every acknowledged message is in the log. Repeated 3 times."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from broker.log.segment import SegmentLogStore
from tests.ingest.conftest import records

ENV = {"SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0", "SLUICE_HTTP__PORT": "0",
       "SLUICE_STORAGE__FLUSH": "always", "SLUICE_STORAGE__BACKEND": "segment"}


def start_sluice(data: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``sluice serve`` in its own process; returns it and its MQTT port once it is listening."""
    endpoints = data / "endpoints.json"
    endpoints.unlink(missing_ok=True)
    log = open(data.parent / "sluice.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data)],
                            env={**os.environ, **ENV}, stdout=log, stderr=log)
    deadline = time.monotonic() + 120  # a deadline for a loaded machine (tests/sluice_server.py), not a wait
    while True:
        assert proc.poll() is None, (data.parent / "sluice.log").read_text()[-3000:]
        if time.monotonic() > deadline:
            proc.kill()  # not left running behind the failed test (one was, at load 15-20)
            proc.wait()
            raise AssertionError("sluice did not start within 120 s")
        if endpoints.exists():
            found = json.loads(endpoints.read_text())
            if "mqtt" in found:
                return proc, int(found["mqtt"]["port"])
        time.sleep(0.02)


def publish_until_killed(port: int, proc: subprocess.Popen[bytes], kill_after: int, run: int) -> set[bytes]:
    """Publish QoS 1 as fast as paho allows; SIGKILL the server from inside the ack callback once
    ``kill_after`` PUBACKs have arrived. Returns every payload the server acknowledged."""
    payloads: dict[int, bytes] = {}  # mid -> payload (mids do not wrap: < 65535 messages per run)
    acked_mids: set[int] = set()
    killed = threading.Event()

    def on_publish(client: paho.Client, userdata: object, mid: int, rc: object, props: object) -> None:
        acked_mids.add(mid)
        if len(acked_mids) >= kill_after and not killed.is_set():
            os.kill(proc.pid, signal.SIGKILL)  # right after these PUBACKs
            killed.set()

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"durable-{run}", protocol=paho.MQTTv311)
    client.max_inflight_messages_set(100)
    client.max_queued_messages_set(0)
    client.on_publish = on_publish
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        i = 0
        while not killed.is_set() and i < kill_after * 10:
            payload = b"run%d-msg%06d" % (run, i)
            info = client.publish("meters/m1/energy", payload, qos=1)
            payloads[info.mid] = payload
            i += 1
            if i % 50 == 0:
                time.sleep(0.001)
        assert killed.wait(30), "the server never acknowledged enough messages"
        proc.wait(10)
        time.sleep(0.2)  # let paho drain any acks already in its socket buffer
    finally:
        client.loop_stop()
        client.disconnect()
    return {payloads[mid] for mid in acked_mids}


async def read_log(logs: Path) -> list[bytes]:
    store = SegmentLogStore(logs)
    await store.start()
    try:
        return [r.value or b"" for r in records(store, "mqtt")]
    finally:
        await store.close()


@pytest.mark.slow
async def test_kill_9_after_pubacks_loses_no_acknowledged_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    all_acked: set[bytes] = set()
    for run, kill_after in enumerate((150, 400, 900)):
        proc, port = await asyncio.to_thread(start_sluice, data)
        try:
            acked = await asyncio.to_thread(publish_until_killed, port, proc, kill_after, run)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert len(acked) >= kill_after
        all_acked |= acked
        stored = await read_log(data / "logs")
        missing = all_acked - set(stored)
        assert not missing, f"run {run}: {len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:3]}"
    # and the restarted server is healthy on the recovered log
    proc, port = await asyncio.to_thread(start_sluice, data)
    try:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="after", protocol=paho.MQTTv5)
        client.connect("127.0.0.1", port)
        client.loop_start()
        info = client.publish("meters/m1/energy", b"after-restarts", qos=1)
        info.wait_for_publish(10)
        assert info.is_published()
        client.disconnect()
        client.loop_stop()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    stored = await read_log(data / "logs")
    assert all_acked <= set(stored) and b"after-restarts" in stored
