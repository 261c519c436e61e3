"""``python -m bench.fuzz.group_restarts --inputs N --seed S --rounds R``: hostile consumer-group requests, then
a restart of ``sluice serve`` on the same data: the group metadata store (``broker/groups/group_records.py``,
read back at start) under hostile state.

Each round sends ``--inputs`` group requests over raw Kafka sockets (one socket per would-be member, answers
collected as they come: a JoinGroup waits for its rebalance): JoinGroup v0-5 with hostile group ids, client
ids (invalid UTF-8, up to 32 KiB), group instance ids, protocol types and names, subscription metadata (up
to 1 MiB) and timeouts; SyncGroup v0-3 with assignments for unknown, repeated and real members; Heartbeat,
LeaveGroup v0-3 (batches), OffsetCommit v2-7 (hostile topics, partitions, offsets, metadata past Kafka's
4096 bytes), DeleteGroups, DescribeGroups and ListGroups v0-4 (random state filters). A *bystander* group
commits offsets once, with confluent-kafka, before the first round. Then the broker is stopped (SIGKILL
or SIGTERM, alternately) with requests still in flight, and started again on its data directory.

After each restart: it must start; the bystander's offsets must read back (confluent-kafka ``committed``);
ListGroups v4 and DescribeGroups must answer for every group the broker lists; a real consumer group
(confluent-kafka) must join, consume and commit; the broker log must hold no ERROR/CRITICAL record or
traceback. Exit code 1 on a finding. ``bench/fuzz/restarts.py`` does the same for MQTT's durable state.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import select
import socket
import struct
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from bench.fuzz.harness import BrokerProcess, restart_on_same_data
from broker.protocol.kafka import ApiKey, RequestHeader, encode_request, is_flexible
from broker.protocol.kafka.codec import decode_response_body

__all__ = ["GroupClient", "hostile_requests", "main"]

BYSTANDER = "bystander"
BYSTANDER_TOPIC = "bystander-t"
GROUPS = ("g-fuzz", "", "\u00e9\u4e2d", "g" * 300, "ctx\x00nul", BYSTANDER + "-not")
_SURVIVES = 30.0  # seconds a restarted broker gets to answer


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def _text(rng: random.Random) -> str:
    return rng.choice(("", "x", "consumer", "range", "roundrobin", "\u00e9" * rng.randrange(1, 40), "\U0001f600",
                       "a" * rng.choice((1, 255, 5000, 32_000)), "\ufffd", "-", "connect", str(uuid.uuid4())))


def _blob(rng: random.Random) -> bytes:
    return rng.choice((b"", b"\x00", rng.randbytes(rng.randrange(1, 200)), b"\xff" * rng.choice((4, 4096)),
                       rng.randbytes(rng.choice((70_000, 1 << 20)))))


def _client_id(rng: random.Random) -> str | None:
    return rng.choice((None, "", "fuzz", "c" * rng.choice((100, 32_767)), "\u00e9" * 1000, "x\x00y"))


class GroupClient:
    """One Kafka connection; requests sent at once, answers read as they arrive (in order, as Kafka answers)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.sock.setblocking(False)
        self.pending: deque[tuple[int, int, int]] = deque()  # (correlation id, api key, version)
        self.buffer = b""
        self.corr = 0
        self.member_ids: list[str] = []
        self.generation = -1
        self.closed = False

    def send(self, key: int, version: int, body: dict[str, Any], client_id: str | None) -> None:
        self.corr += 1
        frame = encode_request(RequestHeader(key, version, self.corr, client_id, is_flexible(key, version)), body)
        try:
            self.sock.setblocking(True)
            self.sock.sendall(frame)
            self.sock.setblocking(False)
            self.pending.append((self.corr, key, version))
        except OSError:
            self.close()

    def read(self) -> list[tuple[int, int, Any]]:
        """Answers that arrived: (api key, version, body); remembers member ids and generations."""
        if self.closed:
            return []
        try:
            while chunk := self.sock.recv(1 << 20):
                self.buffer += chunk
            self.close()  # the broker closed the connection (a request it refused)
        except BlockingIOError:
            pass
        except OSError:
            self.close()
        answers = []
        while len(self.buffer) >= 4 and self.pending:
            (size,) = struct.unpack(">i", self.buffer[:4])
            if len(self.buffer) < 4 + size:
                break
            frame, self.buffer = self.buffer[4 : 4 + size], self.buffer[4 + size :]
            corr, key, version = self.pending.popleft()
            got, body = decode_response_body(key, version, frame, is_flexible(key, version))
            if got != corr:
                raise AssertionError(f"answer {got} where {corr} was due (api {key} v{version})")
            if key == ApiKey.JOIN_GROUP and body.member_id:
                self.member_ids.append(body.member_id)
                self.generation = body.generation_id
            answers.append((key, version, body))
        return answers

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()


