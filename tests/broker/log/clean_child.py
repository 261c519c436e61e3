"""Child process for the cleaner kill -9 test: opens a data dir, runs one cleaning pass, says "done".

Run as ``python -m tests.broker.log.clean_child <data dir>``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from broker.log.cleaner import LogCleaner
from broker.log.segment import SegmentLogStore


async def main(root: Path) -> None:
    store = SegmentLogStore(root)
    await store.start()
    os.write(1, b"ready\n")
    await LogCleaner(store).clean_once()
    os.write(1, b"done\n")
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
