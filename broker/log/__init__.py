"""Partitioned append-only logs: the ``LogStore`` interface and its two implementations."""

from broker.log.api import LogStore, TopicInfo
from broker.log.config import FlushPolicy, TopicConfig, validate_topic_name
from broker.log.memory import MemoryLogStore
from broker.log.partition_log import AppendResult, PartitionLog
from broker.log.partitioner import murmur2, partition_for_key
from broker.log.segment import SegmentLogStore, SegmentPartitionLog

__all__ = [
    "AppendResult",
    "FlushPolicy",
    "LogStore",
    "MemoryLogStore",
    "PartitionLog",
    "SegmentLogStore",
    "SegmentPartitionLog",
    "TopicConfig",
    "TopicInfo",
    "murmur2",
    "partition_for_key",
    "validate_topic_name",
]