def hostile_requests(rng: random.Random, client: GroupClient) -> tuple[int, int, dict[str, Any]]:
    """One hostile group request (api key, version, body) for ``client``."""
    group = rng.choice(GROUPS)
    member = rng.choice([*client.member_ids[-3:], "", _text(rng)])
    generation = rng.choice((client.generation, client.generation, -1, 0, 2**31 - 1))
    instance = rng.choice((None, None, "inst-1", "inst-2", _text(rng)))
    roll = rng.random()
    if roll < 0.35:
        protocols = [{"name": rng.choice(("range", "roundrobin", _text(rng))), "metadata": _blob(rng)}
                     for _ in range(rng.choice((0, 1, 1, 2, 5)))]
        body = {"group_id": group, "session_timeout": _ms(rng.choice((6000, 10_000, 1, 10**9))),
                "rebalance_timeout": _ms(rng.choice((-1, 0, 100, 3000))), "member_id": member,
                "group_instance_id": instance, "protocol_type": rng.choice(("consumer", "consumer", "", _text(rng))),
                "protocols": protocols}
        return ApiKey.JOIN_GROUP, rng.randint(0, 5), body
    if roll < 0.55:
        members = [*client.member_ids[-3:], _text(rng), member]
        assignments = [{"member_id": rng.choice(members), "assignment": _blob(rng)}
                       for _ in range(rng.choice((0, 1, 2, 4)))]
        return ApiKey.SYNC_GROUP, rng.randint(0, 3), {"group_id": group, "generation_id": generation,
                                                      "member_id": member, "group_instance_id": instance,
                                                      "assignments": assignments}
    if roll < 0.65:
        return ApiKey.HEARTBEAT, rng.randint(0, 3), {"group_id": group, "generation_id": generation,
                                                     "member_id": member, "group_instance_id": instance}
    if roll < 0.72:
        leaving = [{"member_id": rng.choice([member, ""]), "group_instance_id": rng.choice((None, instance))}
                   for _ in range(rng.choice((0, 1, 3)))]
        return ApiKey.LEAVE_GROUP, rng.randint(0, 3), {"group_id": group, "member_id": member, "members": leaving}
    if roll < 0.87:
        partitions = [{"partition_index": rng.choice((0, 1, -1, 2**31 - 1)),
                       "committed_offset": rng.choice((0, 5, -1, -2, 2**63 - 1)),
                       "committed_leader_epoch": rng.choice((-1, 0, 7)),
                       "commit_timestamp": -1,
                       "committed_metadata": rng.choice((None, "", "m", "x" * rng.choice((4096, 4097, 32_000))))}
                      for _ in range(rng.choice((1, 2, 10)))]
        topics = [{"name": rng.choice(("fuzz", BYSTANDER_TOPIC, _text(rng))), "partitions": partitions}]
        return ApiKey.OFFSET_COMMIT, rng.randint(2, 7), {"group_id": group, "generation_id_or_member_epoch":
                                                         generation, "member_id": member,
                                                         "group_instance_id": instance,
                                                         "retention_time": rng.choice((-1, 0, 1000)),
                                                         "topics": topics}
    if roll < 0.92:
        states = [rng.choice(("Stable", "Empty", "PreparingRebalance", "CompletingRebalance", "Dead", "stable",
                              _text(rng))) for _ in range(rng.choice((0, 1, 3)))]
        return ApiKey.LIST_GROUPS, rng.randint(0, 4), {"states_filter": states}
    if roll < 0.97:
        return ApiKey.DESCRIBE_GROUPS, rng.randint(0, 4), {"groups": [group, _text(rng)],
                                                           "include_authorized_operations": rng.random() < 0.5}
    return ApiKey.DELETE_GROUPS, rng.randint(0, 2), {"groups_names": [rng.choice(GROUPS[2:])]}


