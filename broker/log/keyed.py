"""A partition read from its start as keyed records: how internal compacted topics are replayed.

The transaction log (``__transaction_state``) and the MQTT journals (``__mqtt_sessions``,
``__mqtt_retained``) keep their state as the latest value per key; on start each replays its partition
through ``keyed_records`` and keeps the last value it sees for a key (a tombstone's value is None).
"""

from __future__ import annotations

from collections.abc import Iterator

from broker.log.partition_log import PartitionLog
from broker.protocol.records import decode_records, split_complete_batches

__all__ = ["keyed_records"]

_READ_CHUNK = 1 << 20


def keyed_records(plog: PartitionLog) -> Iterator[tuple[bytes, bytes | None]]:
    """``(key, value)`` of every keyed record from the log start to the high watermark, in log order;
    records without a key and control batches are skipped."""
    offset = plog.log_start_offset
    while offset < plog.high_watermark:
        data = plog.read(offset, _READ_CHUNK)
        headers, _ = split_complete_batches(data)
        if not headers:
            return
        view, pos = memoryview(data), 0
        for header in headers:
            if not header.is_control:
                for record in decode_records(view[pos:pos + header.size], header):
                    if record.key is not None:
                        yield record.key, record.value
            pos += header.size
            offset = header.last_offset + 1
