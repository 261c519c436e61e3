"""``AsyncAdmin``: topics, groups and lag over the Kafka protocol (works against Sluice or a Kafka cluster)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import for_code

from clients._kafka import DEFAULT_BOOTSTRAP, partitions_for, translate_errors
from clients.errors import UnknownGroupError, UnknownTopicError
from clients.records import PartitionLag, TopicPartition
from clients.security import ClientSecurity

__all__ = ["AsyncAdmin", "GroupDescription", "GroupMember", "PartitionInfo", "TopicDescription"]


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    start_offset: int
    end_offset: int

    @property
    def records(self) -> int:
        return self.end_offset - self.start_offset


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: list[PartitionInfo]
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    client_id: str
    client_host: str
    assignment: dict[str, list[int]]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[GroupMember]


def _assignment(data: bytes) -> dict[str, list[int]]:
    """ConsumerProtocolAssignment: version int16, [topic string, [partition int32]], user_data."""
    out: dict[str, list[int]] = {}
    if len(data) < 6:
        return out
    pos = 2
    (count,) = struct.unpack_from(">i", data, pos)
    pos += 4
    for _ in range(max(count, 0)):
        (nlen,) = struct.unpack_from(">h", data, pos)
        topic = data[pos + 2 : pos + 2 + nlen].decode()
        pos += 2 + nlen
        (pcount,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out[topic] = sorted(struct.unpack_from(f">{max(pcount, 0)}i", data, pos))
        pos += 4 * max(pcount, 0)
    return out


class AsyncAdmin:
    def __init__(
        self, bootstrap: str = DEFAULT_BOOTSTRAP, *, client_id: str = "sluice-admin", request_timeout_ms: int = 10_000
    ) -> None:
        self.bootstrap = bootstrap
        security = ClientSecurity.from_env().kafka_options()
        self._admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, client_id=client_id, request_timeout_ms=request_timeout_ms, **security
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            enable_auto_commit=False,
            request_timeout_ms=request_timeout_ms,
            **security,
        )
        self._started = False

    async def start(self) -> None:
        with translate_errors(self.bootstrap):
            try:
                await self._admin.start()
                await self._consumer.start()
            except BaseException:
                await self.close()
                raise
        self._started = True

    async def close(self) -> None:
        await self._consumer.stop()
        await self._admin.close()

    async def __aenter__(self) -> AsyncAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- topics -------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        with translate_errors(self.bootstrap, name):
            resp = await self._admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config or {})])
        for topic_error in getattr(resp, "topic_errors", []):
            _name, code, *rest = topic_error
            if code:
                message = rest[0] if rest and rest[0] else ""
                with translate_errors(self.bootstrap, name):
                    raise for_code(code)(message or name)

    async def delete_topic(self, name: str) -> None:
        with translate_errors(self.bootstrap, name):
            resp = await self._admin.delete_topics([name])
        for _name, code, *_rest in getattr(resp, "topic_error_codes", []):
            if code:
                with translate_errors(self.bootstrap, name):
                    raise for_code(code)(name)

    async def list_topics(self, *, internal: bool = False) -> list[str]:
        with translate_errors(self.bootstrap):
            names = await self._admin.list_topics()
        return sorted(n for n in names if internal or not n.startswith("__"))

    async def partitions(self, topic: str) -> list[int]:
        with translate_errors(self.bootstrap, topic):
            parts = await partitions_for(self._consumer, topic)
        if not parts:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        return parts

    async def describe_topic(self, topic: str) -> TopicDescription:
        tps = [KafkaTP(topic, p) for p in await self.partitions(topic)]
        with translate_errors(self.bootstrap, topic):
            starts = await self._consumer.beginning_offsets(tps)
            ends = await self._consumer.end_offsets(tps)
            config: dict[str, str] = {}
            try:
                responses = await self._admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
                for resp in responses:
                    for resource in resp.resources:
                        for entry in resource[4]:
                            config[str(entry[0])] = str(entry[1])
            except Exception:  # configs are informative; a broker without DescribeConfigs still describes
                config = {}
        parts = [PartitionInfo(tp.partition, int(starts[tp]), int(ends[tp])) for tp in tps]
        return TopicDescription(topic, parts, config)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        with translate_errors(self.bootstrap):
            ends = await self._consumer.end_offsets([KafkaTP(*tp) for tp in tps])
        return {TopicPartition(tp.topic, tp.partition): int(o) for tp, o in ends.items()}

    async def timestamp_at(self, tp: TopicPartition, offset: int) -> int | None:
        """Timestamp of the record at ``offset`` (None if it is gone or not written yet)."""
        ktp = KafkaTP(*tp)
        self._consumer.assign([ktp])
        self._consumer.seek(ktp, offset)
        with translate_errors(self.bootstrap):
            batch = await self._consumer.getmany(ktp, timeout_ms=2000, max_records=1)
        records = batch.get(ktp, [])
        return records[0].timestamp if records and records[0].offset == offset else None

    # -- groups -------------------------------------------------------------------------------

    async def list_groups(self) -> list[str]:
        with translate_errors(self.bootstrap):
            rows = await self._admin.list_consumer_groups()
        return sorted(str(row[0]) for row in rows)

    async def describe_group(self, group_id: str) -> GroupDescription:
        with translate_errors(self.bootstrap, group_id):
            responses = await self._admin.describe_consumer_groups([group_id])
        for resp in responses:
            for g in resp.groups:
                code, gid, state, protocol_type, protocol, members = g[0], g[1], g[2], g[3], g[4], g[5]
                if gid != group_id:
                    continue
                if code:
                    with translate_errors(self.bootstrap, group_id):
                        raise for_code(code)(group_id)
                if state == "Dead":
                    raise UnknownGroupError(f"unknown group {group_id!r}: no members and no committed offsets")
                out = [
                    GroupMember(
                        str(m[0]),
                        str(m[-4]),
                        str(m[-3]),
                        _assignment(bytes(m[-1])) if protocol_type == "consumer" else {},
                    )
                    for m in members
                ]
                return GroupDescription(gid, state, protocol_type, protocol, out)
        raise UnknownGroupError(f"unknown group {group_id!r}")

    async def committed_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        with translate_errors(self.bootstrap, group_id):
            offsets = await self._admin.list_consumer_group_offsets(group_id)
        return {TopicPartition(tp.topic, tp.partition): int(om.offset) for tp, om in offsets.items() if om.offset >= 0}

    async def group_lag(self, group_id: str, extra: list[TopicPartition] | None = None) -> list[PartitionLag]:
        """Offset lag per partition the group committed on (plus ``extra`` partitions, e.g. its assignment)."""
        committed = await self.committed_offsets(group_id)
        tps = sorted(set(committed) | set(extra or []))
        ends = await self.end_offsets(tps) if tps else {}
        return [
            PartitionLag(tp.topic, tp.partition, committed.get(tp), ends[tp], max(ends[tp] - committed.get(tp, 0), 0))
            for tp in tps
        ]

    async def event_time_lag_ms(self, lag: PartitionLag) -> int | None:
        """Event time of the newest record minus that of the last committed one."""
        if lag.lag == 0:
            return 0
        tp = TopicPartition(lag.topic, lag.partition)
        newest = await self.timestamp_at(tp, lag.end_offset - 1)
        last = await self.timestamp_at(tp, max((lag.committed or 0) - 1, 0))
        if newest is None or last is None:
            return None
        return max(newest - last, 0)

    async def raw(self) -> Any:
        """The underlying aiokafka admin client (escape hatch)."""
        return self._admin
