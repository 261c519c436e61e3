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
from aiokafka.protocol.admin import DeleteGroupsRequest
from aiokafka.protocol.commit import OffsetCommitRequest

from clients._kafka import DEFAULT_BOOTSTRAP, partitions_for, translate_errors
from clients._requests import CONFIG_DELETE, CONFIG_SET, IncrementalAlterConfigsRequest
from clients.errors import RequestFailedError, UnknownGroupError, UnknownTopicError
from clients.records import PartitionLag, TopicPartition
from clients.security import ClientSecurity

__all__ = ["AsyncAdmin", "ConfigEntry", "GroupDescription", "GroupMember", "PartitionInfo", "TopicDescription"]

_TOPIC_RESOURCE = 2  # ConfigResource type TOPIC
_UNKNOWN_TOPIC = 3
_NON_EMPTY_GROUP = 68
_GROUP_ID_NOT_FOUND = 69
# DescribeConfigs v1+ config_source: where a value comes from
_CONFIG_SOURCES = {1: "topic", 2: "broker", 3: "broker default", 4: "broker static", 5: "default", 6: "broker"}


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
class ConfigEntry:
    """One config of a resource: ``source`` is ``topic`` for a value set on the topic, ``default`` for the
    built-in one (``broker…`` when a broker setting supplies it)."""

    name: str
    value: str | None
    source: str
    read_only: bool = False
    sensitive: bool = False


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

    async def topic_config(self, topic: str) -> list[ConfigEntry]:
        """Every config of ``topic`` with where its value comes from (DescribeConfigs)."""
        with translate_errors(self.bootstrap, topic):
            responses = await self._admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        out: list[ConfigEntry] = []
        for resp in responses:
            for code, message, _type, _name, entries in resp.resources:
                if code:
                    with translate_errors(self.bootstrap, topic):
                        raise for_code(code)(message or topic)
                for entry in entries:
                    if resp.API_VERSION == 0:  # name, value, read_only, is_default, is_sensitive
                        source = "default" if entry[3] else "topic"
                    else:  # name, value, read_only, config_source, is_sensitive, synonyms
                        source = _CONFIG_SOURCES.get(int(entry[3]), "unknown")
                    out.append(ConfigEntry(str(entry[0]), entry[1], source, bool(entry[2]), bool(entry[4])))
        return sorted(out, key=lambda e: e.name)

    async def alter_topic_config(self, topic: str, set_configs: dict[str, str] | None = None,
                                 delete_configs: list[str] | None = None, *, validate_only: bool = False) -> None:
        """Set and delete single configs of ``topic`` (IncrementalAlterConfigs: the others stay as they are;
        a deleted config falls back to its default)."""
        ops: list[tuple[str, int, str | None]] = [(k, CONFIG_SET, v) for k, v in (set_configs or {}).items()]
        ops += [(k, CONFIG_DELETE, None) for k in delete_configs or []]
        request = IncrementalAlterConfigsRequest([(_TOPIC_RESOURCE, topic, ops)], validate_only)
        with translate_errors(self.bootstrap, topic):
            resp = await self._admin._send_request(request)
        for code, message, _type, _name in resp.responses:
            if code == _UNKNOWN_TOPIC:
                raise UnknownTopicError(f"unknown topic {topic!r}")
            if code:
                error = for_code(code)
                raise RequestFailedError(f"topic {topic!r} configs not changed: {message or error.__name__} "
                                         f"({getattr(error, 'message', code)})")

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        with translate_errors(self.bootstrap):
            starts = await self._consumer.beginning_offsets([KafkaTP(*tp) for tp in tps])
        return {TopicPartition(tp.topic, tp.partition): int(o) for tp, o in starts.items()}

    async def offsets_for_time(self, tps: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        """The first offset whose timestamp is at or after ``timestamp_ms`` (None: no such record)."""
        with translate_errors(self.bootstrap):
            found = await self._consumer.offsets_for_times({KafkaTP(*tp): timestamp_ms for tp in tps})
        return {TopicPartition(tp.topic, tp.partition): None if ot is None else int(ot.offset)
                for tp, ot in found.items()}

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

    async def delete_group(self, group_id: str) -> None:
        """Delete a group with no members and its committed offsets (DeleteGroups to its coordinator)."""
        with translate_errors(self.bootstrap, group_id):
            coordinator = await self._admin.find_coordinator(group_id)
            resp = await self._admin._send_request(DeleteGroupsRequest([group_id]), coordinator)
        for gid, code in resp.results:
            if gid != group_id or not code:
                continue
            if code == _GROUP_ID_NOT_FOUND:
                raise UnknownGroupError(f"unknown group {group_id!r}")
            if code == _NON_EMPTY_GROUP:
                raise RequestFailedError(f"consumer group {group_id!r} still has members (NON_EMPTY_GROUP): "
                                         "stop its consumers first")
            with translate_errors(self.bootstrap, group_id):
                raise for_code(code)(group_id)

    async def commit_group_offsets(self, group_id: str, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` for a group from outside it (generation -1, no member id), as Kafka's
        ``alterConsumerGroupOffsets`` does; the broker refuses it while the group has members."""
        by_topic: dict[str, list[tuple[int, int, str]]] = {}
        for tp, offset in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append((tp.partition, offset, ""))
        request = OffsetCommitRequest(group_id, -1, "", -1, list(by_topic.items()))
        with translate_errors(self.bootstrap, group_id):
            coordinator = await self._admin.find_coordinator(group_id)
            resp = await self._admin._send_request(request, coordinator)
        for topic, partitions in resp.topics:
            for partition, code in partitions:
                if code:
                    with translate_errors(self.bootstrap, group_id):
                        raise for_code(code)(f"group {group_id!r}, {topic}[{partition}]")

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
