"""Child process for the create-under-kill test: creates wide topics in a loop, writing one record to
one partition of each, and reports each topic on stdout once ``create_topic`` has returned.

Run as ``python -m tests.broker.log.create_child <data dir> <run>``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from broker.log.segment import SegmentLogStore
from broker.protocol.records import RecordSpec

PARTITIONS = 300


async def main(root: Path, run: int) -> None:
    store = SegmentLogStore(root, checkpoint_interval_s=0.05)
    await store.start()
    os.write(1, b"ready\n")
    i = 0
    while True:
        name = f"c{run}-{i}"
        store.create_topic(name, PARTITIONS)
        os.write(1, f"{name}\n".encode())
        await store.append_records(name, [RecordSpec(name.encode())], partition=i % PARTITIONS)
        i += 1


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
