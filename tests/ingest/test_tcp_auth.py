"""TCP line ingest with ``security.auth = "required"``: the first line is ``AUTH <user> <password>`` checked
against the user store, answered in the listener's ack style; a refusal is ``FATAL authentication failed``,
closes the connection, stores nothing, and is counted and logged. Real sockets (nc, asyncio) and TcpDevice."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from broker.log.api import LogStore
from broker.log.memory import MemoryLogStore
from broker.security import Authenticator, UserStore
from clients.devices.tcp import TcpDevice
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import RouteDefaults
from ingest.sink import IngestSink
from ingest.tcp.auth import parse_auth_line
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from tests.ingest.conftest import records

Started = tuple[TcpLineListener, LogStore, Authenticator]
Start = Callable[..., Awaitable[Started]]


@pytest.fixture
async def start_listener(tmp_path: Path) -> AsyncIterator[Start]:
    users = UserStore(tmp_path)
    users.add("alice", "correct horse")
    started: list[TcpLineListener] = []

    async def start(**config: object) -> Started:
        store = MemoryLogStore(default_partitions=1)
        sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
        auth = Authenticator(users)
        listener = TcpLineListener(TcpListenerConfig(port=0, **config), sink, sink.health,  # type: ignore[arg-type]
                                   authenticator=auth)
        await listener.start()
        started.append(listener)
        return listener, store, auth

    yield start
    for listener in started:
        await listener.stop()


async def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, then read every answer until the listener closes or half a second passes quietly."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(4096), 0.5 if answer.endswith(b"\n") else 10)
            if not chunk:
                break
            answer += chunk
    except TimeoutError:
        pass
    writer.close()
    return answer


def values(store: LogStore) -> list[bytes | None]:
    return [r.value for r in records(store, "tcp")] if "tcp" in {t.name for t in store.list_topics()} else []


async def test_ack_mode_login_then_lines_behind_it_are_stored(start_listener: Start) -> None:
    listener, store, auth = await start_listener(ack=True)
    answer = await exchange(listener.port, b'AUTH alice correct horse\n{"n": 1}\n{"n": 2}\n')
    lines = answer.decode().splitlines()
    assert lines[0] == "ACK 1"  # the AUTH line is line 1
    assert lines[-1] == "ACK 3" and lines[1].startswith("OK tcp 0 ")
    assert values(store) == [b'{"n": 1}', b'{"n": 2}']  # the AUTH line itself is stored nowhere
    assert auth.successes == {"tcp": 1} and auth.failures == {}


@pytest.mark.parametrize("first", [b"AUTH alice wrong", b"AUTH nobody correct horse", b'{"n": 1}', b"AUTH alice",
                                   b"AUTH  correct horse", b"x" * 70_000])
@pytest.mark.parametrize("ack", [True, False])
async def test_refused_logins_are_answered_fatal_closed_and_store_nothing(
        start_listener: Start, first: bytes, ack: bool, caplog: pytest.LogCaptureFixture) -> None:
    listener, store, auth = await start_listener(ack=ack)
    with caplog.at_level(logging.WARNING, logger="broker.security"):
        answer = await exchange(listener.port, first + b'\n{"n": 1}\n')
    assert answer == b"FATAL authentication failed\n"  # then closed: exchange() read to the end
    assert values(store) == []
    assert auth.failures == {"tcp": 1}
    assert "tcp login failed" in caplog.text and "correct horse" not in caplog.text


async def test_no_auth_line_in_time_is_refused(start_listener: Start) -> None:
    listener, _store, auth = await start_listener(ack=True, auth_timeout_s=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    assert await asyncio.wait_for(reader.read(), 10) == b"FATAL authentication failed\n"
    writer.close()
    assert auth.failures == {"tcp": 1}


async def test_nc_in_plain_mode(start_listener: Start, tmp_path: Path) -> None:
    assert shutil.which("nc"), "needs netcat-openbsd: run scripts/install-system-deps.sh"
    listener, store, _auth = await start_listener()
    data = tmp_path / "lines"
    data.write_bytes(b"AUTH alice correct horse\n" + b"".join(b'{"n": %d}\n' % i for i in range(50)))
    with data.open("rb") as stdin:
        proc = await asyncio.create_subprocess_exec("nc", "-N", "127.0.0.1", str(listener.port), stdin=stdin,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await proc.communicate()
    assert proc.returncode == 0, err
    assert out == b""  # plain mode answers nothing, also to the AUTH line
    for _ in range(500):
        if len(values(store)) == 50:
            break
        await asyncio.sleep(0.01)
    assert [json.loads(v or b"")["n"] for v in values(store)] == list(range(50))


@pytest.mark.parametrize(("listener_ack", "device_ack"), [(True, "auto"), (False, "auto"), (True, True)])
async def test_tcp_device_logs_in(start_listener: Start, listener_ack: bool, device_ack: bool | str) -> None:
    listener, store, _auth = await start_listener(ack=listener_ack)
    # the probe waits out its timeout only where no answer comes (plain); an ack-mode answer to the AUTH line
    # (a PBKDF2 check first) may take more than 0.5 s on a loaded machine, and "auto" would fall back to plain
    device = TcpDevice("127.0.0.1", listener.port, ack=device_ack,  # type: ignore[arg-type]
                       probe_timeout=10 if listener_ack else 0.5, username="alice", password="correct horse")
    async with device:
        for i in range(5):
            await device.send({"n": i})
        await device.flush(10)
    assert device.acking is listener_ack
    for _ in range(500):
        if len(values(store)) == 5:
            break
        await asyncio.sleep(0.01)
    assert [json.loads(v or b"")["n"] for v in values(store)] == list(range(5))


def test_auth_line_parsing() -> None:
    assert parse_auth_line(b"AUTH bob pass word with spaces\r") == parse_auth_line(b"AUTH bob pass word with spaces")
    assert parse_auth_line(b"AUTH bob p").password == "p"
    for bad in (b"auth bob p", b"AUTH", b"AUTH bob", b"AUTH bob ", b"AUTH \xff p"):
        with pytest.raises(ValueError):
            parse_auth_line(bad)
