"""``/bridges`` and ``/mqtt`` without those components: an empty list and a problem document."""

from __future__ import annotations

import httpx


async def test_no_bridges_is_an_empty_list(client: httpx.AsyncClient) -> None:
    assert (await client.get("/bridges")).json() == []
    resp = await client.get("/bridges/site")
    assert resp.status_code == 404 and resp.json()["type"] == "urn:sluice:problem:unknown-bridge"


async def test_mqtt_off_is_a_problem_with_the_fix(client: httpx.AsyncClient) -> None:
    resp = await client.get("/mqtt")
    assert resp.status_code == 404
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["type"] == "urn:sluice:problem:mqtt-disabled" and "SLUICE_MQTT__ENABLED" in body["detail"]
