"""Every HTTP route's happy path and its error shape (application/problem+json), against the app in-process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from broker.errors import StorageError
from broker.log.memory import MemoryLogStore
from broker.log.partition_log import AppendResult
from broker.protocol.records import RecordSpec
from sluice.config import Settings
from sluice.http import create_app
from sluice.runtime import Runtime

PROBLEM = "application/problem+json"


def assert_problem(resp: httpx.Response, status: int, slug: str, *words: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    doc = resp.json()
    assert doc["status"] == status
    assert doc["type"] == f"urn:sluice:problem:{slug}"
    assert doc["title"]
    for word in words:
        assert word in doc["detail"], doc["detail"]
    return doc


async def test_topic_crud(client: httpx.AsyncClient) -> None:
    resp = await client.post("/topics", json={"name": "sensors", "partitions": 3, "config": {"retention.ms": "60000"}})
    assert resp.status_code == 201
    assert resp.headers["location"] == "/topics/sensors"
    body = resp.json()
    assert [p["partition"] for p in body["partitions"]] == [0, 1, 2]
    assert body["config"]["retention.ms"] == "60000"

    listing = (await client.get("/topics")).json()
    assert listing == [{"name": "sensors", "partitions": 3, "internal": False}]

    detail = (await client.get("/topics/sensors")).json()
    assert detail["name"] == "sensors" and len(detail["partitions"]) == 3
    assert (await client.get("/topics/sensors/config")).json()["retention.ms"] == "60000"

    assert (await client.delete("/topics/sensors")).status_code == 204
    assert (await client.get("/topics")).json() == []


async def test_topic_errors(client: httpx.AsyncClient) -> None:
    await client.post("/topics", json={"name": "dup"})
    assert_problem(await client.post("/topics", json={"name": "dup"}), 409, "topic-exists", "dup")
    assert_problem(await client.post("/topics", json={"name": "bad name!"}), 400, "invalid-topic-name", "characters")
    assert_problem(await client.post("/topics", json={"name": "z", "partitions": 0}), 400, "invalid-partitions")
    assert_problem(
        await client.post("/topics", json={"name": "c", "config": {"colour": "red"}}), 400, "invalid-config", "colour"
    )
    assert_problem(await client.post("/topics", json={"partitions": 2}), 422, "invalid-request", "name")
    assert_problem(await client.get("/topics/missing"), 404, "unknown-topic", "missing")
    assert_problem(await client.delete("/topics/missing"), 404, "unknown-topic")
    assert_problem(await client.get("/topics/missing/config"), 404, "unknown-topic")


async def test_config_change_applies_and_bad_names_are_refused(client: httpx.AsyncClient) -> None:
    await client.post("/topics", json={"name": "cfg"})
    assert_problem(
        await client.patch("/topics/cfg/config", json={"config": {"nope": "1"}}), 400, "invalid-config", "nope"
    )
    resp = await client.patch("/topics/cfg/config", json={"config": {"retention.ms": "1000", "flush.policy": "os"}})
    assert resp.status_code == 200
    assert resp.json()["retention.ms"] == "1000"
    assert (await client.get("/topics/cfg/config")).json()["flush.policy"] == "os"
    # Kafka's ranges, from the same rules the Kafka listener uses (broker/log/config_defs.py)
    assert_problem(await client.patch("/topics/cfg/config", json={"config": {"min.cleanable.dirty.ratio": "2"}}),
                   400, "invalid-config", "min.cleanable.dirty.ratio")
    compacted = {"cleanup.policy": "compact", "flush.messages": "1"}
    resp = await client.patch("/topics/cfg/config", json={"config": compacted})
    assert resp.json()["cleanup.policy"] == "compact" and resp.json()["flush.messages"] == "1"
    assert resp.json()["flush.policy"] == "os"  # set by name above: Sluice's own flush.policy wins


async def test_produce_and_fetch_round_trip(client: httpx.AsyncClient) -> None:
    await client.post("/topics", json={"name": "t", "partitions": 2})
    resp = await client.post(
        "/topics/t/records",
        json={
            "records": [
                {"key": "sensor_1", "value": {"temp": 65.5}, "headers": {"unit": "F"}},
                {"key": "sensor_1", "value": {"temp": 66.0}},
                {"value": "second partition", "partition": 1, "timestamp": 1_700_000_000_000},
            ]
        },
    )
    assert resp.status_code == 200, resp.text
    offsets = resp.json()["offsets"]
    assert len(offsets) == 3
    assert offsets[0]["partition"] == offsets[1]["partition"]
    assert offsets[1]["offset"] == offsets[0]["offset"] + 1
    assert offsets[2] == {"partition": 1, "offset": offsets[2]["offset"]}

    p = offsets[0]["partition"]
    page = (await client.get("/topics/t/records", params={"partition": p, "offset": 0})).json()
    values = [r["value"] for r in page["records"] if r["key"] == "sensor_1"]
    assert values == [{"temp": 65.5}, {"temp": 66.0}]
    first = next(r for r in page["records"] if r["key"] == "sensor_1")
    assert first["headers"] == {"unit": "F"}
    assert page["next_offset"] == page["high_watermark"]

    other = (await client.get("/topics/t/records", params={"partition": 1})).json()
    rec = next(r for r in other["records"] if r["timestamp"] == 1_700_000_000_000)
    assert rec["value"] == "second partition"


async def test_produce_text_and_base64_and_fetch_formats(client: httpx.AsyncClient) -> None:
    await client.post("/topics/raw/records", json={"value_format": "text", "records": [{"value": "temp=71"}]})
    await client.post("/topics/raw/records", json={"value_format": "base64", "records": [{"value": "AP8="}]})
    page = (await client.get("/topics/raw/records")).json()
    assert [(r["value"], r["value_format"]) for r in page["records"]] == [("temp=71", "text"), ("AP8=", "base64")]
    as_b64 = (await client.get("/topics/raw/records", params={"format": "base64"})).json()
    assert as_b64["records"][0]["value"] == "dGVtcD03MQ=="
    assert_problem(await client.get("/topics/raw/records", params={"format": "json"}), 400, "value-format", "not JSON")


async def test_fetch_max_and_paging(client: httpx.AsyncClient) -> None:
    await client.post("/topics/many/records", json={"records": [{"value": i} for i in range(25)]})
    seen: list[int] = []
    offset = 0
    while True:
        page = (await client.get("/topics/many/records", params={"offset": offset, "max": 10})).json()
        if not page["records"]:
            break
        assert len(page["records"]) <= 10
        seen.extend(r["value"] for r in page["records"])
        offset = page["next_offset"]
    assert seen == list(range(25))


async def test_produce_errors(client: httpx.AsyncClient, runtime: Runtime) -> None:
    await client.post("/topics", json={"name": "p", "partitions": 2})
    assert_problem(
        await client.post("/topics/p/records", json={"records": [{"value": 1, "partition": 5}]}),
        404,
        "unknown-partition",
        "no partition 5",
    )
    assert_problem(
        await client.post("/topics/p/records", json={"value_format": "base64", "records": [{"value": "***"}]}),
        400,
        "invalid-value",
        "base64",
    )
    assert_problem(
        await client.post("/topics/p/records", json={"value_format": "text", "records": [{"value": 3}]}),
        400,
        "invalid-value",
        "string",
    )
    bad = await client.post("/topics/p/records", content=b'{"records": [', headers={"content-type": "application/json"})
    assert_problem(bad, 400, "malformed-body", "not valid JSON")
    assert_problem(await client.post("/topics/p/records", content=b"hello"), 400, "malformed-body", "Content-Type")
    assert_problem(await client.post("/topics/p/records", json={"records": []}), 422, "invalid-request", "records")
    assert_problem(
        await client.post("/topics/bad!name/records", json={"records": [{"value": 1}]}), 400, "invalid-topic-name"
    )
    runtime.store.auto_create_topics = False
    assert_problem(
        await client.post("/topics/nowhere/records", json={"records": [{"value": 1}]}),
        404,
        "unknown-topic",
        "auto-creation is off",
    )
    big = "x" * (runtime.store.default_config.max_message_bytes + 10)
    assert_problem(
        await client.post("/topics/p/records", json={"value_format": "text", "records": [{"value": big}]}),
        413,
        "record-too-large",
    )


async def test_fetch_errors(client: httpx.AsyncClient) -> None:
    await client.post("/topics/f/records", json={"records": [{"value": 1}]})
    assert_problem(await client.get("/topics/nope/records"), 404, "unknown-topic", "nope")
    assert_problem(await client.get("/topics/f/records", params={"partition": 3}), 404, "unknown-topic", "partition 3")
    assert_problem(await client.get("/topics/f/records", params={"offset": 7}), 416, "offset-out-of-range", "0..1")
    assert_problem(await client.get("/topics/f/records", params={"offset": -1}), 400, "out-of-range", "offset")
    # read_committed needs the transaction coordinator, which runs with the Kafka listener (off here)
    for path in ("/topics/f/records", "/topics/f/stream"):
        assert_problem(await client.get(path, params={"isolation": "read_committed"}), 400,
                       "read-committed-unavailable", "Kafka listener")
    assert (await client.get("/topics/f/records", params={"isolation": "read_uncommitted"})).status_code == 200
    assert (await client.get("/topics/f/records", params={"isolation": "serializable"})).status_code == 422


async def test_long_poll_wakes_when_a_record_arrives(client: httpx.AsyncClient, runtime: Runtime) -> None:
    runtime.store.create_topic("lp")
    started = time.monotonic()
    # A poll that never woke would answer at its 10 s timeout; one that wakes answers at once, well within
    # 5 s also on a loaded machine (it was 2 s and 1.5 s: a margin of 0.5 s for a slow turn).
    poll = asyncio.create_task(client.get("/topics/lp/records", params={"offset": 0, "timeout_ms": 10_000}))
    await asyncio.sleep(0.05)
    assert not poll.done()
    await runtime.store.append_records("lp", [RecordSpec(b'{"temp": 70}')])
    resp = await poll
    assert resp.json()["records"][0]["value"] == {"temp": 70}
    assert time.monotonic() - started < 5

    empty = await client.get("/topics/lp/records", params={"offset": 1, "timeout_ms": 100})
    assert empty.json()["records"] == [] and empty.json()["next_offset"] == 1


async def test_fetch_by_timestamp(client: httpx.AsyncClient) -> None:
    base = 1_700_000_000_000
    batch = [{"value": i, "timestamp": base + i * 1000} for i in range(5)]
    await client.post("/topics/ts/records", json={"records": batch})
    await client.post("/topics/ts/records", json={"records": [{"value": 5, "timestamp": base + 5000}]})
    page = (await client.get("/topics/ts/records", params={"timestamp": base + 5000})).json()
    assert [r["value"] for r in page["records"]] == [5]
    later = (await client.get("/topics/ts/records", params={"timestamp": base + 99_000})).json()
    assert later["records"] == [] and later["next_offset"] == 6


async def test_groups_sources_processors_empty_without_components(client: httpx.AsyncClient) -> None:
    assert (await client.get("/groups")).json() == []
    assert_problem(await client.get("/groups/nobody"), 404, "unknown-group", "nobody")
    assert (await client.get("/sources")).json() == []
    assert (await client.get("/processors")).json() == []


async def test_health_ready_docs(client: httpx.AsyncClient, app: FastAPI) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    ready = await client.get("/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    app.state.ctx.accepting = False
    assert_problem(await client.get("/ready"), 503, "not-ready", "retry")
    docs = await client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    schema = (await client.get("/openapi.json")).json()
    assert "/topics/{topic}/stream" in schema["paths"]


async def test_unknown_route_and_method_are_problems(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/nothing-here"), 404, "not-found", "/docs")
    assert_problem(await client.put("/topics"), 405, "method-not-allowed", "PUT")


@pytest.mark.parametrize("path", ["/topics/none/stream", "/topics/none/records"])
async def test_unknown_topic_on_reads(client: httpx.AsyncClient, path: str) -> None:
    assert_problem(await client.get(path), 404, "unknown-topic")


async def test_stream_errors(client: httpx.AsyncClient) -> None:
    await client.post("/topics/s/records", json={"records": [{"value": 1}]})
    assert_problem(await client.get("/topics/s/stream", params={"offset": 0}), 400, "offset-needs-partition")
    assert_problem(
        await client.get("/topics/s/stream", params={"offset": 9, "partition": 0}), 416, "offset-out-of-range"
    )


class FailingDiskStore(MemoryLogStore):
    """The in-memory store on a disk that refuses every append (as the segment store does on EIO/ENOSPC)."""

    async def append(self, topic: str, partition: int, batch: bytes | bytearray | memoryview) -> AppendResult:
        raise StorageError(f"cannot append to {topic}-{partition}: No space left on device; the batch was not stored")


async def test_storage_failure_is_503_not_500(tmp_path: Path) -> None:
    runtime = Runtime(Settings(data_dir=tmp_path), FailingDiskStore())
    app = create_app(runtime)
    app.state.ctx.accepting = True
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sluice.test") as client:
        resp = await client.post("/topics/t/records", json={"records": [{"value": 1}]})
    assert_problem(resp, 503, "storage-error", "No space left on device")
