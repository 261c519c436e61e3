"""JSON may spell a lone UTF-16 surrogate (``"\\ud800"``); UTF-8 cannot hold it. Found by ``python -m bench.fuzz
http``: such a key or header value gave a 500 with a UnicodeEncodeError traceback, and an error detail that
echoed one (a topic config value) failed again while rendering the problem document."""

from __future__ import annotations

import json

import httpx
import pytest

SURROGATE = "\\ud800"  # as it travels in the JSON text


@pytest.mark.parametrize(
    "record",
    [f'{{"key": "{SURROGATE}", "value": 1}}', f'{{"value": 1, "headers": {{"h": "{SURROGATE}"}}}}',
     f'{{"value": 1, "headers": {{"{SURROGATE}": "v"}}}}'],
    ids=["key", "header-value", "header-name"],
)
async def test_a_lone_surrogate_in_key_or_headers_is_a_422_problem(client: httpx.AsyncClient, record: str) -> None:
    answer = await client.post(
        "/topics/t/records", content=f'{{"records": [{record}]}}'.encode(), headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert "not valid UTF-8" in answer.json()["detail"]


async def test_a_problem_detail_echoing_a_lone_surrogate_still_renders(client: httpx.AsyncClient) -> None:
    answer = await client.post(
        "/topics",
        content=f'{{"name": "t2", "config": {{"cleanup.policy": "{SURROGATE}"}}}}'.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400, answer.text
    doc = json.loads(answer.content.decode("ascii"))  # escaped, so the document is plain ASCII JSON
    assert doc["status"] == 400 and "\ud800" in doc["detail"]
