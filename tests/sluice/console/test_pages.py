"""Console pages in process (httpx against the ASGI app): what a stale link or bad form input gets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from broker.log.memory import MemoryLogStore
from sluice.config import HttpSettings, Settings
from sluice.http import create_app
from sluice.runtime import Runtime


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    runtime = Runtime(Settings(data_dir=tmp_path, http=HttpSettings(port=0)), MemoryLogStore(default_partitions=1))
    runtime.store.create_topic("orders", 2)
    app = create_app(runtime)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sluice.test") as c:
        yield c


@pytest.mark.parametrize(
    ("path", "says"),
    [("/console/topics/nope", "Unknown topic"), ("/console/topics/nope/messages", "Unknown topic"),
     ("/console/groups/nobody", "Unknown group")],
)
async def test_a_stale_link_is_a_404_page(client: httpx.AsyncClient, path: str, says: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404 and response.headers["content-type"].startswith("text/html")
    assert f"<h1>{says}</h1>" in response.text
    assert path.split("/")[3] in response.text  # the name asked for


@pytest.mark.parametrize(
    ("query", "says"),
    [("offset=3", "choose a partition"), ("partition=7", "partition"), ("partition=x", "partition must be a number"),
     ("at=yesterday", "neither milliseconds"), ("partition=0&offset=99999999999999999999", "offset must be a number"),
     # digits to str.isdigit, not to int() (a ValueError and a 500 before): "²", and Arabic-Indic "١٢"
     ("partition=%C2%B2", "partition must be a number"), ("partition=0&offset=%D9%A1%D9%A2", "offset must be a number"),
     ("at=%C2%B2", "neither milliseconds")],
)
async def test_bad_browser_input_is_shown_by_the_form(client: httpx.AsyncClient, query: str, says: str) -> None:
    response = await client.get(f"/console/topics/orders/messages?{query}")
    assert response.status_code == 400 and 'class="error"' in response.text and says in response.text
    assert 'form class="browse"' in response.text


async def test_the_tail_of_an_unknown_topic_is_a_problem(client: httpx.AsyncClient) -> None:
    response = await client.get("/console/topics/nope/tail")
    assert response.status_code == 404 and response.json()["type"].endswith("unknown-topic")


async def test_console_off(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, http=HttpSettings(port=0, console=False))
    app = create_app(Runtime(settings, MemoryLogStore(default_partitions=1)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sluice.test") as c:
        assert (await c.get("/console")).status_code == 404
        assert (await c.get("/topics")).status_code == 200
