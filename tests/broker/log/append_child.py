"""Child process for the kill -9 test: appends with flush=always and reports every acknowledgement.

Run as ``python -m tests.broker.log.append_child <data dir> <run>``. Each acknowledged append is
written to stdout as one line ``<partition> <offset> <value>`` (a single ``write``, so a SIGKILL can
never leave half a line) *after* ``append`` returned, i.e. after its fsync. Odd runs reserve disk
blocks ahead of each segment's end (``preallocate_bytes``), so a kill leaves reserved space past the
data and the next run reopens such files, with and without preallocation.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from broker.log.config import FlushPolicy, TopicConfig
from broker.log.segment import SegmentLogStore
from broker.protocol.records import RecordSpec

WRITERS = 8


async def main(root: Path, run: int) -> None:
    store = SegmentLogStore(root, checkpoint_interval_s=0.05, preallocate_bytes=64 * 1024 if run % 2 else 0)
    await store.start()
    if not store.has_topic("k"):
        store.create_topic("k", 2, TopicConfig(flush=FlushPolicy.ALWAYS, segment_bytes=16 * 1024,
                                               index_interval_bytes=1024))
    os.write(1, b"ready\n")

    async def writer(w: int) -> None:
        i = 0
        while True:
            value = f"{run}-{w}-{i}-".encode() + b"v" * (i * 37 % 300)
            p = (w + i) % 2
            result = await store.append_records("k", [RecordSpec(value)], partition=p)
            os.write(1, f"{p} {result.base_offset} {value.decode()}\n".encode())
            i += 1

    await asyncio.gather(*(writer(w) for w in range(WRITERS)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
