"""One bad line never costs its neighbours: a parse failure of any kind (not only ValueError) is a dead
letter with its reason, the valid lines around it are stored, and ack mode answers (MQTT:
tests/ingest/mqtt/test_bad_payloads.py)."""

from __future__ import annotations

import asyncio

import pytest

from broker.log.memory import MemoryLogStore
from ingest.formats import FORMATS, parse_payload
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import RawMessage, RouteDefaults, SourceRef
from ingest.sink import IngestSink
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from tests.ingest.conftest import records

DEEP = b"[" * 30_000  # the stdlib JSON parser raises RecursionError, not ValueError
HOSTILE = [DEEP, b"{" * 30_000 + b'"a":1', b'{"a":' * 5_000 + b"1" + b"}" * 5_000, b"1" * 20_000 + b"e99999"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("payload", HOSTILE)
def test_parsers_raise_only_format_errors(fmt: str, payload: bytes) -> None:
    from ingest.errors import FormatError

    try:
        parse_payload(fmt, payload, ("a",))
    except FormatError:
        pass


async def test_router_turns_a_recursion_error_into_a_dead_letter_reason() -> None:
    store = MemoryLogStore()
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    outcomes = await sink.write(
        SourceRef("tcp", "t", "json"),
        [RawMessage(b'{"device_id": "a"}'), RawMessage(DEEP), RawMessage(b'{"device_id": "b"}')],
    )
    assert [o.ok for o in outcomes] == [True, False, True]
    assert "nested too deeply" in outcomes[1].rejected[0]
    (letter,) = records(store, "_dead_letters")
    assert letter.value == DEEP and b"nested too deeply" in (letter.header("reason") or b"")


@pytest.mark.parametrize("ack", [True, False])
async def test_tcp_keeps_the_lines_around_a_deeply_nested_one(ack: bool) -> None:
    store = MemoryLogStore()
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    listener = TcpLineListener(TcpListenerConfig(port=0, ack=ack), sink, sink.health)
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        # one write: the three lines arrive in one read, so they are one batch for the sink
        writer.write(b'{"device_id": "before"}\n' + DEEP + b'\n{"device_id": "after"}\n')
        await writer.drain()
        if ack:
            answer: list[str] = []
            while not answer or not answer[-1].startswith("ACK"):
                line = await asyncio.wait_for(reader.readline(), 10)
                assert line, f"connection closed after {answer}"
                answer.append(line.decode().rstrip("\n"))
            assert answer[0].startswith("ERR 2 json: invalid JSON: nested too deeply")
            assert answer[-1] == "ACK 3"
        else:
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after the batch, not before
        writer.close()
        for _ in range(500):
            if len(records(store, "tcp")) == 2 and store.has_topic("_dead_letters"):
                break
            await asyncio.sleep(0.01)
        assert sorted(r.key or b"" for r in records(store, "tcp")) == [b"after", b"before"]
        (letter,) = records(store, "_dead_letters")
        assert letter.value == DEEP and b"nested too deeply" in (letter.header("reason") or b"")
    finally:
        await listener.stop()
