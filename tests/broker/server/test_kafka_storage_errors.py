"""A failing disk under the Kafka listener: every Produce is still answered (KAFKA_STORAGE_ERROR for the
partitions hit), the connection stays usable, each failure is logged once with its partition and
counted, and nothing is acknowledged that is not stored.

The fsync failure is injected at the one place the segment store calls fsync (``_fsync_all``, run in
its worker threads): no filesystem here fails fsync on demand. The disk-full case uses a real full
filesystem instead (``test_kafka_disk_full.py``).
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.log import segment_partition as segment
from broker.log.segment import SegmentLogStore
from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import RecordSpec, decode_all, encode_batch
from broker.server.kafka import KafkaServer, KafkaServerConfig
from sluice.front_metrics import KafkaCollector
from tests.broker.server.raw_client import RawClient


class FailingFsync:
    """Stands in for ``segment_partition._fsync_all``: raises EIO for the next ``armed`` calls, then syncs for real."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.armed = 0
        self.failed = 0
        self._lock = threading.Lock()  # called from the store's worker threads

    def __call__(self, files: list[int], dirs: list[Path]) -> None:
        with self._lock:
            fail = self.armed > 0
            if fail:
                self.armed -= 1
                self.failed += 1
        if fail:
            raise OSError(errno.EIO, "Input/output error")
        self.real(files, dirs)


@pytest.fixture
def fsync(monkeypatch: pytest.MonkeyPatch) -> FailingFsync:
    fault = FailingFsync(segment._fsync_all)
    monkeypatch.setattr(segment, "_fsync_all", fault)
    return fault


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[KafkaServer]:
    store = SegmentLogStore(tmp_path / "data")  # topics default to flush=always: Produce waits for fsync
    await store.start()
    srv = KafkaServer(store, None, KafkaServerConfig(port=0))
    await srv.start()
    yield srv
    await srv.stop()
    try:
        await store.close()
    except Exception:
        pass  # the partition whose fsync failed refuses a clean close, by design


def produce_body(topic: str, batch: bytes) -> dict[str, Any]:
    return {"transactional_id": None, "acks": -1, "timeout": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}


async def produce(client: RawClient, topic: str, batch: bytes) -> Any:
    resp = await client.request(ApiKey.PRODUCE, 8, produce_body(topic, batch), timeout=5)
    return resp.topics[0].partitions[0]


def records(*values: bytes, **kw: Any) -> bytes:
    return encode_batch([RecordSpec(v) for v in values], **kw)


async def test_failed_fsync_is_answered_storage_error_and_the_connection_stays_usable(
    server: KafkaServer, fsync: FailingFsync, caplog: pytest.LogCaptureFixture
) -> None:
    client = await RawClient.connect(server.port)
    init = await client.request(ApiKey.INIT_PRODUCER_ID, 1, {"transactional_id": None, "transaction_timeout": 1000})
    pid = int(init.producer_id)
    assert (await produce(client, "t", records(b"kept", producer_id=pid, base_sequence=0))).error_code == 0
    assert (await produce(client, "u", records(b"u-kept"))).error_code == 0
    fsync.armed = 1
    unlucky = records(b"lost?", producer_id=pid, base_sequence=1)
    with caplog.at_level(logging.INFO):
        first = await produce(client, "t", unlucky)
        assert first.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert fsync.failed == 1
        # The same connection answers on: the idempotent retry is not acknowledged as a duplicate of a
        # batch whose fsync failed, the partition keeps refusing, other partitions still work.
        assert (await produce(client, "t", unlucky)).error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert (await produce(client, "t", records(b"more"))).error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert (await produce(client, "u", records(b"u-more"))).error_code == ErrorCode.NONE
        versions = await client.request(ApiKey.API_VERSIONS, 0, {})
        assert int(versions.error_code) == ErrorCode.NONE
    about_t0 = [r for r in caplog.records if r.levelno >= logging.WARNING and "t-0" in r.getMessage()]
    assert len(about_t0) == 1, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.exc_info], "no traceback for a storage failure"
    assert server.stats.produce_storage_errors == 3
    counted = {family.name: family.samples[0].value for family in KafkaCollector(server.stats).collect()
               if family.name == "sluice_kafka_produce_storage_errors"}
    assert counted == {"sluice_kafka_produce_storage_errors": 3}
    fetched = await client.request(ApiKey.FETCH, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": "u", "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                                   "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    assert [r.value for r in decode_all(bytes(fetched.topics[0].partitions[0].records))] == [b"u-kept", b"u-more"]
    await client.close()


async def test_pipelined_produces_behind_a_failed_fsync_are_all_answered(
    server: KafkaServer, fsync: FailingFsync
) -> None:
    client = await RawClient.connect(server.port)
    assert (await produce(client, "t", records(b"kept"))).error_code == 0
    fsync.armed = 1
    sent = [client.send(ApiKey.PRODUCE, 8, produce_body("t", records(b"p%d" % i))) for i in range(10)]
    answered = []
    for _ in sent:
        corr, resp = await client.receive(ApiKey.PRODUCE, 8, timeout=5)
        answered.append((corr, resp.topics[0].partitions[0].error_code))
    assert [c for c, _ in answered] == sent
    assert {code for _, code in answered} == {ErrorCode.KAFKA_STORAGE_ERROR}
    await client.close()
