"""Stream processors: pipelines, event-time watermarks, windows, state, checkpoints and runners.

Modules: ``pipeline`` (the API), ``operators`` / ``windows`` / ``triggers`` / ``aggregations``
(operator configs and per-key logic), ``watermarks`` and ``time`` (progress, injected clocks),
``state`` (keyed state), ``checkpoint``, ``executor`` (synchronous core), ``runner`` (async,
bounded queues), ``sources`` and ``kafka`` (attached log / Kafka-protocol adapters), ``runners``
(attached component, standalone entry point), ``skew`` (Lossy Counting, two-phase aggregation),
``testing`` (fake clock, in-memory source/sink, harness).

Errors (``processors.errors``)::

    ProcessorError
    ├── PipelineDefinitionError   the user built an invalid pipeline
    ├── StateError                keyed state misuse or unserializable state
    ├── CheckpointError           a checkpoint cannot be written, read or decoded
    └── SourceError               the log or Kafka cluster under a source or sink failed
"""

from processors.aggregations import Aggregate, Count, Max, Mean, Min, Reduce, Sum
from processors.errors import (
    CheckpointError,
    PipelineDefinitionError,
    ProcessorError,
    SourceError,
    StateError,
)
from processors.operators import Emit, KeyedProcessFunction, ProcessContext
from processors.pipeline import KeyedStream, Pipeline, Stream, WindowedStream
from processors.triggers import CountTrigger, EarlyEvery, OnWatermark
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness, WatermarkAlignment
from processors.windows import LateRecord, Session, Sliding, Tumbling, WindowResult

__all__ = [
    "Aggregate",
    "AllIdlePolicy",
    "BoundedOutOfOrderness",
    "CheckpointError",
    "Count",
    "CountTrigger",
    "EarlyEvery",
    "Emit",
    "KeyedProcessFunction",
    "KeyedStream",
    "LateRecord",
    "Max",
    "Mean",
    "Min",
    "OnWatermark",
    "PipelineDefinitionError",
    "Pipeline",
    "ProcessContext",
    "ProcessorError",
    "Reduce",
    "Session",
    "Sliding",
    "SourceError",
    "StateError",
    "Stream",
    "Sum",
    "Tumbling",
    "WatermarkAlignment",
    "WindowResult",
    "WindowedStream",
]
