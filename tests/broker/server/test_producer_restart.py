"""Idempotent-producer state survives a broker restart: a real ``sluice serve`` (segment store) is
stopped and started between an original produce and a raw-socket retry of the same batch; the retry
is answered with the original offset and nothing is appended twice. Producer ids after the restart
never repeat ids handed out before it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import RecordSpec, decode_all, encode_batch
from broker.server.producer_state import ProducerIdAllocator
from tests.broker.server.conftest import SluiceProcess
from tests.broker.server.raw_client import RawClient
from tests.broker.server.test_kafka_server import fetch_body, produce_body

INIT = {"transactional_id": None, "transaction_timeout": 1000}


def _batch(pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    return encode_batch([RecordSpec(v) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq)


async def _produce(port: int, batch: bytes) -> tuple[int, int]:
    client = await RawClient.connect(port)
    try:
        resp = await client.request(ApiKey.PRODUCE, 8, produce_body(batch, topic="idem"))
        part = resp.topics[0].partitions[0]
        return int(part.error_code), int(part.base_offset)
    finally:
        await client.close()


async def _init_producer(port: int) -> tuple[int, int]:
    client = await RawClient.connect(port)
    try:
        init = await client.request(ApiKey.INIT_PRODUCER_ID, 1, INIT)
        assert init.error_code == ErrorCode.NONE
        return int(init.producer_id), int(init.producer_epoch)
    finally:
        await client.close()


async def _values(port: int) -> list[bytes | None]:
    client = await RawClient.connect(port)
    try:
        resp = await client.request(ApiKey.FETCH, 11, fetch_body(0, topic="idem"))
        return [r.value for r in decode_all(bytes(resp.topics[0].partitions[0].records))]
    finally:
        await client.close()


@pytest.mark.slow
def test_retry_after_restart_is_not_appended_twice(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    server = sluice_factory(tmp_path / "data")
    server.start()
    pid, epoch = asyncio.run(_init_producer(server.port))
    first = _batch(pid, epoch, 0, b"a", b"b", b"c")
    second = _batch(pid, epoch, 3, b"d", b"e")
    assert asyncio.run(_produce(server.port, first)) == (ErrorCode.NONE, 0)
    assert asyncio.run(_produce(server.port, second)) == (ErrorCode.NONE, 3)

    server.stop()
    server.start()

    # The producer never saw the answer to `second` and retries it (and, say, `first`) on the new broker.
    assert asyncio.run(_produce(server.port, second)) == (ErrorCode.NONE, 3)
    assert asyncio.run(_produce(server.port, first)) == (ErrorCode.NONE, 0)
    assert asyncio.run(_values(server.port)) == [b"a", b"b", b"c", b"d", b"e"]
    # The sequence state is really back, not just "first batch of an unknown producer":
    gap = _batch(pid, epoch, 9, b"gap")
    assert asyncio.run(_produce(server.port, gap))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert asyncio.run(_produce(server.port, _batch(pid, epoch, 5, b"f"))) == (ErrorCode.NONE, 5)
    assert asyncio.run(_values(server.port)) == [b"a", b"b", b"c", b"d", b"e", b"f"]

    new_pid, _ = asyncio.run(_init_producer(server.port))
    assert new_pid > pid
    assert (tmp_path / "data" / "producer-ids.json").exists()


def test_allocator_continues_after_reserved_block_and_seen_ids(tmp_path: Path) -> None:
    path = tmp_path / "producer-ids.json"
    before = ProducerIdAllocator(start=100, path=path, block=10)
    handed_out = [before.allocate() for _ in range(12)]
    assert handed_out == list(range(100, 112))
    # Same seed (a clock that went back, or a fast restart): nothing handed out before comes again.
    after = ProducerIdAllocator(start=100, path=path, block=10)
    assert after.allocate() >= 112
    seen = ProducerIdAllocator(start=100)
    seen.observe(5_000)
    assert seen.allocate() == 5_001


async def test_init_producer_id_answers_storage_error_when_the_id_file_cannot_be_written(tmp_path: Path) -> None:
    from broker.log.memory import MemoryLogStore
    from broker.server.kafka import KafkaServer, KafkaServerConfig

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    srv = KafkaServer(MemoryLogStore(), None, KafkaServerConfig(port=0))
    srv.ctx.producer_ids = ProducerIdAllocator(path=data_dir / "producer-ids.json")
    data_dir.rmdir()
    data_dir.write_text("")  # the data dir is gone (a file stands in its place): the id file cannot be written
    await srv.start()
    try:
        client = await RawClient.connect(srv.port)
        init = await client.request(ApiKey.INIT_PRODUCER_ID, 1, INIT)
        assert (init.error_code, init.producer_id) == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        # The connection keeps serving.
        assert (await client.request(ApiKey.INIT_PRODUCER_ID, 1, INIT)).error_code == ErrorCode.KAFKA_STORAGE_ERROR
        await client.close()
    finally:
        await srv.stop()