def _member_flow(address: tuple[str, int], rng: random.Random) -> tuple[GroupClient, int]:
    """A member that gets through JoinGroup, SyncGroup (as leader) and OffsetCommit with hostile contents,
    so that the broker stores a group record of it; returns the client (left open: the member stays, and
    its record is what the restart reads) and the requests sent."""
    client = GroupClient(address)
    group = rng.choice(GROUPS[:1] + GROUPS[2:])
    client_id = _client_id(rng)
    instance = rng.choice((None, "inst-1", _text(rng)))
    protocols = [{"name": rng.choice(("range", _text(rng))), "metadata": _blob(rng)} for _ in range(rng.randint(1, 3))]
    join = {"group_id": group, "session_timeout": _ms(rng.choice((6000, 30_000))), "rebalance_timeout":
            _ms(rng.choice((100, 1000))), "member_id": "", "group_instance_id": instance,
            "protocol_type": rng.choice(("consumer", "connect", _text(rng))), "protocols": protocols}
    version = rng.randint(0, 5)
    sent = 0
    for _ in range(2):  # v4+: the first join is answered MEMBER_ID_REQUIRED with the member id to use
        client.send(ApiKey.JOIN_GROUP, version, join, client_id)
        sent += 1
        answers = _await(client, 1, limit=10.0)
        if not answers:
            return client, sent
        body = answers[0][2]
        if body.error_code != 79 or not body.member_id:
            break
        join["member_id"] = body.member_id
    if body.error_code != 0:
        return client, sent
    members = [m.member_id for m in body.members]
    assignments = [{"member_id": m, "assignment": _blob(rng)} for m in members]
    if rng.random() < 0.3:
        assignments.append({"member_id": _text(rng), "assignment": _blob(rng)})
    client.send(ApiKey.SYNC_GROUP, rng.randint(0, 3), {"group_id": group, "generation_id": body.generation_id,
                "member_id": body.member_id, "group_instance_id": instance, "assignments": assignments}, client_id)
    sent += 1
    _await(client, 1, limit=10.0)
    metadata = rng.choice((None, "", "m", "x" * rng.choice((4096, 4097))))
    client.send(ApiKey.OFFSET_COMMIT, rng.randint(2, 7), {
        "group_id": group, "generation_id_or_member_epoch": body.generation_id, "member_id": body.member_id,
        "group_instance_id": instance, "retention_time": -1, "topics": [{"name": rng.choice(("fuzz", _text(rng))),
        "partitions": [{"partition_index": 0, "committed_offset": rng.choice((0, 9, 2**63 - 1)),
                        "committed_leader_epoch": -1, "committed_metadata": metadata}]}]}, client_id)
    return client, sent + 1


def _round(broker: BrokerProcess, rng: random.Random, inputs: int) -> list[GroupClient]:
    """Send ``inputs`` hostile requests over up to 12 connections, with now and then a member that gets
    through to a stored group record; returns the connections still open (some waiting)."""
    address = broker.endpoints["kafka"]
    clients = [GroupClient(address) for _ in range(6)]
    members: list[GroupClient] = []
    sent = 0
    while sent < inputs:
        if rng.random() < 0.02:
            member, count = _member_flow(address, rng)
            members.append(member)
            sent += count
            continue
        sent += 1
        if rng.random() < 0.01 or not any(not c.closed for c in clients):
            clients = [c for c in clients if not c.closed][-11:] + [GroupClient(address)]
        client = rng.choice([c for c in clients if not c.closed])
        key, version, body = hostile_requests(rng, client)
        client.send(key, version, body, _client_id(rng))
        ready, _, _ = select.select([c.sock for c in clients if not c.closed], [], [], 0)
        for c in clients:
            if not c.closed and c.sock in ready:
                c.read()
        if len(client.pending) > 50:  # this client waits on a rebalance: let the others go on
            client.close()
    return clients + members


def _bootstrap(broker: BrokerProcess) -> str:
    host, port = broker.endpoints["kafka"]
    return f"{host}:{port}"


