"""A Faust (faust-streaming) app, written as its docs show, run unmodified against Sluice by the tests:
a windowed table of 10-second tumbling windows per sensor (count and sum of temperatures), keyed by
the message key and windowed by the message timestamp (``relative_to_stream``), its changelog in
Kafka; every update of a window goes to ``faust-windows``.

Run as ``python -m tests.broker.server.apps.faust_windows worker`` with ``SLUICE_BOOTSTRAP`` set.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import faust

app = faust.App("faust-windows", broker=f"kafka://{os.environ['SLUICE_BOOTSTRAP']}", store="memory://",
                topic_partitions=1, web_enabled=False, consumer_auto_offset_reset="earliest")
readings = app.topic("faust-readings", key_type=str, value_serializer="json")
results = app.topic("faust-windows", key_type=str, value_serializer="json")
totals = app.Table("faust-totals", default=lambda: None, partitions=1).tumbling(
    10.0, expires=timedelta(hours=1)).relative_to_stream()


@app.agent(readings)
async def aggregate(stream: Any) -> None:
    async for event in stream.events():
        key, reading = event.key, event.value
        previous = totals[key].value()
        count, total = previous if previous else (0, 0.0)
        totals[key] = (count + 1, total + reading["temp"])
        start = reading["ts"] - reading["ts"] % 10_000
        await results.send(key=key, value={"start": start, "count": count + 1, "sum": total + reading["temp"]})


if __name__ == "__main__":
    app.main()
