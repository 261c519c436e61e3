"""`sluice serve` wiring: the TCP component and file sources share one ingest core per Runtime."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from broker.log.memory import MemoryLogStore
from broker.protocol.records import decode_all
from sluice.components import build_components
from sluice.config import load_settings
from sluice.runtime import Runtime


def _count(store: MemoryLogStore, topic: str) -> int:
    if not store.has_topic(topic):
        return 0
    return sum(len(decode_all(p.read(p.log_start_offset, 1 << 30))) for p in store.partitions(topic))


async def test_tcp_listeners_and_file_source_from_settings(tmp_path: Path) -> None:
    replay = tmp_path / "old.influx"
    replay.write_text("m,dev=a v=1i 1700000000000000000\nm,dev=b v=2i 1700000000000000000\n")
    settings = load_settings(
        None,
        data_dir=tmp_path,
        tcp={"port": 0, "ack": True, "listeners": [{"name": "influx", "port": 0, "format": "influx"}]},
        ingest={
            "files": [
                {
                    "name": "old",
                    "path": str(replay),
                    "format": "influx",
                    "mode": "replay",
                    "topic": "history",
                    "key": "tag:dev",
                }
            ]
        },
        kafka={"enabled": False},
        mqtt={"enabled": False},
        http={"enabled": False},
    )
    store = MemoryLogStore()
    runtime = Runtime(settings, store)
    components = build_components(runtime)
    assert [c.name for c in components] == ["tcp", "files"]
    for c in components:
        await c.start()
    try:
        endpoints = json.loads((tmp_path / "endpoints.json").read_text())
        assert set(endpoints) == {"tcp", "tcp:influx"}
        proc = await asyncio.create_subprocess_exec(
            "nc",
            "-N",
            "127.0.0.1",
            str(endpoints["tcp"]["port"]),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate(b'{"device_id": "x1"}\n{"device_id": "x2"}\n')
        assert out.decode().splitlines()[-1] == "ACK 2"  # ack mode, answered to nc's stdout
        _, w = await asyncio.open_connection("127.0.0.1", endpoints["tcp:influx"]["port"])
        w.write(b"cpu,host=h1 usage=0.5\n")
        await w.drain()
        w.close()
        deadline = time.monotonic() + 10
        while (_count(store, "tcp"), _count(store, "history")) != (3, 2):
            assert time.monotonic() < deadline, (_count(store, "tcp"), _count(store, "history"))
            await asyncio.sleep(0.02)
        health = runtime.registries["ingest_health"].snapshot(devices=False)
        assert {row["source"] for row in health} == {"tcp:default", "tcp:influx", "file:old"}
    finally:
        for c in reversed(components):
            await c.stop()
    assert (tmp_path / "ingest" / "files" / "old.json").exists()
