"""Standalone mode over the Kafka protocol (aiokafka): a consumer-group member, a producer,
and checkpoints in a Kafka topic. Works against Sluice's Kafka listener or any Kafka cluster.

* ``KafkaSource`` (kafka_source.py): ``AIOKafkaConsumer`` subscribed with ``group_id = pipeline
  name``, auto-commit off. On assignment the runner restores the newest checkpoint of each partition
  and seeks there; on revocation it writes a checkpoint of the revoked partitions first. Offsets are
  committed right after each stored checkpoint, so group offsets and checkpoints agree.
* ``KafkaSink``: ``AIOKafkaProducer`` (acks=all); ``flush`` waits for every pending send, which
  the runner does before storing a checkpoint (at-least-once).
* ``KafkaCheckpointStore``: checkpoint records (keyed by source partition, see
  ``processors.checkpoint``) in partition 0 of ``_checkpoints.<pipeline>``, read ``read_committed``.

Exactly-once (``guarantee="exactly-once"``): the sink's producer has a ``transactional.id``
(``<pipeline>-<instance id>``: stable across restarts of one instance, so a restarted instance's
InitProducerId fences its predecessor and aborts the transaction it left open; unique per instance).
Each checkpoint interval is one transaction, begun lazily by its first write: results, late records,
dead letters, the checkpoint records and the input offsets (``send_offsets_to_transaction`` in place
of ``consumer.commit``) commit together at the checkpoint. The input is read ``read_committed``. A
transaction that fails (fenced, timed out, broker error) is aborted and stops the processor: its
in-memory state includes the aborted interval, so it must restart from the last committed checkpoint.
Zombie fencing and commits lost to a rebalance are the consumer's part: see kafka_source.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Collection
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    KafkaError,
)
from aiokafka.structs import OffsetAndMetadata
from crc32c import crc32c

from clients.security import ClientSecurity
from processors.checkpoint import (
    MAX_CHECKPOINT_BYTES,
    CheckpointCodec,
    CheckpointRecord,
    PartitionRestore,
    checkpoint_topic,
    load_from_tail,
)
from processors.errors import CheckpointError, PartitionsLostError, SourceError
from processors.executor import OutBatch, OutRecord
from processors.executor import TopicPartition as TP
from processors.txn_offsets import MemberFencedError

__all__ = ["KafkaCheckpointStore", "KafkaSink"]

MAX_REQUEST_BYTES = 16 * 1024 * 1024

_TOPIC_ALREADY_EXISTS = 36
log = logging.getLogger("processors.kafka")


_BATCH_HEAD = struct.Struct(">qiibI")  # base offset, batch length, partition leader epoch, magic, CRC
_BATCH_REST = struct.Struct(">hiqqqhii")  # attributes ... record count: what the CRC covers, with the records
_TRANSACTIONAL = 0x10


class _PreparedBuilder:
    """aiokafka's ``BatchBuilder`` interface over an ``OutBatch`` (``producer.send_batch`` takes
    it as one of its own): the batch header is written when the sender drains it, once aiokafka has
    set the producer id, epoch and base sequence (idempotent and transactional producers)."""

    def __init__(self, batch: OutBatch, transactional: bool) -> None:
        self.batch = batch
        self.transactional = transactional
        self.producer: tuple[int, int, int] = (-1, -1, -1)
        self._buffer: bytes | None = None

    def _set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        self.producer = (producer_id, producer_epoch, base_sequence)

    def _build(self) -> bytes:
        if self._buffer is None:  # built once: a retry sends the same bytes
            b = self.batch
            rest = _BATCH_REST.pack(_TRANSACTIONAL if self.transactional else 0, b.count - 1, b.timestamp,
                                    b.max_timestamp, *self.producer, b.count) + (b.value or b"")
            self._buffer = _BATCH_HEAD.pack(0, len(rest) + 9, -1, 2, crc32c(rest)) + rest
        return self._buffer

    def append(self, **_: Any) -> None:
        return None  # full: aiokafka's own records go into a batch of their own

    def close(self) -> None:
        return None

    def closed(self) -> bool:
        return True  # no lingering: it is complete

    def record_count(self) -> int:
        return self.batch.count

    def size(self) -> int:
        return len(self.batch.value or b"") + 61


class KafkaSink:
    """The producer of results and checkpoints. With ``transactional_id`` every write goes into a
    transaction begun by the first write after a commit; ``commit_transaction`` ends it."""

    def __init__(self, bootstrap: str, *, client_id: str | None = None, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000) -> None:
        self.bootstrap = bootstrap
        txn: dict[str, Any] = {}
        if transactional_id is not None:
            txn = {"transactional_id": transactional_id, "transaction_timeout_ms": transaction_timeout_ms}
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=client_id or "sluice-processor",
            acks="all",
            linger_ms=5,
            max_request_size=MAX_REQUEST_BYTES,
            **txn,
            **ClientSecurity.from_env().kafka_options(),
        )
        self._pending: list[asyncio.Future[Any]] = []
        self._starting: asyncio.Future[None] | None = None  # start_in_background
        self.in_transaction = False
        self.transactions_committed = 0
        self.transactions_aborted = 0

    async def _begin(self) -> None:
        if self.transactional_id is not None and not self.in_transaction:
            await self.producer.begin_transaction()
            self.in_transaction = True

    async def commit_transaction(self, offsets: dict[TopicPartition, OffsetAndMetadata], group: str) -> None:
        """Commit the open transaction with ``offsets`` as ``group``'s input offsets (begun here
        when nothing was written since the last commit but there are offsets to commit)."""
        try:
            await self.flush()
            if not self.in_transaction:
                if not offsets:
                    return
                await self._begin()
            if offsets:
                await self.producer.send_offsets_to_transaction(offsets, group)
            await self.producer.commit_transaction()
            self.in_transaction = False
            self.transactions_committed += 1
        except (KafkaError, SourceError) as exc:
            await self.abort()
            if isinstance(exc, MemberFencedError):
                raise PartitionsLostError(f"transaction {self.transactional_id!r} aborted: {exc}") from exc
            raise SourceError(f"transaction {self.transactional_id!r} failed and was aborted: {exc!r}") from exc

    async def abort(self) -> None:
        """Abort the open transaction, if any (best effort: a fenced producer cannot, and then the
        broker aborts it when its successor starts or it times out)."""
        if not self.in_transaction:
            return
        self.in_transaction = False
        self.transactions_aborted += 1
        self._pending = []
        try:
            await self.producer.abort_transaction()
        except Exception as exc:  # best effort: the broker aborts it anyway
            log.warning("cannot abort transaction; the broker aborts it on timeout or when the instance restarts",
                        extra={"transactional_id": self.transactional_id, "error": repr(exc)})

    async def start(self) -> None:
        try:
            await self.producer.start()
        except KafkaError as exc:
            await self.producer.stop()
            raise SourceError(f"cannot connect producer to {self.bootstrap}: {exc}") from exc

    def start_in_background(self, topics: list[str]) -> None:
        """``start`` and ``track(topics)`` while the caller goes on (a standalone stage's consumer joins
        its group meanwhile: their round trips overlap); ``ready`` waits for them and raises their error."""
        async def start_and_track() -> None:
            await self.start()
            await self.track(topics)

        self._starting = asyncio.ensure_future(start_and_track())
        # not lost when nobody waits: ready() raises it, and stop() ends a start still in flight
        self._starting.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def ready(self) -> None:
        """Wait for ``start_in_background`` (nothing to wait for after ``start``). Exactly-once, the
        checkpoint load waits here: the producer's InitProducerId has fenced this instance's predecessor
        and aborted the transaction it left open before any checkpoint is read."""
        if self._starting is not None:
            await asyncio.shield(self._starting)  # an awaiter cancelled (a rebalance) does not cancel the start

    async def track(self, topics: list[str]) -> None:
        """Have the producer keep metadata for every topic it will write. aiokafka's producer tracks no
        topic until its first send to one created after it started; from then on each metadata refresh
        asks for that topic alone and replaces what it knew, so batches queued for the other output
        topics lose their leader until they fail (NotLeaderForPartitionError)."""
        try:
            for topic in topics:
                await self.producer.partitions_for(topic)
        except KafkaError as exc:
            raise SourceError(f"cannot read metadata of the output topics {topics}: {exc}") from exc

    async def stop(self) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._starting
        await self.producer.stop()

    async def write(self, records: list[OutRecord]) -> None:
        """Records with a partition go in batches built here, one future per batch: ``send`` costs a
        future and a partitioner call per record. An ``OutBatch`` (a repartition topic's records,
        encoded by the stage) is sent as the one RecordBatch it is."""
        try:
            await self._begin()
            producer = self.producer
            batches: dict[tuple[str, int], Any] = {}
            transactional = self.transactional_id is not None
            for r in records:
                if type(r) is OutBatch:
                    assert r.partition is not None
                    self._pending.append(await producer.send_batch(_PreparedBuilder(r, transactional), r.topic,
                                                                   partition=r.partition))
                    continue
                if r.partition is None:
                    self._pending.append(await producer.send(
                        r.topic, r.value, key=r.key, headers=list(r.headers), timestamp_ms=r.timestamp))
                    continue
                where = (r.topic, r.partition)
                batch = batches.get(where)
                if batch is None:
                    batch = batches[where] = producer.create_batch()
                if batch.append(key=r.key, value=r.value, timestamp=r.timestamp, headers=list(r.headers)) is None:
                    if batch.record_count():  # full: send it, start the next
                        self._pending.append(await producer.send_batch(batch, r.topic, partition=r.partition))
                        batch = batches[where] = producer.create_batch()
                    if batch.append(key=r.key, value=r.value, timestamp=r.timestamp, headers=list(r.headers)) is None:
                        self._pending.append(await producer.send(  # larger than a batch on its own
                            r.topic, r.value, key=r.key, partition=r.partition, headers=list(r.headers),
                            timestamp_ms=r.timestamp))
            for (topic, partition), batch in batches.items():
                if batch.record_count():
                    self._pending.append(await producer.send_batch(batch, topic, partition=partition))
            if len(self._pending) > 10_000:
                await self.flush()
        except KafkaError as exc:
            raise SourceError(f"cannot produce results: {exc}") from exc

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            await asyncio.gather(*pending)
        except KafkaError as exc:
            raise SourceError(f"results were not acknowledged: {exc}") from exc

    async def send_in_order(self, topic: str, records: list[CheckpointRecord]) -> None:
        """Send keyed records to partition 0 of ``topic`` in this order and wait for all of them."""
        await self._begin()
        futures = [await self.producer.send(topic, value, key=key, partition=0) for key, value in records]
        await asyncio.gather(*futures)


# Compacted; 1 MiB segments so the cleaner (which never touches the active segment) reaches all but the
# newest MiB, and cleans once a tenth of it is dirty: the topic stays near one checkpoint per partition.
CHECKPOINT_TOPIC_CONFIGS = {"cleanup.policy": "compact", "max.message.bytes": str(MAX_CHECKPOINT_BYTES),
                            "segment.bytes": str(1024 * 1024), "min.cleanable.dirty.ratio": "0.1"}


class KafkaCheckpointStore:
    def __init__(self, bootstrap: str, pipeline: str, sink: KafkaSink) -> None:
        self.bootstrap = bootstrap
        self.topic = checkpoint_topic(pipeline)
        self.sink = sink
        self.codec = CheckpointCodec()
        self._topic_ready = False
        self._creating: asyncio.Future[None] | None = None  # created in the background since load found none

    async def _ensure_topic(self) -> None:
        """Create the checkpoint topic compacted before the first write (auto-creation would make it
        ``delete``): restores read the newest record per key, which is exactly what compaction keeps."""
        if self._topic_ready:
            return
        if self._creating is not None:
            creating, self._creating = self._creating, None
            with contextlib.suppress(CheckpointError, KafkaError):  # it failed: create it again below
                await creating
            if self._topic_ready:
                return
        await self._create_topic()

    def _create_in_background(self) -> None:
        """Start creating the topic now (a first run's load found none), so that the first checkpoint
        does not wait for an admin client; ``_ensure_topic`` waits for it, or creates it again."""
        if self._topic_ready or self._creating is not None:
            return
        self._creating = asyncio.ensure_future(self._create_topic())
        # its failure is not lost: _ensure_topic creates the topic again and raises its own error then
        self._creating.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _create_topic(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **ClientSecurity.from_env().kafka_options())
        try:
            await admin.start()
            response = await admin.create_topics([NewTopic(self.topic, 1, 1, topic_configs=CHECKPOINT_TOPIC_CONFIGS)])
        finally:
            await admin.close()
        for _name, code, *rest in getattr(response, "topic_errors", []):
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                raise CheckpointError(f"cannot create {self.topic} (error {code}): {rest[0] if rest else ''}")
        self._topic_ready = True

    async def save(self, records: list[CheckpointRecord]) -> None:
        try:
            await self._ensure_topic()
            await self.sink.send_in_order(self.topic, records)
        except KafkaError as exc:
            raise CheckpointError(f"cannot write {self.topic}: {exc}") from exc

    async def _stable_end(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
        """The checkpoint log's end once no transaction is open in it. Read_committed reads stop at the
        last stable offset: while another instance's transaction with checkpoint records is open (an
        instance killed between writing its checkpoint and committing it), checkpoints committed after
        that transaction began (this instance's own revoke checkpoint among them) are invisible, and
        restoring without them would take an older state (seen: keys lost in a kill -9 rebalance). A
        live instance keeps checkpoint records open for milliseconds; a dead one's transaction ends
        when it restarts (fenced) or the broker aborts it at its timeout, so wait that long at most."""
        probe = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                 isolation_level="read_uncommitted")
        await probe.start()
        try:
            deadline = asyncio.get_running_loop().time() + self.sink.transaction_timeout_ms / 1000 + 10
            warned = False
            while True:
                stable = (await consumer.end_offsets([tp]))[tp]
                high = (await probe.end_offsets([tp]))[tp]
                if stable >= high:
                    return int(stable)
                if asyncio.get_running_loop().time() > deadline:
                    raise CheckpointError(f"{self.topic} keeps a transaction open (stable offset {stable}, "
                                          f"end {high}) beyond the transaction timeout")
                if not warned:
                    warned = True
                    log.warning("waiting for an open transaction in the checkpoint topic to end before restoring",
                                extra={"topic": self.topic, "stable_offset": stable, "end_offset": high})
                await asyncio.sleep(0.1)
        finally:
            await probe.stop()

    async def _topic_exists(self) -> bool:
        """From the producer's connection: no consumer (connection, metadata) for a first run's load."""
        await self.sink.ready()  # exactly-once: the predecessor's open transaction is aborted first
        try:
            metadata = await self.sink.producer.client.fetch_all_metadata()
        except KafkaError as exc:
            raise CheckpointError(f"cannot read {self.topic}: {exc}") from exc
        return self.topic in metadata.topics()

    async def load(self, tps: Collection[TP] | None = None) -> dict[TP, PartitionRestore]:
        if not await self._topic_exists():  # nothing to restore: the first checkpoint will need the topic
            self._create_in_background()
            return {}
        self._topic_ready = True  # created by an earlier run (or instance): no admin client at the first save
        # read_committed: a checkpoint written in an aborted transaction (exactly-once) never restores
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                    isolation_level="read_committed", fetch_max_bytes=MAX_REQUEST_BYTES,
                                    max_partition_fetch_bytes=MAX_REQUEST_BYTES,
                                    **ClientSecurity.from_env().kafka_options())
        try:
            await consumer.start()
            if self.topic not in await consumer.topics():
                return {}
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            start = (await consumer.beginning_offsets([tp]))[tp]
            end = await self._stable_end(consumer, tp)

            async def read(lo: int, hi: int) -> list[CheckpointRecord]:
                consumer.seek(tp, lo)
                values: list[CheckpointRecord] = []
                while await consumer.position(tp) < hi:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    values.extend((m.key or b"", m.value) for m in batch.get(tp, []) if m.offset < hi)
                return values

            return await load_from_tail(read, start, end, tps, self.codec)
        except KafkaError as exc:
            raise CheckpointError(f"cannot read {self.topic}: {exc}") from exc
        finally:
            await consumer.stop()
