"""The consumer side of standalone mode (``processors.kafka`` has the overview, the producer and the
checkpoint store): ``KafkaSource``, the pipeline's member of its consumer group (``AIOKafkaConsumer``),
and the rebalance listener that hands its assignments, revocations and losses to the runner.

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
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    KafkaError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from aiokafka.structs import OffsetAndMetadata

from clients.security import ClientSecurity
from processors.errors import PartitionsLostError, SourceError
from processors.executor import RecordLike
from processors.executor import TopicPartition as TP
from processors.fastdecode import Fetched, SegmentSpan, StoredRecords
from processors.kafka import KafkaSink
from processors.kafka_records import RawRecords, RawSegment, use_parser_records, use_raw_batches
from processors.purge import RepartitionPurger
from processors.sources import AssignmentListener
from processors.txn_offsets import GroupMember, fence_by_group

__all__ = ["KafkaSource"]

REBALANCE_TIMEOUT_MS = 300_000  # Kafka's max.poll.interval.ms default, which its consumers send
# how aiokafka reports a commit lost to a rebalance (it wraps the three group errors in CommitFailedError)
COMMIT_LOST = (CommitFailedError, RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError)

log = logging.getLogger("processors.kafka")  # the standalone mode's logger, shared with kafka.py


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
