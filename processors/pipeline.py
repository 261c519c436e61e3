"""The pipeline API: a source, a tree of operators, one or more sinks.

::

    stream = Pipeline.source("sensors", group="avg-temp", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(5_000, idle_timeout=30_000))
    (stream.key_by(lambda v: v["sensor"])
           .window(Tumbling(10_000), allowed_lateness=5_000, late_topic="temp-late")
           .aggregate(Mean("temp"))
           .sink("temp-avg"))
    pipeline = stream.pipeline

A stream may feed several operators and several sinks (fan-out). The pipeline only records the
graph (``NodeSpec``s, numbered in definition order so checkpoints find their operators again);
``processors.executor.Executor`` runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from processors.aggregations import Aggregator, Reduce
from processors.errors import PipelineDefinitionError
from processors.operators import (
    Emit,
    FilterConfig,
    FlatMapConfig,
    KeyByConfig,
    MapConfig,
    ProcessConfig,
    ProcessFn,
    ReduceConfig,
    SinkConfig,
)
from processors.time import duration_ms
from processors.triggers import OnWatermark, Trigger
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness, WatermarkAlignment
from processors.windows import WindowConfig, WindowSpec

__all__ = ["KeyedStream", "NodeSpec", "Pipeline", "SourceConfig", "Stream", "WindowedStream"]

Duration = int | timedelta


@dataclass(frozen=True)
class SourceConfig:
    topics: tuple[str, ...]
    group: str
    event_time: Callable[[Any], int] | None = None  # value -> ms; None = the record timestamp
    watermarks: BoundedOutOfOrderness = field(default_factory=lambda: BoundedOutOfOrderness(0, 30_000))
    all_idle: AllIdlePolicy = field(default_factory=AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK)
    alignment: WatermarkAlignment | None = None
    deserializer: str | Callable[[Any], Any] = "json"  # "json", "raw" (the Record) or record -> value
    dead_letter_topic: str = ""


@dataclass(frozen=True)
class NodeSpec:
    id: int
    kind: str  # map | filter | flat_map | key_by | window | process | reduce | sink | custom
    config: Any
    parent: int | None
    keyed: bool = False  # whether the node's output is keyed (ts, key, value)
    late_topic: str | None = None


class Pipeline:
    """A dataflow graph rooted at one source (one or more topics)."""

    def __init__(self, source: SourceConfig) -> None:
        self.source_config = source
        self.nodes: list[NodeSpec] = []

    @property
    def name(self) -> str:
        return self.source_config.group

    @classmethod
    def source(
        cls,
        topic: str | Sequence[str],
        *,
        group: str | None = None,
        event_time: Callable[[Any], int] | None = None,
        watermarks: BoundedOutOfOrderness | None = None,
        all_idle: AllIdlePolicy | None = None,
        alignment: WatermarkAlignment | None = None,
        deserializer: str | Callable[[Any], Any] = "json",
        dead_letter_topic: str | None = None,
    ) -> Stream:
        topics = (topic,) if isinstance(topic, str) else tuple(topic)
        if not topics:
            raise PipelineDefinitionError("a source needs at least one topic")
        group = group or f"{topics[0]}-processor"
        if isinstance(deserializer, str) and deserializer not in ("json", "raw"):
            raise PipelineDefinitionError(f"unknown deserializer {deserializer!r} (json, raw or a function)")
        config = SourceConfig(
            topics=topics,
            group=group,
            event_time=event_time,
            watermarks=watermarks or BoundedOutOfOrderness(0, 30_000),
            all_idle=all_idle or AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK(),
            alignment=alignment,
            deserializer=deserializer,
            dead_letter_topic=dead_letter_topic or f"{group}.dead-letter",
        )
        return Stream(cls(config), None)

    def add(self, kind: str, config: Any, parent: int | None, *, keyed: bool = False,
            late_topic: str | None = None) -> int:
        node = NodeSpec(len(self.nodes), kind, config, parent, keyed, late_topic)
        self.nodes.append(node)
        return node.id

    def sink_topics(self) -> list[str]:
        topics = [n.config.topic for n in self.nodes if n.kind == "sink"]
        topics += [n.late_topic for n in self.nodes if n.late_topic]
        return list(dict.fromkeys([*topics, self.source_config.dead_letter_topic]))

    def validate(self) -> None:
        if not any(n.kind in ("sink", "repartition") for n in self.nodes):
            raise PipelineDefinitionError(f"pipeline {self.name!r} has no sink")


class Stream:
    """Unkeyed items ``value`` with their event time."""

    def __init__(self, pipeline: Pipeline, node: int | None) -> None:
        self.pipeline = pipeline
        self.node = node

    def _then(self, kind: str, config: Any) -> Stream:
        return Stream(self.pipeline, self.pipeline.add(kind, config, self.node))

    def map(self, fn: Callable[[Any], Any]) -> Stream:
        return self._then("map", MapConfig(fn))

    def filter(self, fn: Callable[[Any], bool]) -> Stream:
        return self._then("filter", FilterConfig(fn))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Stream:
        return self._then("flat_map", FlatMapConfig(fn))

    def key_by(self, fn: Callable[[Any], Any], *, repartition: bool | None = None,
               partitions: int | None = None) -> KeyedStream:
        """Key the stream by ``fn(value)``. Standalone, the items go through a repartition topic
        partitioned by the new key (see ``processors.repartition``) unless ``repartition=False``
        says the input topics are already partitioned by it (Kafka's default partitioner on it)."""
        if partitions is not None and partitions < 1:
            raise PipelineDefinitionError("key_by: partitions must be >= 1")
        config = KeyByConfig(fn, repartition, partitions)
        return KeyedStream(self.pipeline, self.pipeline.add("key_by", config, self.node, keyed=True))

    def sink(self, topic: str, serializer: Callable[[Any], Emit] | None = None) -> Stream:
        """Write to ``topic``; returns this stream so more sinks can hang off it (fan-out)."""
        self.pipeline.add("sink", SinkConfig(topic, serializer), self.node)
        return self


class KeyedStream:
    """Items with a key: stateful operators keep state per key."""

    def __init__(self, pipeline: Pipeline, node: int) -> None:
        self.pipeline = pipeline
        self.node = node

    def window(
        self,
        spec: WindowSpec,
        *,
        trigger: Trigger | None = None,
        allowed_lateness: Duration = 0,
        late_topic: str | None = None,
    ) -> WindowedStream:
        return WindowedStream(self, spec, trigger or OnWatermark(), duration_ms(allowed_lateness), late_topic)

    def process(self, fn: ProcessFn) -> Stream:
        return Stream(self.pipeline, self.pipeline.add("process", ProcessConfig(fn), self.node))

    def reduce(self, fn: Callable[[Any, Any], Any]) -> Stream:
        return Stream(self.pipeline, self.pipeline.add("reduce", ReduceConfig(fn), self.node))

    def apply(self, kind: str, config: Any) -> Stream:
        """A custom keyed operator: ``config.build(resume_state)`` returns its per-key logic."""
        if not callable(getattr(config, "build", None)):
            raise PipelineDefinitionError(f"{kind}: a keyed operator config needs build(resume_state)")
        return Stream(self.pipeline, self.pipeline.add(kind, config, self.node))


class WindowedStream:
    def __init__(self, keyed: KeyedStream, spec: WindowSpec, trigger: Trigger, lateness: int,
                 late_topic: str | None) -> None:
        self.keyed = keyed
        self.spec = spec
        self.trigger = trigger
        self.lateness = lateness
        self.late_topic = late_topic

    def aggregate(self, agg: Aggregator) -> Stream:
        """Emits ``WindowResult``s; the default sink encoding keys them by (start, end, key)."""
        pipeline = self.keyed.pipeline
        config = WindowConfig(self.spec, agg, self.trigger, self.lateness)
        late = self.late_topic or f"{pipeline.name}.late"
        return Stream(pipeline, pipeline.add("window", config, self.keyed.node, late_topic=late))

    def reduce(self, fn: Callable[[Any, Any], Any]) -> Stream:
        return self.aggregate(Reduce(fn))
