from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from broker.log.memory import MemoryLogStore
from sluice.config import HttpSettings, Settings
from sluice.http import create_app
from sluice.runtime import Runtime


@pytest.fixture
def runtime(tmp_path: Path) -> Runtime:
    settings = Settings(data_dir=tmp_path, http=HttpSettings(port=0))
    return Runtime(settings, MemoryLogStore(default_partitions=1))


@pytest.fixture
def app(runtime: Runtime) -> FastAPI:
    app = create_app(runtime, max_wait_ms=2_000, sse_heartbeat_s=0.2)
    app.state.ctx.accepting = True
    return app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sluice.test") as c:
        yield c
