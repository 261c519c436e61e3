"""Repartition topics do not grow forever: what the downstream stage has committed is deleted.

Kafka Streams purges its repartition topics with DeleteRecords up to the offsets its task committed
(``StreamTask.purgeableOffsets``, ``TaskManager.maybePurgeCommittedRecords``); Sluice does the same
after each successful commit of the downstream stage (``processors.repartition``): its consumer group
is the only reader of the topic, and a committed offset is never read again by it. Under
exactly-once the commit is the transaction's (the offsets are in it), under at-least-once the
group's; a commit lost to a rebalance purges nothing. The restore reads the checkpoint, whose
positions are the committed offsets, so nothing below them is needed after a crash either.

Only offsets that moved are sent, one DeleteRecords request per commit (commits come once per
checkpoint interval). A failure (the broker refused, the ACLs deny DELETE on the topic, a network
error) is logged once per kind and counted; it costs disk, not correctness, and the next commit
tries again.
"""

from __future__ import annotations

import logging

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.errors import KafkaError

from clients.security import ClientSecurity

__all__ = ["RepartitionPurger"]

log = logging.getLogger("processors.purge")


class RepartitionPurger:
    """Deletes the records of repartition partitions below the offsets committed for them."""

    def __init__(self, bootstrap: str, topics: frozenset[str], *, client_id: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.client_id = client_id
        self.purged: dict[tuple[str, int], int] = {}  # the log start offset each partition has reached
        self.failures = 0
        self._admin: AIOKafkaAdminClient | None = None
        self._last_error = ""

    async def purge(self, committed: dict[tuple[str, int], int]) -> None:
        """After a commit: delete what lies below ``committed`` in the repartition partitions."""
        wanted = {tp: offset for tp, offset in committed.items()
                  if tp[0] in self.topics and offset > self.purged.get(tp, 0)}
        if not wanted:
            return
        try:
            if self._admin is None:
                self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap,
                                                  client_id=self.client_id or "sluice-processor-purge",
                                                  **ClientSecurity.from_env().kafka_options())
                await self._admin.start()
            low = await self._admin.delete_records(
                {TopicPartition(*tp): RecordsToDelete(offset) for tp, offset in wanted.items()})
        except KafkaError as exc:
            self.failures += 1
            problem = type(exc).__name__
            if problem != self._last_error:
                self._last_error = problem
                log.warning("cannot delete consumed repartition records; they stay until retention removes them, "
                            "and the next commit tries again",
                            extra={"partitions": sorted(wanted), "error": repr(exc), "failures": self.failures})
            return
        self._last_error = ""
        for tp, start in low.items():
            self.purged[(tp.topic, tp.partition)] = int(start)

    async def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await admin.close()
