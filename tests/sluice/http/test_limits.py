"""HTTP input limits: the request body cap (413, refused while the body streams in), numbers held to
Kafka's INT32/INT64 ranges and topic configs to Kafka's (400), all as application/problem+json."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from broker.log.memory import MemoryLogStore
from sluice.config import HttpSettings, Settings, load_settings
from sluice.http.server import HttpComponent
from sluice.runtime import Runtime
from tests.sluice.http.test_routes import PROBLEM, assert_problem

MiB = 1024 * 1024


async def test_timestamps_and_other_numbers_outside_kafka_ranges_are_400(client: httpx.AsyncClient) -> None:
    """A timestamp >= 2^63 used to reach the record encoder and come back as a 500 (struct.error)."""
    for ts, words in ((2**63, ("records.0.timestamp", "9223372036854775807")), (2**64, ()), (-2, ("-1",))):
        resp = await client.post("/topics/t/records", json={"records": [{"value": 1, "timestamp": ts}]})
        assert_problem(resp, 400, "out-of-range", *words)
    resp = await client.post("/topics/t/records", json={"records": [{"value": 1, "partition": 2**31}]})
    assert_problem(resp, 400, "out-of-range", "records.0.partition")
    extremes = [{"value": "max", "timestamp": 2**63 - 1}, {"value": "now", "timestamp": -1}]
    resp = await client.post("/topics/t/records", json={"records": extremes})
    assert resp.status_code == 200, resp.text
    records = (await client.get("/topics/t/records")).json()["records"]
    assert records[0]["timestamp"] == 2**63 - 1
    assert records[1]["timestamp"] > 1_600_000_000_000  # -1 is Kafka's "no timestamp": stamped now
    for params in ({"offset": 2**63}, {"timestamp": 2**63}, {"partition": 2**31}, {"timeout_ms": 2**31},
                   {"offset": -1}):
        assert_problem(await client.get("/topics/t/records", params=params), 400, "out-of-range", "query.")


async def test_topic_configs_outside_kafka_ranges_are_400(client: httpx.AsyncClient) -> None:
    for config, words in (({"segment.bytes": "0"}, ("segment.bytes", "at least 14")),
                          ({"retention.ms": "-5"}, ("retention.ms", "at least -1")),
                          ({"max.message.bytes": "99999999999999999999"}, ("max.message.bytes",))):
        resp = await client.post("/topics", json={"name": "c", "config": config})
        assert_problem(resp, 400, "invalid-config", *words)
    assert (await client.post("/topics", json={"name": "c"})).status_code == 201
    resp = await client.patch("/topics/c/config", json={"config": {"segment.bytes": "0"}})
    assert_problem(resp, 400, "invalid-config", "segment.bytes")
    assert (await client.get("/topics/c/config")).json()["segment.bytes"] != "0"


def test_body_limit_defaults_to_8_mib_and_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().http.max_body_bytes == 8 * MiB
    monkeypatch.setenv("SLUICE_HTTP__MAX_BODY_BYTES", "4096")
    assert load_settings().http.max_body_bytes == 4096


@pytest.fixture
async def base(tmp_path: Path) -> AsyncIterator[str]:
    """A real uvicorn socket with a 1 MiB body cap."""
    runtime = Runtime(
        Settings(data_dir=tmp_path, http=HttpSettings(port=0, max_body_bytes=MiB)), MemoryLogStore()
    )
    component = HttpComponent(runtime)
    await component.start()
    try:
        yield f"http://127.0.0.1:{component.bound_port}"
    finally:
        await component.stop()


async def test_curl_declaring_100_mb_gets_413_before_sending_it(base: str, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MB of zeros
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-H", "Content-Type: application/json", "--data-binary", f"@{big}",
        "-w", "\n%{http_code} %{size_upload} %{content_type}", f"{base}/topics/t/records",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    body, _, summary = out.decode().rpartition("\n")
    status, uploaded, content_type = summary.split(" ", 2)
    assert (status, content_type) == ("413", PROBLEM), (out, err)
    doc = json.loads(body)
    assert doc["type"] == "urn:sluice:problem:body-too-large" and "1048576 bytes" in doc["detail"]
    assert int(uploaded) < MiB  # curl waited for "100 Continue" and was refused instead
    # a body under the cap still works
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"records": [{"value": "x" * 1000}]}))
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-o", os.devnull, "-w", "%{http_code}", "-H", "Content-Type: application/json",
        "--data-binary", f"@{small}", f"{base}/topics/t/records", stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert out == b"200"


async def test_chunked_body_is_refused_while_it_streams(base: str) -> None:
    """No Content-Length: the cap is enforced as chunks arrive, long before 100 MB have been sent."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /topics/t/records HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
    )
    chunk = 64 * 1024
    frame = f"{chunk:x}\r\n".encode() + b'{"records": [' + b" " * (chunk - 13) + b"\r\n"
    answer = asyncio.create_task(reader.read(65536))
    sent = 0
    try:
        while not answer.done() and sent < 100 * MiB:
            writer.write(frame)
            await writer.drain()
            sent += chunk
    except ConnectionError:
        pass  # the server answered and closed while we were still sending
    head = await asyncio.wait_for(answer, 20)
    assert head.startswith(b"HTTP/1.1 413 "), head[:200]
    assert b"body-too-large" in head
    assert sent < 20 * MiB, sent  # the cap (1 MiB) plus what socket buffers took
    writer.close()
