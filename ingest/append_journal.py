"""Telling a source where the sink is about to append its records, before the append happens.

A source that must resume exactly after a crash (the file source: ``ingest/file/``) has to know, for the
read that was in flight, which of its records reached the log. The sink's appends assign offsets and
write without yielding to the event loop (``PartitionLog.append_nowait``), so the offset a batch will
get is the partition's log end offset just before; a source that saves "batch of lines L at offset B of
topic-partition P" durably *before* the append can look at P after a restart: a batch of its own at B
means the lines are stored, none means they are not (a torn batch does not survive recovery).

The source sets ``APPEND_JOURNAL`` (a context variable, so only its own calls and the tasks they start
see it) around its ``IngestSink`` call; the sink calls ``journal_appends`` right before each append that
call makes, with no await in between. Each entry: (topic, partition, base offset, owners), owners being
the indexes, in the lines or messages of the call, of the batch's records in order (a dead-letter batch
included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar

from broker.errors import BrokerError
from broker.log.api import LogStore

__all__ = ["APPEND_JOURNAL", "AppendEntry", "journal_appends"]

AppendEntry = tuple[str, int, int, list[int]]  # topic, partition, base offset, owners
APPEND_JOURNAL: ContextVar[Callable[[list[AppendEntry]], None] | None] = ContextVar("append_journal", default=None)


def journal_appends(store: LogStore, batches: Sequence[tuple[str, int, Sequence[int]]]) -> None:
    """Tell the current journal (if any) about these (topic, partition, owners) batches, appended next in
    this order with nothing written in between; the base offset of each is worked out here."""
    journal = APPEND_JOURNAL.get()
    if journal is None or not batches:
        return
    ends: dict[tuple[str, int], int] = {}
    entries: list[AppendEntry] = []
    for topic, partition, owners in batches:
        slot = (topic, partition)
        base = ends.get(slot)
        if base is None:
            try:
                base = store.partition(topic, partition).log_end_offset
            except BrokerError:  # the append will fail the same way: an offset no batch has
                base = -1
        ends[slot] = base + len(owners)
        entries.append((topic, partition, base, list(owners)))
    journal(entries)
