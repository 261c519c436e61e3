"""Pipelines that tests load by reference (``--processor tests.processors.pipelines:…``)."""

from __future__ import annotations

import os

from processors.aggregations import Mean
from processors.pipeline import Pipeline
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness
from processors.windows import Tumbling

__all__ = ["passthrough", "quick_idle", "rekeyed"]


def quick_idle() -> Pipeline:
    """The sensor example's windows, with a 2 s idle timeout: a partition without data stops holding
    time back after 2 s, and when all are idle the wall clock closes the last windows."""
    stream = Pipeline.source(os.environ["SENSORS_INPUT"], group=os.environ["SENSORS_GROUP"],
                             event_time=lambda v: v["ts"], watermarks=BoundedOutOfOrderness(5_000, idle_timeout=2_000),
                             all_idle=AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(after=0))
    (stream.key_by(lambda v: v["sensor"])
        .window(Tumbling(10_000), allowed_lateness=5_000, late_topic=os.environ["SENSORS_LATE"])
        .aggregate(Mean("temp")).sink(os.environ["SENSORS_OUTPUT"]))
    return stream.pipeline


def rekeyed() -> Pipeline:
    """Readings spread over the input partitions by anything but the sensor, keyed by sensor in the
    pipeline: the key_by repartitions (standalone). No idle timeout: windows close on data and
    punctuations only, so the results do not depend on timing."""
    stream = Pipeline.source(os.environ["SENSORS_INPUT"], group=os.environ["SENSORS_GROUP"],
                             event_time=lambda v: v["ts"], watermarks=BoundedOutOfOrderness(5_000),
                             all_idle=AllIdlePolicy.HOLD)
    (stream.key_by(lambda v: v["sensor"], repartition=os.environ.get("SENSORS_REPARTITION") != "no")
        .window(Tumbling(10_000)).aggregate(Mean("temp")).sink(os.environ["SENSORS_OUTPUT"]))
    return stream.pipeline


def passthrough() -> Pipeline:
    """Every input value to the output topic as it is: what the pipeline read, in order."""
    stream = Pipeline.source(os.environ["PASS_INPUT"], group=os.environ["PASS_GROUP"])
    stream.map(lambda v: v).sink(os.environ["PASS_OUTPUT"])
    return stream.pipeline
