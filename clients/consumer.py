"""``AsyncConsumer``: read topics over the Kafka protocol, alone or as a member of a consumer group.

Commit strategies (``commit=``):
- ``"auto"``   — offsets of records handed out are committed in the background every
  ``auto_commit_interval_ms`` (simple; a crash can replay up to one interval).
- ``"batch"``  — when the application asks for the next batch (or the next record after a batch), the
  previous batch's offsets are committed first: at-least-once, nothing skipped.
- ``"manual"`` — nothing is committed unless the application calls ``commit()``.

Without ``group_id`` the consumer reads every partition of its topics, commits nothing, and can
``seek`` at once; in a group, partitions arrive through rebalances (``wait_for_assignment``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP

from clients._kafka import DEFAULT_BOOTSTRAP, partitions_for, translate_errors
from clients.errors import ClientClosedError, SerializationError, UnknownTopicError
from clients.records import ConsumerRecord, TopicPartition
from clients.security import ClientSecurity
from clients.serializers import SerializerSpec, resolve_serializer

__all__ = ["AsyncConsumer", "CommitStrategy"]

CommitStrategy = Literal["auto", "batch", "manual"]


class _Listener(ConsumerRebalanceListener):
    def __init__(self, assigned: asyncio.Event) -> None:
        self.assigned = assigned

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.assigned.clear()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.assigned.set()


class AsyncConsumer:
    def __init__(
        self,
        *topics: str,
        bootstrap: str = DEFAULT_BOOTSTRAP,
        group_id: str | None = None,
        value_deserializer: SerializerSpec = "json",
        key_deserializer: SerializerSpec = "string",
        start: Literal["earliest", "latest"] = "earliest",
        commit: CommitStrategy = "batch",
        auto_commit_interval_ms: int = 1000,
        max_batch: int = 500,
        fetch_max_wait_ms: int = 200,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        client_id: str = "sluice-python",
    ) -> None:
        if not topics:
            raise ValueError("give at least one topic")
        self.topics = topics
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.commit_strategy: CommitStrategy = commit if group_id is not None else "manual"
        self.value_deserializer = resolve_serializer(value_deserializer)
        self.key_deserializer = resolve_serializer(key_deserializer)
        self.max_batch = max_batch
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            auto_offset_reset=start,
            enable_auto_commit=group_id is not None and commit == "auto",
            auto_commit_interval_ms=auto_commit_interval_ms,
            fetch_max_wait_ms=fetch_max_wait_ms,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            client_id=client_id,
            **ClientSecurity.from_env().kafka_options(),
        )
        self._assigned = asyncio.Event()
        self._pending_commit = False
        self._buffer: list[ConsumerRecord[Any]] = []
        self._started = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise ClientClosedError("consumer is closed")
        with translate_errors(self.bootstrap):
            try:
                await self._consumer.start()
                if self.group_id is None:
                    await self._assign_all()
                else:
                    self._consumer.subscribe(list(self.topics), listener=_Listener(self._assigned))
            except BaseException:
                await self._consumer.stop()
                raise
        self._started = True

    async def _assign_all(self) -> None:
        tps: list[KafkaTP] = []
        for topic in self.topics:
            parts = await partitions_for(self._consumer, topic)
            if not parts:
                raise UnknownTopicError(f"unknown topic {topic!r}: create it first (sluice topics create {topic})")
            tps.extend(KafkaTP(topic, p) for p in sorted(parts))
        self._consumer.assign(tps)
        self._assigned.set()

    async def stop(self) -> None:
        if self._started and not self._closed:
            self._closed = True
            try:
                if self._pending_commit:
                    await self.commit()
            finally:
                await self._consumer.stop()
        self._closed = True

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- reading ------------------------------------------------------------------------------

    def _convert(self, rec: Any) -> ConsumerRecord[Any]:
        try:
            key = self.key_deserializer.deserialize(rec.key)
            value = self.value_deserializer.deserialize(rec.value)
        except SerializationError as exc:
            raise SerializationError(f"{rec.topic}-{rec.partition}@{rec.offset}: {exc}") from exc
        headers = tuple((k, bytes(v) if v is not None else b"") for k, v in (rec.headers or ()))
        return ConsumerRecord(rec.topic, rec.partition, rec.offset, rec.timestamp, key, value, headers)

    async def getmany(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord[Any]]:
        """The next batch (possibly empty after ``timeout_ms``), across assigned partitions."""
        self._check_open()
        if self._pending_commit:
            await self.commit()
        with translate_errors(self.bootstrap):
            batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records or self.max_batch)
        out = [self._convert(r) for records in batches.values() for r in records]
        if out and self.commit_strategy == "batch":
            self._pending_commit = True
        return out

    async def getone(self, timeout_ms: int | None = None) -> ConsumerRecord[Any] | None:
        """The next record; None if ``timeout_ms`` passes first."""
        while not self._buffer:
            batch = await self.getmany(timeout_ms=timeout_ms if timeout_ms is not None else 1000)
            if batch:
                self._buffer = batch
            elif timeout_ms is not None:
                return None
        return self._buffer.pop(0)

    def __aiter__(self) -> AsyncIterator[ConsumerRecord[Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConsumerRecord[Any]]:
        while not self._closed:
            for record in await self.getmany(timeout_ms=1000):
                yield record

    # -- offsets ------------------------------------------------------------------------------

    async def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (next offset to read, per partition), or the positions handed out so far."""
        if self.group_id is None:
            self._pending_commit = False
            return
        with translate_errors(self.bootstrap):
            if offsets is None:
                await self._consumer.commit()
            else:
                await self._consumer.commit({KafkaTP(tp.topic, tp.partition): off for tp, off in offsets.items()})
        self._pending_commit = False

    async def committed(self, tp: TopicPartition) -> int | None:
        with translate_errors(self.bootstrap):
            result = await self._consumer.committed(KafkaTP(*tp))
        return None if result is None else int(result)

    async def position(self, tp: TopicPartition) -> int:
        with translate_errors(self.bootstrap):
            return int(await self._consumer.position(KafkaTP(*tp)))

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    async def wait_for_assignment(self, timeout: float = 30.0) -> set[TopicPartition]:
        """Wait until the group gave this member partitions (returns at once without a group)."""
        self._check_open()
        # aiokafka's coordinator task joins the group in the background; the listener flags the assignment.
        with translate_errors(self.bootstrap):
            await asyncio.wait_for(self._assigned.wait(), timeout)
        return self.assignment()

    async def _assigned_partitions(self) -> set[TopicPartition]:
        """This member's partitions; in a group that has not assigned any yet, after the first rebalance.

        What the ``seek_*`` and ``end_offsets`` calls act on when given no partitions: right after
        ``async with AsyncConsumer(..., group_id=...)`` the group has not answered yet, and acting on the
        empty assignment would silently do nothing."""
        if self.group_id is not None and not self._assigned.is_set():
            return await self.wait_for_assignment()
        return self.assignment()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._buffer = [r for r in self._buffer if r.tp != tp]
        self._consumer.seek(KafkaTP(*tp), offset)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        """Move to the first offset of ``tps`` (default: every assigned partition, waiting for them in a group)."""
        targets = tps or await self._assigned_partitions()
        self._buffer.clear()
        await self._consumer.seek_to_beginning(*(KafkaTP(*tp) for tp in targets))

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        """Move past the last record of ``tps`` (default: every assigned partition, waiting for them in a group)."""
        targets = tps or await self._assigned_partitions()
        self._buffer.clear()
        await self._consumer.seek_to_end(*(KafkaTP(*tp) for tp in targets))

    async def seek_to_timestamp(self, timestamp_ms: int, tps: Iterable[TopicPartition] | None = None) -> None:
        """Move to the first record at or after ``timestamp_ms`` (the end where there is none); default: every
        assigned partition, waiting for them in a group."""
        targets = [KafkaTP(*tp) for tp in (tps if tps is not None else await self._assigned_partitions())]
        with translate_errors(self.bootstrap):
            found = await self._consumer.offsets_for_times({tp: timestamp_ms for tp in targets})
            ends = await self._consumer.end_offsets(targets)
        self._buffer.clear()
        for tp in targets:
            hit = found.get(tp)
            self._consumer.seek(tp, hit.offset if hit is not None else ends[tp])

    async def end_offsets(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        targets = [KafkaTP(*tp) for tp in (tps if tps is not None else await self._assigned_partitions())]
        with translate_errors(self.bootstrap):
            ends = await self._consumer.end_offsets(targets)
        return {TopicPartition(tp.topic, tp.partition): int(off) for tp, off in ends.items()}

    def pause(self, *tps: TopicPartition) -> None:
        """Stop fetching from these partitions (others go on) until ``resume``."""
        self._consumer.pause(*(KafkaTP(*tp) for tp in tps or self.assignment()))
        self._buffer = [r for r in self._buffer if r.tp not in set(tps or self.assignment())]

    def resume(self, *tps: TopicPartition) -> None:
        self._consumer.resume(*(KafkaTP(*tp) for tp in tps or self.assignment()))

    def paused(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self._consumer.paused()}

    def _check_open(self) -> None:
        if self._closed or not self._started:
            raise ClientClosedError("consumer is not started (use `async with AsyncConsumer(...)`)")
