"""The HTTP component on a real socket (uvicorn in this event loop), and SSE delivery as records arrive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.log.memory import MemoryLogStore
from broker.protocol.records import RecordSpec
from sluice.config import HttpSettings, Settings
from sluice.http.server import HttpComponent
from sluice.runtime import Runtime


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Runtime, str]]:
    runtime = Runtime(Settings(data_dir=tmp_path, http=HttpSettings(port=0)), MemoryLogStore())
    component = HttpComponent(runtime)
    await component.start()
    try:
        yield runtime, f"http://127.0.0.1:{component.bound_port}"
    finally:
        await component.stop()


async def read_events(lines: AsyncIterator[str], wanted: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async for line in lines:
        if line == "":
            if current.get("event") == "record":
                events.append(current)
                if len(events) == wanted:
                    return events
            current = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(": ")
            current[field] = json.loads(value) if field == "data" else value
    return events


async def test_component_announces_and_serves(served: tuple[Runtime, str], tmp_path: Path) -> None:
    runtime, base = served
    endpoints = json.loads((tmp_path / "endpoints.json").read_text())
    assert endpoints["http"]["port"] == int(base.rsplit(":", 1)[1])
    async with httpx.AsyncClient(base_url=base) as client:
        assert (await client.get("/ready")).json()["endpoints"]["http"].endswith(base.rsplit(":", 1)[1])
        assert (await client.post("/topics/a/records", json={"records": [{"value": 1}]})).status_code == 200
    assert runtime.store.partition("a", 0).high_watermark == 1


async def test_sse_client_receives_records_as_they_are_produced(served: tuple[Runtime, str]) -> None:
    runtime, base = served
    runtime.store.create_topic("live", partitions=2)
    await runtime.store.append_records("live", [RecordSpec(b'"old"')], partition=0)  # before: not streamed (latest)
    async with (
        httpx.AsyncClient(base_url=base, timeout=10) as client,
        client.stream("GET", "/topics/live/stream") as resp,
    ):
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.aiter_lines()
        assert await anext(lines) == "retry: 1000"
        assert await anext(lines) == "event: subscribed"

        async def produce() -> None:
            for i in range(5):
                r = await client.post(
                    "/topics/live/records", json={"records": [{"key": f"sensor_{i}", "value": {"temp": 60 + i}}]}
                )
                assert r.status_code == 200
                await asyncio.sleep(0.02)

        producer = asyncio.create_task(produce())
        events = await asyncio.wait_for(read_events(lines, 5), timeout=10)
        await producer
    temps = sorted(e["data"]["value"]["temp"] for e in events)
    assert temps == [60, 61, 62, 63, 64]
    for e in events:
        partition, offset = e["id"].split(":")
        assert int(partition) == e["data"]["partition"] and int(offset) == e["data"]["offset"]


async def test_sse_from_offset_with_limit_ends_the_stream(served: tuple[Runtime, str]) -> None:
    runtime, base = served
    await runtime.store.append_records("hist", [RecordSpec(str(i).encode()) for i in range(10)])
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        resp = await client.get("/topics/hist/stream", params={"partition": 0, "offset": 4, "limit": 3})
    records = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith('data: {"partition')]
    assert [r["value"] for r in records] == [4, 5, 6]


async def test_stop_ends_open_streams(tmp_path: Path) -> None:
    runtime = Runtime(Settings(data_dir=tmp_path, http=HttpSettings(port=0)), MemoryLogStore())
    runtime.store.create_topic("idle")
    component = HttpComponent(runtime)
    await component.start()
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{component.bound_port}", timeout=10) as client,
        client.stream("GET", "/topics/idle/stream") as resp,
    ):
        lines = resp.aiter_lines()
        await anext(lines)
        await asyncio.wait_for(component.stop(), timeout=8)


async def test_busy_port_fails_start_in_one_sentence(served: tuple[Runtime, str], tmp_path: Path) -> None:
    _, base = served
    port = int(base.rsplit(":", 1)[1])
    other = HttpComponent(Runtime(Settings(data_dir=tmp_path, http=HttpSettings(port=port)), MemoryLogStore()))
    with pytest.raises(OSError, match=f"HTTP API cannot bind 127.0.0.1:{port}"):
        await other.start()