def _commit_bystander(broker: BrokerProcess) -> dict[int, int]:
    """Produce to the bystander topic and commit offsets for its group with confluent-kafka."""
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": _bootstrap(broker)})
    admin.create_topics([NewTopic(BYSTANDER_TOPIC, 3, 1)])[BYSTANDER_TOPIC].result(30)
    producer = Producer({"bootstrap.servers": _bootstrap(broker)})
    for i in range(30):
        producer.produce(BYSTANDER_TOPIC, b"v%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    wanted = {0: 3, 1: 7, 2: 10}
    consumer = _consumer(broker, BYSTANDER)
    consumer.commit(offsets=[TopicPartition(BYSTANDER_TOPIC, p, o) for p, o in wanted.items()], asynchronous=False)
    consumer.close()
    return wanted


def _consumer(broker: BrokerProcess, group: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": _bootstrap(broker), "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "session.timeout.ms": 10_000})


def _checks(broker: BrokerProcess, wanted: dict[int, int], round_: int) -> list[str]:
    """What must hold after a restart; the failures, described."""
    from confluent_kafka import TopicPartition

    failures = []
    consumer = _consumer(broker, BYSTANDER)
    try:
        got = consumer.committed([TopicPartition(BYSTANDER_TOPIC, p) for p in wanted], timeout=_SURVIVES)
        offsets = {tp.partition: tp.offset for tp in got}
        if offsets != wanted:
            failures.append(f"bystander offsets {offsets}, committed {wanted}")
    finally:
        consumer.close()
    client = GroupClient(broker.endpoints["kafka"])
    try:
        client.send(ApiKey.LIST_GROUPS, 4, {"states_filter": []}, "check")
        answers = _await(client, 1)
        listed = [g.group_id for g in answers[0][2].groups] if answers else []
        if not answers or answers[0][2].error_code != 0:
            failures.append(f"ListGroups v4 answered {answers!r:.300}")
        if listed:
            client.send(ApiKey.DESCRIBE_GROUPS, 4, {"groups": listed, "include_authorized_operations": False},
                        "check")
            described = _await(client, 1)
            if not described or len(described[0][2].groups) != len(listed):
                failures.append(f"DescribeGroups of {len(listed)} groups answered {described!r:.300}")
    finally:
        client.close()
    # a real consumer group joins, reads and commits after the restart
    group = f"real-{round_}"
    consumer = _consumer(broker, group)
    try:
        consumer.subscribe([BYSTANDER_TOPIC])
        deadline = time.monotonic() + 60
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error():
                message = None
        if message is None:
            failures.append(f"a confluent-kafka consumer in {group} read nothing in 60 s")
        else:
            consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()
    return failures


def _await(client: GroupClient, count: int, limit: float = _SURVIVES) -> list[tuple[int, int, Any]]:
    answers: list[tuple[int, int, Any]] = []
    deadline = time.monotonic() + limit
    while len(answers) < count and not client.closed and time.monotonic() < deadline:
        select.select([client.sock], [], [], 0.2)
        answers += client.read()
    return answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz.group_restarts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=5000, help="group requests per round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="work directory (broker log and data)")
    args = parser.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="sluice-fuzz-groups-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    extra = {"SLUICE_MQTT__ENABLED": "false", "SLUICE_KAFKA__GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}
    broker = BrokerProcess(extra, work)
    broker.start()
    env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0",
           "SLUICE_HTTP__PORT": "0", **extra}
    findings = 0
    try:
        wanted = _commit_bystander(broker)
        for round_ in range(args.rounds):
            clients = _round(broker, rng, args.inputs)
            seconds = restart_on_same_data(broker, env, round_, {"http", "kafka"}, kill=round_ % 2 == 0)
            for c in clients:
                c.close()
            failures = _checks(broker, wanted, round_)
            bad = broker.new_log_findings(final=True)
            findings += len(bad) + len(failures)
            print(f"round {round_}: {args.inputs} requests, restarted in {seconds:.1f} s; failed checks "
                  f"{failures or 'none'}; ERROR lines and tracebacks {len(bad)}", flush=True)
            for record in bad[:5]:
                print(record[:2000], flush=True)
    except RuntimeError as exc:
        findings += 1
        print(f"FINDING: {exc}", flush=True)
    finally:
        broker.stop()
    print(f"{args.rounds} rounds of {args.inputs} requests, seed {args.seed}: {findings} findings; broker log "
          f"{broker.log_path}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
