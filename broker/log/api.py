"""The narrow storage interface every front door writes through and every reader reads from.

``LogStore`` owns topics; each topic has ``partitions`` ``PartitionLog``s (partition_log.py: appends,
reads, the log end and the high watermark). Two implementations share all of the logic here and in
partition_log.py, and one test suite (``tests/broker/log/test_store_contract.py``):
``MemoryLogStore`` (tests, benchmarks, ``--storage memory``) and ``SegmentLogStore`` (segment files).

Topic changes are all-or-nothing: ``create_topic`` and ``create_partitions`` check every limit first
(``PartitionLimits``), then open the partitions (no disk work for the segment store: a partition's
directory appears with its first write) and save the metadata; if saving fails, the change is undone
and nothing is left behind.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from broker.errors import (
    BrokerError,
    InvalidPartitionsError,
    PolicyViolationError,
    TopicExistsError,
    UnknownTopicError,
)
from broker.log.config import TopicConfig, validate_topic_name
from broker.log.partition_log import AppendResult, PartitionLog
from broker.log.partitioner import StickyPartitioner, partition_for_key
from broker.protocol.records import RecordSpec, encode_batch

__all__ = [
    "MAX_PARTITIONS",
    "LogStore",
    "PartitionLimits",
    "TopicInfo",
]

log = logging.getLogger("broker.log")

MAX_PARTITIONS = 10_000  # Kafka's controller bound on partitions created by one request
EXCESSIVE_PARTITIONS = "Excessively large number of partitions per request."  # Kafka's message


@dataclass(frozen=True, slots=True)
class PartitionLimits:
    """Caps on partitions, checked before anything is created.

    ``per_request``: partitions one request may create (CreateTopics over all its topics,
    CreatePartitions, one HTTP create); above it Kafka's controller answers ``POLICY_VIOLATION``.
    ``total``: partitions the store may hold at once (each costs memory and, when used, descriptors);
    a create that would pass it is refused with ``POLICY_VIOLATION`` too.
    """

    per_request: int = MAX_PARTITIONS
    total: int = 50_000

    def check_request(self, requested: int) -> None:
        """Raise ``PolicyViolationError`` when one request asks for more than ``per_request`` partitions."""
        if requested > self.per_request:
            raise PolicyViolationError(
                f"{EXCESSIVE_PARTITIONS} {requested} requested, the limit (storage.max_partitions_per_request) "
                f"is {self.per_request}"
            )


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    config: TopicConfig
    created_ms: int
    internal: bool = False


class LogStore(ABC):
    """Topics and their partitions. Subclasses decide where bytes and metadata live."""

    def __init__(
        self,
        *,
        default_config: TopicConfig | None = None,
        default_partitions: int = 1,
        auto_create_topics: bool = True,
        limits: PartitionLimits | None = None,
    ) -> None:
        self.default_config = default_config or TopicConfig()
        self.default_partitions = default_partitions
        self.auto_create_topics = auto_create_topics
        self.limits = limits or PartitionLimits()
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[str, list[PartitionLog]] = {}
        self._deleting: set[str] = set()
        self._sticky = StickyPartitioner()
        self._deletion_listeners: list[Callable[[str], None]] = []

    # -- what implementations provide -------------------------------------------------

    @abstractmethod
    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        """A new, empty partition. Should not touch the disk (the segment store creates files on the
        first write): whatever it does is undone by ``_remove_partition_data`` if the create fails."""

    @abstractmethod
    def _persist_topics(self) -> None:
        """Save topic metadata atomically (no-op in memory)."""

    @abstractmethod
    def _remove_partition_data(self, info: TopicInfo, partition: int) -> None: ...

    async def start(self) -> None:  # noqa: B027 - optional hook, a no-op for the memory store
        """Open existing topics (file-backed stores recover here)."""

    # -- topics --------------------------------------------------------------------------

    @property
    def total_partitions(self) -> int:
        return sum(len(logs) for logs in self._partitions.values())

    def validate_create(self, name: str, partitions: int | None = None) -> int:
        """Every check ``create_topic`` makes, without creating (CreateTopics ``validate_only``);
        returns the partition count the topic would get."""
        validate_topic_name(name)
        if name in self._topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        if name in self._deleting:
            raise TopicExistsError(f"topic {name!r} is marked for deletion")
        count = self.default_partitions if partitions is None else partitions
        if count < 1:
            raise InvalidPartitionsError(f"Number of partitions was set to an invalid non-positive value ({count}).")
        self._check_new_partitions(name, count)
        return count

    def _check_new_partitions(self, topic: str, count: int) -> None:
        """The per-request and total caps for ``count`` partitions about to be added to ``topic``."""
        self.limits.check_request(count)
        total = self.total_partitions
        if total + count > self.limits.total:
            raise PolicyViolationError(
                f"adding {count} partitions to {topic!r} would bring the broker to {total + count} "
                f"partitions; the limit (storage.max_partitions) is {self.limits.total}"
            )

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: TopicConfig | None = None,
        *,
        internal: bool = False,
    ) -> TopicInfo:
        """Create a topic, all or nothing: on any failure no trace of it is left, in memory or on disk."""
        count = self.validate_create(name, partitions)
        info = TopicInfo(name, count, config or self.default_config, int(time.time() * 1000), internal)
        logs: list[PartitionLog] = []
        try:
            for p in range(count):
                logs.append(self._open_partition(info, p))
            self._topics[name] = info
            self._partitions[name] = logs
            self._persist_topics()
        except BaseException:
            self._topics.pop(name, None)
            self._partitions.pop(name, None)
            self._undo_partitions(info, logs, range(count))
            raise
        return info

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> TopicInfo:
        """Grow ``name`` to ``total`` partitions, all or nothing (Kafka's CreatePartitions rules)."""
        info = self.topic(name)
        if total < info.partitions:
            raise InvalidPartitionsError(
                f"Topic currently has {info.partitions} partitions, which is higher than the requested {total}."
            )
        if total == info.partitions:
            raise InvalidPartitionsError(f"Topic already has {info.partitions} partitions.")
        self._check_new_partitions(name, total - info.partitions)
        if validate_only:
            return replace(info, partitions=total)
        grown = replace(info, partitions=total)
        logs = self._partitions[name]
        added: list[PartitionLog] = []
        try:
            for p in range(info.partitions, total):
                added.append(self._open_partition(grown, p))
            logs.extend(added)
            self._topics[name] = grown
            self._persist_topics()
        except BaseException:
            del logs[info.partitions :]
            self._topics[name] = info
            self._undo_partitions(grown, added, range(info.partitions, total))
            raise
        return grown

    def _undo_partitions(self, info: TopicInfo, logs: Sequence[PartitionLog], numbers: range) -> None:
        """Best effort cleanup after a failed create: close what was opened, remove what was made."""
        for plog in logs:
            plog.abandon()
        for p in numbers:
            try:
                self._remove_partition_data(info, p)
            except BrokerError as exc:
                log.error("cannot remove a partition of a failed create", extra={
                    "topic": info.name, "partition": p, "error": str(exc)})

    async def alter_topic_config(self, name: str, config: TopicConfig) -> TopicInfo:
        """Change a topic's config in place (retention, segment size, flush policy, ...)."""
        info = replace(self.topic(name), config=config)
        logs = self._partitions[name]
        for plog in logs:
            await plog.reconfigure(config)  # flushes first: a delete may land meanwhile
        if self._partitions.get(name) is not logs:  # deleted (and maybe created again) during the awaits
            raise UnknownTopicError(f"topic {name!r} was deleted while its config was being changed")
        self._topics[name] = info
        self._persist_topics()
        return info

    def ensure_topic(self, name: str) -> TopicInfo:
        """The topic, created with defaults if auto-creation is on."""
        info = self._topics.get(name)
        if info is not None:
            return info
        if not self.auto_create_topics:
            raise UnknownTopicError(f"unknown topic {name!r} (auto-creation is off)")
        return self.create_topic(name)

    async def delete_topic(self, name: str) -> None:
        """Remove a topic: first from memory and the metadata file (so concurrent deletes, appends and
        lookups see it gone at once), then close its partitions and delete their files."""
        info = self.topic(name)
        logs = self._partitions.pop(name)
        del self._topics[name]
        try:
            self._persist_topics()
        except BaseException:
            self._topics[name] = info
            self._partitions[name] = logs
            raise
        for listener in self._deletion_listeners:  # the topic is gone for everyone from here on
            listener(name)
        self._deleting.add(name)
        try:
            for plog in logs:
                try:
                    await plog.close()
                except BrokerError as exc:  # a failed partition: its data is being deleted anyway
                    log.warning("partition of a deleted topic did not close cleanly", extra={
                        "topic": name, "partition": plog.partition, "error": str(exc)})
            for p in range(info.partitions):
                self._remove_partition_data(info, p)
        finally:
            self._deleting.discard(name)

    def subscribe_deletions(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(topic)`` after every topic deletion, whoever asked for it (Kafka, HTTP, CLI),
        so that state kept per topic elsewhere (idempotent-producer sequences) goes with the topic."""
        self._deletion_listeners.append(listener)

    def topic(self, name: str) -> TopicInfo:
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopicError(f"unknown topic {name!r}") from None

    def list_topics(self, *, include_internal: bool = False) -> list[TopicInfo]:
        return [t for t in self._topics.values() if include_internal or not t.internal]

    def has_topic(self, name: str) -> bool:
        return name in self._topics

    def partition(self, topic: str, partition: int) -> PartitionLog:
        logs = self._partitions.get(topic)
        if logs is None:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        if not 0 <= partition < len(logs):
            raise UnknownTopicError(f"topic {topic!r} has no partition {partition} (it has {len(logs)})")
        return logs[partition]

    def partitions(self, topic: str) -> list[PartitionLog]:
        self.topic(topic)
        return list(self._partitions[topic])

    def partition_for(self, topic: str, key: bytes | None) -> int:
        """murmur2 for keyed records (Kafka's choice), round-robin for keyless ones."""
        count = self.topic(topic).partitions
        if key is None:
            return self._sticky.next_partition(count)
        return partition_for_key(key, count)

    # -- appends --------------------------------------------------------------------------

    async def append(self, topic: str, partition: int, batch: bytes | bytearray | memoryview) -> AppendResult:
        return await self.partition(topic, partition).append(batch)

    async def append_records(
        self, topic: str, records: Sequence[RecordSpec], *, key: bytes | None = None, partition: int | None = None
    ) -> AppendResult:
        """Encode ``records`` into one batch and append it; the partition comes from ``key``
        (or the first record's key) unless given. Auto-creates the topic when allowed."""
        self.ensure_topic(topic)
        if partition is None:
            partition = self.partition_for(topic, key if key is not None else records[0].key)
        return await self.append(topic, partition, encode_batch(records))

    def enforce_retention(self, now_ms: int | None = None) -> int:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return sum(plog.enforce_retention(now) for logs in self._partitions.values() for plog in logs)

    async def flush(self) -> None:
        for logs in list(self._partitions.values()):
            for plog in logs:
                await plog.flush()

    async def close(self) -> None:
        for logs in list(self._partitions.values()):
            for plog in logs:
                await plog.close()
