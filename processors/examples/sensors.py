"""The lectures' sensor example.

Input: JSON readings ``{"sensor": "sensor_3", "temp": 71.2, "ts": <ms>}`` keyed by sensor id.

* per-sensor mean temperature over 10 s tumbling windows, 5 s out-of-orderness, 5 s allowed
  lateness (updates re-emitted with ``sluice-emit: update``; later records to the late topic);
* an alert when a reading is more than 1.1× the previous reading of the same sensor (a keyed
  process function with value state).

Topic names come from the environment: ``SENSORS_INPUT`` (sensors), ``SENSORS_OUTPUT``
(sensor-avg), ``SENSORS_LATE`` (sensor-late), ``SENSORS_ALERTS`` (sensor-alerts),
``SENSORS_GROUP`` (sensor-avg). Run it attached with
``sluice serve --processor processors.examples.sensors:pipeline`` or standalone with
``sluice process processors.examples.sensors:pipeline --bootstrap localhost:9092``.
"""

from __future__ import annotations

import os
from typing import Any

from processors.aggregations import Mean
from processors.operators import KeyedProcessFunction, ProcessContext
from processors.pipeline import Pipeline
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness
from processors.windows import Tumbling

__all__ = ["JumpAlert", "build", "pipeline"]


class JumpAlert(KeyedProcessFunction):
    """Alert when a reading exceeds ``ratio`` × the previous reading of the same sensor."""

    def __init__(self, ratio: float = 1.1) -> None:
        self.ratio = ratio

    def process(self, value: Any, ctx: ProcessContext) -> None:
        last = ctx.value("last")
        previous = last.get()
        temp = value["temp"]
        if previous is not None and previous > 0 and temp > self.ratio * previous:
            ctx.emit({"sensor": ctx.key, "ts": ctx.timestamp, "temp": temp, "previous": previous,
                      "ratio": round(temp / previous, 4)})
        last.set(temp)


def build(env: dict[str, str] | None = None) -> Pipeline:
    env = dict(os.environ) if env is None else env
    stream = Pipeline.source(
        env.get("SENSORS_INPUT", "sensors"),
        group=env.get("SENSORS_GROUP", "sensor-avg"),
        event_time=lambda v: v["ts"],
        watermarks=BoundedOutOfOrderness(5_000, idle_timeout=30_000),
        all_idle=AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(after=0),
    )
    # the input is keyed by sensor id (as ingest keys readings), so no repartition topic is needed
    by_sensor = stream.key_by(lambda v: v["sensor"], repartition=False)
    (by_sensor.window(Tumbling(10_000), allowed_lateness=5_000, late_topic=env.get("SENSORS_LATE", "sensor-late"))
        .aggregate(Mean("temp"))
        .sink(env.get("SENSORS_OUTPUT", "sensor-avg")))
    by_sensor.process(JumpAlert(1.1)).sink(env.get("SENSORS_ALERTS", "sensor-alerts"))
    return stream.pipeline


pipeline = build()
