"""A Quix Streams app, written as its docs show, run unmodified against Sluice by the tests:
10-second tumbling windows per sensor (count and sum of temperatures, event time from the payload),
stateful with changelog topics, final results to ``quix-windows``.

Run as ``python -m tests.broker.server.apps.quix_windows <bootstrap> <state dir> [at-least-once|exactly-once]``.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any, Literal

from quixstreams import Application

GUARANTEES: dict[str, Literal["at-least-once", "exactly-once"]] = {
    "at-least-once": "at-least-once", "exactly-once": "exactly-once"}


def event_time(value: Any, headers: Any, timestamp: float, timestamp_type: Any) -> int:
    return int(value["ts"])


def main(bootstrap: str, state_dir: str, guarantee: str = "at-least-once") -> None:
    # session.timeout.ms: an instance killed with SIGKILL (test_stream_apps_eos) loses its partitions to
    # the restarted one after 6 s instead of librdkafka's 45 s, which the test spent waiting.
    app = Application(broker_address=bootstrap, consumer_group="quix-windows", auto_offset_reset="earliest",
                      state_dir=state_dir, commit_interval=0.5, processing_guarantee=GUARANTEES[guarantee],
                      consumer_extra_config={"session.timeout.ms": 6000})
    readings = app.topic("quix-readings", value_deserializer="json", key_deserializer="str",
                         timestamp_extractor=event_time)
    results = app.topic("quix-windows", value_serializer="json", key_serializer="str")
    sdf = app.dataframe(readings)
    sdf = sdf.tumbling_window(timedelta(seconds=10)).reduce(
        reducer=lambda agg, row: {"count": agg["count"] + 1, "sum": agg["sum"] + row["temp"]},
        initializer=lambda row: {"count": 1, "sum": row["temp"]},
    ).final()
    sdf.to_topic(results)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:4])
