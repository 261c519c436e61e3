"""The Quix Streams peer of ``bench.bench_processors``: the same keyed 10 s tumbling mean (5 s grace
for the 5 s out-of-orderness) over the same topic on the same Sluice, written as Quix's docs show
(RocksDB state with changelog topics, at-least-once). It stops itself once it has processed
``count`` records and prints the seconds from its start (group join included, as for Sluice's
standalone row) on stdout.

Run: ``python -m bench.quix_mean_app <bootstrap> <input> <output> <group> <state dir> <count>``.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any

from quixstreams import Application

__all__ = ["main"]


def main(bootstrap: str, topic: str, output: str, group: str, state_dir: str, count: int) -> None:
    processed = 0
    app: Application

    def on_processed(topic: str, partition: int, offset: int) -> None:
        nonlocal processed
        processed += 1
        if processed >= count:
            app.stop()

    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
                      state_dir=state_dir, on_message_processed=on_processed, loglevel="WARNING")
    readings = app.topic(topic, value_deserializer="json", key_deserializer="str",
                         timestamp_extractor=lambda value, headers, ts, kind: int(value["ts"]))
    results = app.topic(output, value_serializer="json", key_serializer="str")
    sdf = app.dataframe(readings)
    sdf = sdf.tumbling_window(timedelta(seconds=10), grace_ms=timedelta(seconds=5)).reduce(
        reducer=lambda agg, row: [agg[0] + row["temp"], agg[1] + 1],
        initializer=lambda row: [row["temp"], 1],
    ).final()

    def result(window: dict[str, Any], key: str, timestamp: int, headers: Any) -> dict[str, Any]:
        total, n = window["value"]
        return {"window_start": window["start"], "key": key, "value": total / n}

    sdf = sdf.apply(result, metadata=True)
    sdf.to_topic(results)
    start = time.perf_counter()
    app.run()
    print(time.perf_counter() - start, flush=True)


if __name__ == "__main__":
    bootstrap, topic, output, group, state_dir, count = sys.argv[1:7]
    main(bootstrap, topic, output, group, state_dir, int(count))
