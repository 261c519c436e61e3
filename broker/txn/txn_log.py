"""The durable transaction log: Sluice's own compacted internal topic ``__transaction_state``.

Two kinds of records, both latest-per-key (so compaction keeps exactly what a restart needs):
- key ``t:<transactional id>`` → the id's ``TxnMetadata`` (a tombstone once the id expires);
- key ``a:<json [topic, partition, marker offset]>`` → ``[first offset, producer id]``: an aborted
  transaction that ``read_committed`` consumers of that partition must be told about (a tombstone
  once the partition's log start has passed it, or its topic is deleted).

Every write waits until it is durable (the topic is created with ``flush.messages=1``) before the
coordinator acts on it, so a state the coordinator answered with survives ``kill -9``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from broker.log.api import LogStore
from broker.log.keyed import keyed_records
from broker.log.partition_log import PartitionLog
from broker.protocol.records import RecordSpec, encode_batch
from broker.txn.metadata import TxnMetadata
from broker.txn.partitions import AbortedTxn

__all__ = ["TXN_TOPIC", "LoadedState", "TxnLog"]

log = logging.getLogger("broker.txn")

TXN_TOPIC = "__transaction_state"


@dataclass(slots=True)
class LoadedState:
    transactions: dict[str, TxnMetadata]
    aborted: list[tuple[str, int, AbortedTxn]]


def _txn_key(transactional_id: str) -> bytes:
    return b"t:" + transactional_id.encode()


def _aborted_key(topic: str, partition: int, entry: AbortedTxn) -> bytes:
    return b"a:" + json.dumps([topic, partition, entry.last_offset]).encode()


class TxnLog:
    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._log: PartitionLog | None = None

    def _partition(self) -> PartitionLog:
        if self._log is None:
            if not self._store.has_topic(TXN_TOPIC):
                config = self._store.default_config.with_kafka_configs(
                    {"cleanup.policy": "compact", "flush.messages": "1"})
                self._store.create_topic(TXN_TOPIC, 1, config, internal=True)
            self._log = self._store.partition(TXN_TOPIC, 0)
        return self._log

    def load(self) -> LoadedState:
        """Replay the whole topic (latest value per key wins); nothing if it was never written."""
        if not self._store.has_topic(TXN_TOPIC):
            return LoadedState({}, [])
        latest = dict(keyed_records(self._partition()))
        transactions: dict[str, TxnMetadata] = {}
        aborted: list[tuple[str, int, AbortedTxn]] = []
        for key, value in latest.items():
            if value is None:
                continue
            try:
                if key.startswith(b"t:"):
                    txn_id = key[2:].decode()
                    transactions[txn_id] = TxnMetadata.from_bytes(txn_id, value)
                elif key.startswith(b"a:"):
                    topic, partition, last = json.loads(key[2:])
                    first, producer_id = json.loads(value)
                    aborted.append((str(topic), int(partition), AbortedTxn(int(last), int(first), int(producer_id))))
            except (ValueError, TypeError, UnicodeDecodeError) as exc:
                log.warning("skipping an unreadable transaction-log record",
                            extra={"key": key[:80].decode("utf-8", "replace"), "error": str(exc)})
        return LoadedState(transactions, aborted)

    async def write(self, states: Sequence[TxnMetadata] = (), *, expired: Sequence[str] = (),
                    aborted: Sequence[tuple[str, int, AbortedTxn]] = (),
                    forget_aborted: Sequence[tuple[str, int, AbortedTxn]] = ()) -> None:
        """Append the changes in one batch and return once it is durable (raises StorageError)."""
        records = [RecordSpec(key=_txn_key(md.transactional_id), value=md.to_bytes()) for md in states]
        records += [RecordSpec(key=_txn_key(txn_id), value=None) for txn_id in expired]
        records += [RecordSpec(key=_aborted_key(t, p, e), value=json.dumps([e.first_offset, e.producer_id]).encode())
                    for t, p, e in aborted]
        records += [RecordSpec(key=_aborted_key(t, p, e), value=None) for t, p, e in forget_aborted]
        if records:
            await self._partition().append(encode_batch(records))
