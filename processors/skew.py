"""Skew: heavy hitters with Lossy Counting, and two-phase aggregation for hot keys.

Lossy Counting (Manku & Motwani): the stream is cut into buckets of width ``w = ⌈1/ε⌉``; each
tracked item has ``(f, Δ)`` — its count since it was (re)inserted and the most it can have been
under-counted (the bucket id at insertion − 1). At each bucket boundary entries with
``f + Δ ≤ current bucket`` are pruned. Reporting items with ``f ≥ (s − ε)·N`` has no false
negatives (every item with true frequency ≥ s·N is reported) and each ``f`` under-estimates the
true count by at most ``ε·N``; memory stays at ``O(1/ε · log(εN))`` entries.

Two-phase aggregation splits a hot key over ``splits`` sub-keys ``(key, i)`` (chosen round-robin
for keys the Lossy Counter sees above ``support``), aggregates partial windows per sub-key, then
merges the partial accumulators per key when the watermark closes the window — the lectures'
partial key grouping. Its results equal the one-phase aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from processors.aggregations import Aggregator
from processors.errors import PipelineDefinitionError
from processors.logic import OpContext
from processors.operators import KeyedProcessFunction, ProcessContext
from processors.pipeline import Stream
from processors.triggers import EMIT_FIRST
from processors.windows import Sliding, Tumbling, WindowResult

__all__ = ["HeavyHitters", "HeavyHittersLogic", "LossyCounter", "heavy_hitters", "two_phase_aggregate"]


class LossyCounter:
    def __init__(self, epsilon: float, support: float, state: dict[str, Any] | None = None) -> None:
        if not 0 < epsilon < 1 or not 0 < support <= 1 or epsilon >= support:
            raise PipelineDefinitionError("Lossy Counting needs 0 < epsilon < support <= 1")
        self.epsilon = epsilon
        self.support = support
        self.width = math.ceil(1 / epsilon)
        self.n = 0
        self.entries: dict[Hashable, list[int]] = {}  # item -> [f, delta]
        if state is not None:
            self.n = state["n"]
            self.entries = {k: list(v) for k, v in state["entries"]}

    @property
    def bucket(self) -> int:
        return math.ceil(self.n / self.width) if self.n else 1

    def add(self, item: Hashable) -> None:
        self.n += 1
        entry = self.entries.get(item)
        if entry is not None:
            entry[0] += 1
        else:
            self.entries[item] = [1, self.bucket - 1]
        if self.n % self.width == 0:
            current = self.n // self.width
            self.entries = {k: e for k, e in self.entries.items() if e[0] + e[1] > current}

    def estimate(self, item: Hashable) -> int:
        entry = self.entries.get(item)
        return entry[0] if entry is not None else 0

    def heavy_hitters(self) -> list[tuple[Hashable, int]]:
        """Items with ``f ≥ (s − ε)·N``, most frequent first."""
        threshold = (self.support - self.epsilon) * self.n
        hits = [(k, e[0]) for k, e in self.entries.items() if e[0] >= threshold]
        return sorted(hits, key=lambda kv: (-kv[1], str(kv[0])))

    def snapshot(self) -> dict[str, Any]:
        return {"n": self.n, "entries": [[k, e] for k, e in self.entries.items()]}


@dataclass(frozen=True)
class HeavyHitters:
    """Operator config: count ``item(value)`` with Lossy Counting and emit a report each time the
    watermark passes a multiple of ``every_ms`` (event time)."""

    item: Callable[[Any], Hashable]
    epsilon: float
    support: float
    every_ms: int

    def build(self, resume_state: Any) -> HeavyHittersLogic:
        return HeavyHittersLogic(self, resume_state)


class HeavyHittersLogic:
    def __init__(self, cfg: HeavyHitters, resume_state: Any) -> None:
        self.cfg = cfg
        self.counter = LossyCounter(cfg.epsilon, cfg.support, resume_state["lc"] if resume_state else None)
        self.next_report: int | None = resume_state["next"] if resume_state else None

    def on_item(self, ts: int, value: Any, ctx: OpContext) -> None:
        self.counter.add(self.cfg.item(value))
        if self.next_report is None:
            self.next_report = ts - ts % self.cfg.every_ms + self.cfg.every_ms
            ctx.schedule_event(self.next_report - 1)

    def on_watermark(self, watermark: int, ctx: OpContext) -> None:
        if self.next_report is None or watermark < self.next_report - 1:
            return
        at = self.next_report
        self.next_report = watermark - watermark % self.cfg.every_ms + self.cfg.every_ms
        ctx.schedule_event(self.next_report - 1)
        c = self.counter
        ctx.emit(at - 1, {
            "at": at, "n": c.n, "epsilon": c.epsilon, "support": c.support,
            "items": [{"item": k, "count": f} for k, f in c.heavy_hitters()],
        })

    def on_notify(self, now: int, ctx: OpContext) -> None:
        return None

    def on_eof(self, ctx: OpContext) -> None:
        return None

    def notify_at(self) -> int | None:
        return None if self.next_report is None else self.next_report - 1

    def snapshot(self) -> Any:
        return {"lc": self.counter.snapshot(), "next": self.next_report}

    def is_empty(self) -> bool:
        return False


def heavy_hitters(stream: Stream, item: Callable[[Any], Hashable], *, epsilon: float, support: float,
                  every_ms: int) -> Stream:
    """Reports of the items above ``support`` of the stream so far, every ``every_ms``."""
    LossyCounter(epsilon, support)  # validate early
    keyed = stream.key_by(lambda v: "*")
    return keyed.apply("heavy_hitters", HeavyHitters(item, epsilon, support, every_ms))


class _Salter:
    """Round-robin sub-key for keys the Lossy Counter sees as hot; sub-key 0 for the rest."""

    def __init__(self, key: Callable[[Any], Hashable], splits: int, epsilon: float, support: float) -> None:
        self.key = key
        self.splits = splits
        self.counter = LossyCounter(epsilon, support)
        self.turn: dict[Hashable, int] = {}

    def __call__(self, value: Any) -> tuple[Hashable, int]:
        k = self.key(value)
        c = self.counter
        c.add(k)
        if c.estimate(k) < (c.support - c.epsilon) * c.n:
            return (k, 0)
        i = self.turn.get(k, 0)
        self.turn[k] = (i + 1) % self.splits
        return (k, i)


class _PartialOf:
    """Phase 1: the aggregation, but the 'result' is the raw accumulator. ``create``/``add``/``merge``
    are the aggregation's own bound methods, so a record costs no extra call."""

    def __init__(self, agg: Aggregator) -> None:
        self.create = agg.create
        self.add = agg.add
        self.merge = agg.merge

    def result(self, acc: Any) -> Any:
        return acc


