"""Kafka transactions on one node: the coordinator (a sans-IO state machine in ``machine`` and its
I/O in ``coordinator``), its durable log (``txn_log``: the compacted internal topic
``__transaction_state``), the markers that end a transaction in each partition (``markers``), and the
last-stable-offset / aborted-transaction bookkeeping that ``read_committed`` Fetch reads
(``partitions``). Errors are ``broker.errors`` ones (the broker package's single root).
"""

from broker.txn.coordinator import TransactionCoordinator, TxnSettings
from broker.txn.metadata import TxnMetadata, TxnState
from broker.txn.txn_log import TXN_TOPIC

__all__ = ["TXN_TOPIC", "TransactionCoordinator", "TxnMetadata", "TxnSettings", "TxnState"]
