"""DescribeLogDirs: where each partition's log lives and how big it is (``kafka-log-dirs``, admin UIs that
show topic sizes, kafka-python's ``describe_log_dirs``).

As Kafka's ``ReplicaManager.describeLogDirs`` with one log directory: the segment store's root (its
volume's total and usable bytes from the filesystem), or, with ``--storage memory``, the pseudo-directory
``memory`` (volume sizes unknown: -1). Asked for null topics it lists every partition, internal topics
too; asked for some, it lists every topic of the directory with only the partitions asked for (a topic
or partition it does not hold is left out, without an error). ``partition_size`` is the bytes of the
partition's log; ``offset_lag`` the log end offset's lead over the high watermark. With ACLs the request
needs DESCRIBE on the cluster: refused, CLUSTER_AUTHORIZATION_FAILED at the top (v3+) and no results.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from broker.protocol.kafka_codes import ErrorCode
from broker.security import Operation, ResourceType
from broker.server.authz import allowed
from broker.server.handlers_common import BrokerContext, ConnectionInfo

__all__ = ["MEMORY_LOG_DIR", "handle_describe_log_dirs"]

MEMORY_LOG_DIR = "memory"  # what --storage memory reports as its log directory
_UNKNOWN_VOLUME_BYTES = -1


async def handle_describe_log_dirs(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    if not allowed(ctx, conn, Operation.DESCRIBE, ResourceType.CLUSTER):
        return {"throttle_time": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "results": []}
    wanted: dict[str, set[int]] | None = None
    if body.topics is not None:
        wanted = {}
        for t in body.topics:
            wanted.setdefault(str(t.topic), set()).update(int(p) for p in t.partitions)
    topics = []
    for info in ctx.store.list_topics(include_internal=True):
        partitions = [
            {"partition_index": plog.partition, "partition_size": plog.size_bytes,
             "offset_lag": max(0, plog.log_end_offset - plog.high_watermark), "is_future_key": False}
            for plog in ctx.store.partitions(info.name)
            if wanted is None or plog.partition in wanted.get(info.name, ())
        ]
        topics.append({"name": info.name, "partitions": partitions})
    root = getattr(ctx.store, "root", None)
    log_dir, total, usable = MEMORY_LOG_DIR, _UNKNOWN_VOLUME_BYTES, _UNKNOWN_VOLUME_BYTES
    if isinstance(root, Path):
        log_dir = str(root.resolve())
        try:
            usage = shutil.disk_usage(root)
            total, usable = usage.total, usage.free
        except OSError:
            pass  # sizes unknown, as Kafka reports a volume it cannot measure
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "results": [
        {"error_code": ErrorCode.NONE, "log_dir": log_dir, "topics": topics, "total_bytes": total,
         "usable_bytes": usable}]}
