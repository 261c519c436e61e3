"""/metrics parses with prometheus-client's own parser and counts what was done."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_count_produce_fetch_and_errors(client: httpx.AsyncClient) -> None:
    await client.post("/topics", json={"name": "m", "partitions": 2})
    for _ in range(3):
        r = await client.post("/topics/m/records", json={"records": [{"key": f"k{i}", "value": i} for i in range(10)]})
        assert r.status_code == 200
    fetched = (await client.get("/topics/m/records", params={"partition": 0, "max": 1000})).json()["records"]
    await client.get("/topics/missing/records")

    resp = await client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    got = samples(resp.text)
    assert got[("sluice_http_produced_records_total", (("topic", "m"),))] == 30
    assert got[("sluice_http_fetch_requests_total", (("topic", "m"),))] == 1
    assert got[("sluice_http_fetched_records_total", (("topic", "m"), ("via", "fetch")))] == len(fetched)
    hw = [got[("sluice_partition_high_watermark", (("partition", str(p)), ("topic", "m")))] for p in (0, 1)]
    assert sum(hw) == 30
    assert got[("sluice_topics", ())] == 1
    ok = (("method", "POST"), ("route", "/topics/{topic}/records"), ("status", "200"))
    assert got[("sluice_http_requests_total", ok)] == 3
    assert got[("sluice_http_errors_total", (("status", "404"),))] == 1
    assert got[("sluice_http_produced_bytes_total", (("topic", "m"),))] > 0


async def test_each_app_has_its_own_registry(client: httpx.AsyncClient) -> None:
    from broker.log.memory import MemoryLogStore
    from sluice.config import Settings
    from sluice.http import create_app
    from sluice.runtime import Runtime

    other = create_app(Runtime(Settings(), MemoryLogStore()))
    await client.post("/topics/x/records", json={"records": [{"value": 1}]})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=other), base_url="http://o") as c2:
        text = (await c2.get("/metrics")).text
    assert ("sluice_http_produced_records_total", (("topic", "x"),)) not in samples(text)
