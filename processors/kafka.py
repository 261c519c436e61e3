"""Standalone mode over the Kafka protocol (aiokafka): a consumer-group member, a producer,
and checkpoints in a Kafka topic. Works against Sluice's Kafka listener or any Kafka cluster.

* ``KafkaSource``: ``AIOKafkaConsumer`` subscribed with ``group_id = pipeline name``, auto-commit
  off. On assignment the runner restores the newest checkpoint of each partition and seeks there;
  on revocation it writes a checkpoint of the revoked partitions first. Offsets are committed
  right after each stored checkpoint, so group offsets and checkpoints agree.
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

Zombie fencing (KIP-447, ``processors.txn_offsets``): the transaction's offsets carry the consumer's
generation and member id, so the group refuses them from a member it has removed (a stall past the
session timeout) whose partitions another member has restored from their last committed checkpoint;
the refusal aborts the transaction (``PartitionsLostError``). A member whose consumer finds itself
out of the group (a heartbeat answered UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION: no generation left)
reports its partitions lost rather than revoked, so the runner aborts instead of committing them
(Kafka's ``onPartitionsLost``; Kafka Streams closes such tasks dirty).

A commit that loses a race with a rebalance (aiokafka's ``CommitFailedError``, raised for
REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID) is not fatal, as in Kafka's own
clients (Kafka Streams treats it as "task migrated"): the checkpoint is already stored and is what
restores use, the consumer rejoins, and the next commit covers the offsets of the partitions it
still owns. It is logged once per occurrence and counted (``commits_lost``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Collection
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    KafkaError,
    RebalanceInProgressError,
    UnknownMemberIdError,
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
from processors.executor import OutBatch, OutRecord, RecordLike
from processors.executor import TopicPartition as TP
from processors.fastdecode import Fetched, SegmentSpan, StoredRecords
from processors.kafka_records import RawRecords, RawSegment, use_parser_records, use_raw_batches
from processors.purge import RepartitionPurger
from processors.sources import AssignmentListener
from processors.txn_offsets import GroupMember, MemberFencedError, fence_by_group

__all__ = ["KafkaCheckpointStore", "KafkaSink", "KafkaSource"]

MAX_REQUEST_BYTES = 16 * 1024 * 1024
REBALANCE_TIMEOUT_MS = 300_000  # Kafka's max.poll.interval.ms default, which its consumers send
# how aiokafka reports a commit lost to a rebalance (it wraps the three group errors in CommitFailedError)
COMMIT_LOST = (CommitFailedError, RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError)

_TOPIC_ALREADY_EXISTS = 36
log = logging.getLogger("processors.kafka")


class _Listener(ConsumerRebalanceListener):
    def __init__(self, source: KafkaSource, on_assigned: AssignmentListener, on_revoked: AssignmentListener,
                 on_lost: AssignmentListener | None) -> None:
        self.source = source
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_lost = on_lost

    async def on_partitions_revoked(self, revoked: Any) -> None:
        tps = sorted((tp.topic, tp.partition) for tp in revoked)
        # aiokafka calls this before every rejoin; without a generation the member was out of the
        # group (Java's ConsumerCoordinator.onJoinPrepare makes the same test for onPartitionsLost)
        if self.on_lost is not None and tps and self.source.member(self.source.group) is None:
            await self.on_lost(tps)
        else:
            await self.on_revoked(tps)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        # aiokafka stops its heartbeat task for the whole rejoin, this callback included (Kafka's
        # consumers heartbeat from their own thread meanwhile): an assignment whose checkpoints took
        # longer than the session timeout to restore (a loaded host, 2 s sessions) had the group remove
        # the member just after giving it the partitions; it lost them (an abort), and its rejoin started
        # another rebalance. The member heartbeats here until the callback is done.
        heartbeats = asyncio.create_task(self.source.heartbeat_while_assigning())
        try:
            await self.on_assigned(sorted((tp.topic, tp.partition) for tp in assigned))
        finally:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats


class KafkaSource:
    def __init__(self, bootstrap: str, topics: tuple[str, ...], group: str, *, client_id: str | None = None,
                 session_timeout_ms: int = 10_000, transactions: KafkaSink | None = None,
                 purger: RepartitionPurger | None = None, raw_batches: bool = False,
                 stored_records: bool = False) -> None:
        self.bootstrap = bootstrap
        # fetched batches handed out as byte ranges (processors.kafka_records.RawRecords), for an executor
        # that reads them where they lie: a repartition topic's downstream stage (repartition.ShuffleReader),
        # or (stored_records) as the runner's StoredRecords, whose JSON values Executor.process_stored
        # reads in place: no record object per record, none queued for the garbage collector
        self.raw_batches = raw_batches or stored_records
        self.stored_records = stored_records
        self.transactions = transactions  # exactly-once: offsets commit with the sink's transaction
        self.purger = purger  # a downstream stage: its repartition records are deleted once committed
        self.session_timeout_ms = session_timeout_ms
        self.topics = topics
        self.group = group
        self.client_id = client_id
        self.consumer: Any = None
        self._paused: set[TP] = set()
        self.commits_lost = 0

    async def start(self, on_assigned: AssignmentListener, on_revoked: AssignmentListener,
                    on_lost: AssignmentListener | None = None) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            client_id=self.client_id or f"sluice-processor-{self.group}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=1024 * 1024,
            session_timeout_ms=self.session_timeout_ms,
            # How long the group waits for members to rejoin (their revoke checkpoint and commit run
            # first). aiokafka's default is the session timeout: a revoke slower than that (a loaded
            # host, 2 s sessions) had the member removed at the rebalance deadline, its partitions lost,
            # and restoring them started the next rebalance. Kafka's consumers send max.poll.interval.ms
            # (5 min); a member that dies mid-rebalance is still removed at its session timeout.
            rebalance_timeout_ms=max(REBALANCE_TIMEOUT_MS, self.session_timeout_ms),
            heartbeat_interval_ms=max(self.session_timeout_ms // 6, 100),
            isolation_level="read_committed" if self.transactions is not None else "read_uncommitted",
            **ClientSecurity.from_env().kafka_options(),
        )
        exactly_once = self.transactions is not None
        listener = _Listener(self, on_assigned, on_revoked, on_lost if exactly_once else None)
        self.consumer.subscribe(list(self.topics), listener=listener)
        if self.transactions is not None:  # its offsets name this consumer's generation and member
            fence_by_group(self.transactions.producer, self.member)
        try:
            await self.consumer.start()
        except KafkaError as exc:
            await self.consumer.stop()
            raise SourceError(f"cannot join group {self.group!r} at {self.bootstrap}: {exc}") from exc
        # records without ConsumerRecord objects (processors.kafka_records)
        (use_raw_batches if self.raw_batches else use_parser_records)(self.consumer)

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.purger is not None:
            await self.purger.close()

    async def heartbeat_while_assigning(self) -> None:
        """Heartbeat as aiokafka's heartbeat task does, which is stopped during an assignment's callback;
        until cancelled, or until the member is out of the group (its rejoin follows the callback)."""
        coordinator = self.consumer._coordinator  # aiokafka's GroupCoordinator
        interval = getattr(coordinator, "_heartbeat_interval_ms", self.session_timeout_ms // 6) / 1000
        while self.member(self.group) is not None:
            await asyncio.sleep(interval)
            try:
                await coordinator._do_heartbeat()  # its answers handled as the heartbeat task's are
            except KafkaError:  # not expected (authorization): the heartbeat task meets it again after
                return

    def seek(self, tp: TP, offset: int) -> None:
        self.consumer.seek(TopicPartition(*tp), offset)

    def member(self, group: str) -> GroupMember | None:
        """This consumer as a member of ``group`` (Kafka's ``consumer.groupMetadata()``), None when it
        has no generation: not joined yet, or found out of the group and rejoining."""
        coordinator = getattr(self.consumer, "_coordinator", None)  # aiokafka's GroupCoordinator
        generation = getattr(coordinator, "generation", -1)
        member_id = getattr(coordinator, "member_id", "")
        if group != self.group or generation is None or generation < 0 or not member_id:
            return None
        return GroupMember(int(generation), str(member_id))

    def end_offset(self, tp: TP) -> int | None:
        if self.consumer is None:
            return None
        hw = self.consumer.highwater(TopicPartition(*tp))
        return int(hw) if hw is not None else None

    async def commit(self, offsets: dict[TP, int]) -> None:
        assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        chosen = {TopicPartition(*tp): OffsetAndMetadata(off, "") for tp, off in offsets.items() if tp in assigned}
        if self.transactions is not None:
            try:
                await self.transactions.commit_transaction(chosen, self.group)
            except PartitionsLostError:
                self.consumer._coordinator.request_rejoin()  # its next assignment restores what is left
                raise
            await self._purge(chosen)
            return
        if not chosen:
            return
        try:
            await self.consumer.commit(chosen)
            await self._purge(chosen)
        except COMMIT_LOST as exc:
            # A rebalance raced the commit: the checkpoint is stored, which is what restores use,
            # and the next commit covers the partitions this member still owns after rejoining.
            self.commits_lost += 1
            cause = exc.__cause__ or exc
            log.warning("offset commit lost to a group rebalance; the stored checkpoint covers it",
                        extra={"group": self.group, "error": type(cause).__name__,
                               "partitions": sorted(offsets), "commits_lost": self.commits_lost})
        except KafkaError as exc:
            raise SourceError(f"commit failed for group {self.group!r}: {exc}") from exc

    async def _purge(self, committed: dict[TopicPartition, OffsetAndMetadata]) -> None:
        if self.purger is not None and committed:
            await self.purger.purge({(tp.topic, tp.partition): meta.offset for tp, meta in committed.items()})

    async def fetch(self, max_records: int, timeout: float, paused: set[TP]) -> list[tuple[TP, Fetched]]:
        if paused != self._paused:
            assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
            to_pause = [TopicPartition(*tp) for tp in paused - self._paused if tp in assigned]
            to_resume = [TopicPartition(*tp) for tp in self._paused - paused if tp in assigned]
            if to_pause:
                self.consumer.pause(*to_pause)
            if to_resume:
                self.consumer.resume(*to_resume)
            self._paused = set(paused)
        try:
            data = await self.consumer.getmany(timeout_ms=int(timeout * 1000), max_records=max_records)
        except KafkaError as exc:
            raise SourceError(f"fetch failed: {exc}") from exc
        # getmany's lists are fresh per call, and its records (the C parser's, see use_parser_records, or
        # ConsumerRecord) have every attribute a processor reads
        if self.stored_records:
            return [((tp.topic, tp.partition), _stored(messages) if type(messages) is RawRecords else messages)
                    for tp, messages in data.items() if messages]
        return [((tp.topic, tp.partition), messages) for tp, messages in data.items() if messages]


def _stored(records: RawRecords) -> StoredRecords:
    """A fetched partition's ``RawRecords`` as the runner's ``StoredRecords`` (segments read in place)."""
    parts: list[SegmentSpan | list[RecordLike]] = [
        SegmentSpan(part) if isinstance(part, RawSegment) else part for part in records.parts]
    head, tail = records.parts[0], records.parts[-1]
    first = head.offset if isinstance(head, RawSegment) else head[0].offset
    after = tail.offset + tail.count if isinstance(tail, RawSegment) else tail[-1].offset + 1
    return StoredRecords(list(parts), first, after, len(records))


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