class _MergePartials(KeyedProcessFunction):
    """Phase 2: merge partial accumulators of one key per window once the watermark closes it."""

    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg

    def process(self, value: Any, ctx: ProcessContext) -> None:
        partials = ctx.map("partials")
        slot = partials.get(value.window_start)
        if slot is None:
            slot = [value.window_end, self.agg.create(), 0]
            ctx.register_event_timer(value.window_end - 1)
        slot[1] = self.agg.merge(slot[1], value.value)
        slot[2] += value.count
        partials.put(value.window_start, slot)

    def on_timer(self, timestamp: int, ctx: ProcessContext, domain: str) -> None:
        partials = ctx.map("partials")
        for start, (end, acc, count) in sorted(partials.items()):
            if end - 1 <= timestamp:
                ctx.emit(WindowResult(ctx.key, start, end, self.agg.result(acc), EMIT_FIRST, count), end - 1)
                partials.remove(start)


def two_phase_aggregate(stream: Stream, key: Callable[[Any], Hashable], window: Tumbling | Sliding,
                        agg: Aggregator, *, splits: int = 4, epsilon: float = 0.001, support: float = 0.05,
                        late_topic: str | None = None) -> Stream:
    """Windowed ``agg`` per ``key`` computed as partial aggregates over split hot keys, then merged."""
    if splits < 2:
        raise PipelineDefinitionError("two-phase aggregation needs splits >= 2")
    # No repartition topic: the salting is stateful (a replay could salt differently) and the merge
    # follows a window. Scaled out, the input must be partitioned by ``key`` (each key's partials then
    # live in one instance).
    partial = stream.key_by(_Salter(key, splits, epsilon, support), repartition=False)
    partials = partial.window(window, late_topic=late_topic).aggregate(_PartialOf(agg))
    return partials.key_by(lambda r: r.key[0], repartition=False).process(_MergePartials(agg))
