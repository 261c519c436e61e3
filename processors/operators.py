"""Operator configurations and the per-key logics of ``process`` and rolling ``reduce``.

Configs are frozen and key-agnostic; keyed ones have ``build(resume_state) -> logic`` (see
``processors.logic``). Stateless operators (map, filter, flat_map, key_by) are plain functions run
over batches by the executor. Window configs live in ``processors.windows``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from processors.errors import PipelineDefinitionError
from processors.logic import OpContext
from processors.state import KeyState, ListState, MapState, ValueState
from processors.time import NO_TIME

__all__ = [
    "Emit",
    "FilterConfig",
    "FlatMapConfig",
    "KeyByConfig",
    "KeyedProcessFunction",
    "MapConfig",
    "ProcessConfig",
    "ProcessContext",
    "ProcessLogic",
    "ReduceConfig",
    "ReduceLogic",
    "SinkConfig",
]


@dataclass(frozen=True, slots=True)
class MapConfig:
    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class FilterConfig:
    fn: Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class FlatMapConfig:
    fn: Callable[[Any], Iterable[Any]]


@dataclass(frozen=True, slots=True)
class KeyByConfig:
    """``repartition``: None = shuffle through ``<group>.repartition.<node>`` when the pipeline runs
    standalone (the input's partitioning is unknown), never when attached (one node); False = the
    input is already partitioned by this key; True = always when standalone. ``partitions``: the
    repartition topic's partition count (default: the most partitions of any input topic)."""

    fn: Callable[[Any], Any]
    repartition: bool | None = None
    partitions: int | None = None


@dataclass(frozen=True, slots=True)
class SinkConfig:
    """Write items to ``topic``; ``serializer(item) -> Emit`` overrides the default encoding."""

    topic: str
    serializer: Callable[[Any], Emit] | None = None


@dataclass(frozen=True, slots=True)
class Emit:
    """An explicit output record: what a serializer returns, or what a pipeline emits itself."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()


# ---------------------------------------------------------------------------------- process


class ProcessContext:
    """What a keyed process function sees: the key, time, its keyed state and timers."""

    __slots__ = ("_logic", "_op", "timestamp")

    def __init__(self, logic: ProcessLogic) -> None:
        self._logic = logic
        self._op: OpContext | None = None
        self.timestamp = NO_TIME

    @property
    def key(self) -> Any:
        assert self._op is not None
        return self._op.key

    @property
    def watermark(self) -> int:
        assert self._op is not None
        return self._op.watermark

    @property
    def now(self) -> int:
        return self._logic.now

    def emit(self, value: Any, timestamp: int | None = None) -> None:
        assert self._op is not None
        self._op.emit(self.timestamp if timestamp is None else timestamp, value)

    def value(self, name: str, ttl_ms: int | None = None) -> ValueState:
        return self._logic.state.value(name, ttl_ms)

    def list(self, name: str, ttl_ms: int | None = None) -> ListState:
        return self._logic.state.list(name, ttl_ms)

    def map(self, name: str, ttl_ms: int | None = None) -> MapState:
        return self._logic.state.map(name, ttl_ms)

    def register_event_timer(self, t: int) -> None:
        """``on_timer(t, ctx, "event")`` once the watermark reaches ``t``."""
        assert self._op is not None
        if t not in self._logic.event_timers:
            self._logic.event_timers.append(t)
            self._op.schedule_event(t)

    def register_processing_timer(self, t: int) -> None:
        """``on_timer(t, ctx, "processing")`` once processing time reaches ``t``."""
        assert self._op is not None
        if t not in self._logic.proc_timers:
            self._logic.proc_timers.append(t)
            self._op.schedule_proc(t)


class KeyedProcessFunction:
    """Subclass and override ``process`` (and ``on_timer`` if you register timers)."""

    def process(self, value: Any, ctx: ProcessContext) -> None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: ProcessContext, domain: str) -> None:
        return None


ProcessFn = KeyedProcessFunction | Callable[[Any, ProcessContext], None]


@dataclass(frozen=True, slots=True)
class ProcessConfig:
    fn: ProcessFn

    def __post_init__(self) -> None:
        if not (isinstance(self.fn, KeyedProcessFunction) or callable(self.fn)):
            raise PipelineDefinitionError("process() needs a KeyedProcessFunction or a function(value, ctx)")

    def build(self, resume_state: Any) -> ProcessLogic:
        return ProcessLogic(self.fn, resume_state)


class ProcessLogic:
    __slots__ = ("_ctx", "event_timers", "fn", "now", "proc_timers", "state")

    def __init__(self, fn: ProcessFn, resume_state: Any) -> None:
        self.fn = fn
        self.now = 0
        resume = resume_state or {}
        self.state = KeyState(resume.get("state"), lambda: self.now)
        self.event_timers: list[int] = list(resume.get("et", []))
        self.proc_timers: list[int] = list(resume.get("pt", []))
        self._ctx = ProcessContext(self)

    def on_item(self, ts: int, value: Any, ctx: OpContext) -> None:
        self.now = ctx.now
        pctx = self._ctx
        pctx._op = ctx
        pctx.timestamp = ts
        if isinstance(self.fn, KeyedProcessFunction):
            self.fn.process(value, pctx)
        else:
            self.fn(value, pctx)

    def _fire(self, due: list[int], domain: str, ctx: OpContext) -> None:
        if not isinstance(self.fn, KeyedProcessFunction):
            return
        pctx = self._ctx
        pctx._op = ctx
        for t in sorted(due):
            pctx.timestamp = t
            self.fn.on_timer(t, pctx, domain)

    def on_watermark(self, watermark: int, ctx: OpContext) -> None:
        self.now = ctx.now
        due = [t for t in self.event_timers if t <= watermark]
        if due:
            self.event_timers = [t for t in self.event_timers if t > watermark]
            self._fire(due, "event", ctx)
        if self.event_timers:  # restored timers were scheduled only through their earliest one
            ctx.schedule_event(min(self.event_timers))

    def on_notify(self, now: int, ctx: OpContext) -> None:
        self.now = now
        self.state.expire(now)
        due = [t for t in self.proc_timers if t <= now]
        if due:
            self.proc_timers = [t for t in self.proc_timers if t > now]
            self._fire(due, "processing", ctx)

    def on_eof(self, ctx: OpContext) -> None:
        return None

    def notify_at(self) -> int | None:
        return min(self.event_timers) if self.event_timers else None

    def snapshot(self) -> Any:
        return {"state": self.state.snapshot(), "et": self.event_timers, "pt": self.proc_timers}

    def is_empty(self) -> bool:
        return self.state.is_empty() and not self.event_timers and not self.proc_timers


# ---------------------------------------------------------------------------------- rolling reduce


@dataclass(frozen=True, slots=True)
class ReduceConfig:
    """Rolling reduce per key: emits the running result after every item."""

    fn: Callable[[Any, Any], Any]

    def build(self, resume_state: Any) -> ReduceLogic:
        return ReduceLogic(self.fn, resume_state)


class ReduceLogic:
    __slots__ = ("acc", "fn", "has")

    def __init__(self, fn: Callable[[Any, Any], Any], resume_state: Any) -> None:
        self.fn = fn
        self.has = resume_state is not None
        self.acc = resume_state[0] if resume_state is not None else None

    def on_item(self, ts: int, value: Any, ctx: OpContext) -> None:
        self.acc = self.fn(self.acc, value) if self.has else value
        self.has = True
        ctx.emit(ts, self.acc)

    def on_watermark(self, watermark: int, ctx: OpContext) -> None:
        return None

    def on_notify(self, now: int, ctx: OpContext) -> None:
        return None

    def on_eof(self, ctx: OpContext) -> None:
        return None

    def notify_at(self) -> int | None:
        return None

    def snapshot(self) -> Any:
        return [self.acc]

    def is_empty(self) -> bool:
        return False
