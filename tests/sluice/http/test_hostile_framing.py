"""Malformed HTTP/1.1 framing over a raw socket: a 400 and a close, never a traceback in the log.

Found by ``python -m bench.fuzz http``: with uvicorn's h11 protocol, a request whose chunked body is
malformed while the route answers (here TRACE on a GET route: 405) made uvicorn send its 400 first, then
the app's response hit h11 in state MUST_CLOSE: ``LocalProtocolError`` logged at ERROR twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.log.memory import MemoryLogStore
from sluice.config import HttpSettings, Settings
from sluice.http.server import HttpComponent
from sluice.runtime import Runtime

BAD_CHUNKED = (
    b"TRACE /metrics HTTP/1.1\r\nHost: sluice\r\nContent-Type: multipart/form-data; boundary=x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\n4\xff\xff\n0\r\n\r\n"
)
BAD_CHUNKED_POST = (
    b"POST /topics/t/records HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"rec\xff\xff\n0\r\n\r\n"
)


@pytest.fixture
async def port(tmp_path: Path) -> AsyncIterator[int]:
    runtime = Runtime(Settings(data_dir=tmp_path, http=HttpSettings(port=0)), MemoryLogStore())
    component = HttpComponent(runtime)
    await component.start()
    try:
        yield component.bound_port
    finally:
        await component.stop()


async def _exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)  # until the server closes
    writer.close()
    return answer


@pytest.mark.parametrize("request_bytes", [BAD_CHUNKED, BAD_CHUNKED_POST], ids=["trace-405", "post"])
async def test_malformed_chunked_body_gets_400_and_no_traceback(
    port: int, request_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        answer = await _exchange(port, request_bytes)
        assert answer.startswith(b"HTTP/1.1 400 ")
        # the route's own answer, if any, is attempted by now: a well-formed request is served after it
        assert (await _exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).startswith(
            b"HTTP/1.1 200 "
        )
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]
