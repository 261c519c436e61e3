"""Event-time windows: tumbling, sliding and session; per-key window logic with allowed lateness.

A window ``[start, end)`` holds records with ``start <= ts < end``. With watermark ``W`` (no more
records with ``ts <= W`` expected) the window is complete once ``W >= end - 1``: it then emits
``first``. Its state is kept until ``W >= end - 1 + allowed_lateness``; a record for it arriving
in between updates the state and re-emits the result tagged ``update``. A record all of whose
windows are past that point is late: it goes to the late-data output with the reason — never
dropped silently. Sessions merge when a record falls within ``gap`` of two sessions.

Results carry the deterministic identity ``(window_start, window_end, key)`` so a re-emission
(after an update, or after a restart replays input) is recognisable downstream.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from broker.native import select
from processors import record_kernels
from processors.aggregations import Aggregator, Count, Mean, Sum
from processors.errors import PipelineDefinitionError
from processors.logic import BatchOnItems, KeyedRuntime, OpContext
from processors.triggers import EMIT_EARLY, EMIT_FIRST, EMIT_UPDATE, CountTrigger, EarlyEvery, OnWatermark, Trigger

__all__ = [
    "LateRecord",
    "Session",
    "Sliding",
    "Tumbling",
    "WindowConfig",
    "WindowLogic",
    "WindowResult",
    "WindowSpec",
]


@dataclass(frozen=True, slots=True)
class Tumbling:
    size_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise PipelineDefinitionError("window size must be positive")


@dataclass(frozen=True, slots=True)
class Sliding:
    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise PipelineDefinitionError("window size and slide must be positive")
        if self.slide_ms > self.size_ms:
            raise PipelineDefinitionError("a slide longer than the window would skip records")


@dataclass(frozen=True, slots=True)
class Session:
    gap_ms: int

    def __post_init__(self) -> None:
        if self.gap_ms <= 0:
            raise PipelineDefinitionError("session gap must be positive")


WindowSpec = Tumbling | Sliding | Session


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One emission of one window for one key; ``(window_start, window_end, key)`` identifies it."""

    key: Any
    window_start: int
    window_end: int
    value: Any
    emit: str  # "early" | "first" | "update"
    count: int

    def identity(self) -> tuple[int, int, Any]:
        return (self.window_start, self.window_end, self.key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "value": self.value,
            "emit": self.emit,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class LateRecord:
    """A record too late for every window it belongs to, with the reason."""

    key: Any
    value: Any
    timestamp: int
    watermark: int
    reason: str


@dataclass(frozen=True)
class WindowConfig:
    """Configuration of a keyed window operator; ``build`` makes the logic for one key."""

    spec: WindowSpec
    agg: Aggregator
    trigger: Trigger = field(default_factory=OnWatermark)
    allowed_lateness_ms: int = 0

    def __post_init__(self) -> None:
        if self.allowed_lateness_ms < 0:
            raise PipelineDefinitionError("allowed lateness must be >= 0")
        if not isinstance(self.trigger, OnWatermark | EarlyEvery | CountTrigger):
            raise PipelineDefinitionError(f"unknown trigger {self.trigger!r}")

    def build(self, resume_state: Any) -> WindowLogic:
        return WindowLogic(self, resume_state)

    def batch_on_items(self) -> BatchOnItems | None:
        """``KeyedRuntime.on_items`` for this operator's common case, or None: tumbling windows
        without a count trigger (``tumbling_on_items``)."""
        if isinstance(self.spec, Tumbling) and not isinstance(self.trigger, CountTrigger):
            return tumbling_on_items
        return None


# A window slot: [end, acc, fired, count, count_at_last_emit]
_END, _ACC, _FIRED, _COUNT, _EMITTED = range(5)
_KERNELS = select(record_kernels)  # the compiled build of the per-record loops when there is one (setup.py)


def tumbling_on_items(rt: KeyedRuntime, items: list[tuple[int, Hashable, Any]], watermark: int, now: int,
                      owner: Hashable) -> None:
    """``KeyedRuntime.on_items`` for tumbling windows without a count trigger, keys in a dict.

    Nearly every record goes to a window of its key that is open and has not fired: that case (the
    one ``WindowLogic.on_item`` takes first) is done by ``record_kernels.tumbling_items`` without a
    call per record; every other record (a new key, a new window, a fired one, a late one) goes
    through ``on_item`` as before. The result is the same as calling ``on_item`` for each record: the
    same state, outputs, late records and errors (``tests/processors/test_record_kernels.py``)."""
    ctx = rt.ctx
    ctx.watermark = watermark
    ctx.now = now
    logics = rt.logics
    owners = rt.owner
    errors = rt.errors
    config: WindowConfig = rt.config  # type: ignore[assignment]
    build = config.build
    spec = config.spec
    assert isinstance(spec, Tumbling) and isinstance(logics, dict)

    def slow(ts: int, key: Hashable, value: Any) -> None:
        logic = logics.get(key)
        if logic is None:
            logic = logics[key] = build(None)
            owners[key] = owner
        ctx.key = key
        try:
            logic.on_item(ts, value, ctx)
        except Exception as exc:  # as on_items: the record is dead-lettered, the rest go on
            errors.append((ts, value, repr(exc)))

    how, field = _spelled_out_add(config.agg)
    _KERNELS.tumbling_items(items, logics, config.agg.add, how, field, spec.size_ms, spec.offset_ms, watermark, slow,
                            errors, rt.dirty if isinstance(config.trigger, EarlyEvery) else None)


def _spelled_out_add(agg: Aggregator) -> tuple[int, str]:
    """How ``record_kernels.tumbling_items`` may add to ``agg``'s accumulator without calling ``agg.add``:
    for the built-in aggregations of a named field (exactly these classes: a subclass may change add)."""
    kernels = record_kernels
    if type(agg) is Count:
        return kernels.ADD_COUNT, ""
    field = getattr(agg, "field", None)
    if isinstance(field, str):
        if type(agg) is Mean:
            return kernels.ADD_MEAN, field
        if type(agg) is Sum:
            return kernels.ADD_SUM, field
    return kernels.ADD_CALL, ""


class WindowLogic:
    """All open windows of one key. Tumbling/sliding windows are keyed by start; sessions are a
    sorted list of ``[start, slot]`` pairs."""

    __slots__ = ("_add_fn", "_early", "_off", "_size", "_tumbling", "agg", "cfg", "count_n", "lateness", "sessions",
                 "windows")

    def __init__(self, cfg: WindowConfig, resume_state: Any) -> None:
        self.cfg = cfg
        self.agg = cfg.agg
        self._add_fn = cfg.agg.add
        self.lateness = cfg.allowed_lateness_ms
        self.count_n = cfg.trigger.n if isinstance(cfg.trigger, CountTrigger) else 0
        self._early = isinstance(cfg.trigger, EarlyEvery)
        self._tumbling = isinstance(cfg.spec, Tumbling)
        self._size = cfg.spec.size_ms if isinstance(cfg.spec, Tumbling) else 0
        self._off = cfg.spec.offset_ms if isinstance(cfg.spec, Tumbling) else 0
        self.windows: dict[int, list[Any]] = {}
        self.sessions: list[list[Any]] = []  # [start, last_ts, slot]
        if resume_state is not None:
            self.windows = {int(s): slot for s, slot in resume_state.get("w", [])}
            self.sessions = resume_state.get("s", [])

    # -- items --------------------------------------------------------------------------------

    def on_item(self, ts: int, value: Any, ctx: OpContext) -> None:
        if self._tumbling:
            start = ts - (ts - self._off) % self._size
            slot = self.windows.get(start)
            # the common case: an open window, not yet fired, no count trigger
            if slot is not None and not slot[2] and ctx.watermark < slot[0] - 1 and not self.count_n:
                slot[1] = self._add_fn(slot[1], value)
                slot[3] += 1
                if self._early:
                    ctx.mark_dirty()
                return
            end = start + self._size
            if not self._add(start, end, value, ctx):
                self._late(ts, value, ctx, end)
            return
        spec = self.cfg.spec
        if isinstance(spec, Sliding):
            start = ts - (ts - spec.offset_ms) % spec.slide_ms
            accepted = False
            last_end = start + spec.size_ms
            while start > ts - spec.size_ms:
                accepted = self._add(start, start + spec.size_ms, value, ctx) or accepted
                start -= spec.slide_ms
            if not accepted:
                self._late(ts, value, ctx, last_end)
        else:
            assert isinstance(spec, Session)  # tumbling was handled above
            self._add_session(ts, value, spec.gap_ms, ctx)

    def _add(self, start: int, end: int, value: Any, ctx: OpContext) -> bool:
        slot = self.windows.get(start)
        wm = ctx.watermark
        if slot is None:
            if wm >= end - 1 + self.lateness:
                return False
            slot = self.windows[start] = [end, self.agg.create(), False, 0, 0]
            ctx.schedule_event(end - 1)
        slot[_ACC] = self.agg.add(slot[_ACC], value)
        slot[_COUNT] += 1
        if wm >= end - 1:  # the on-time result is (or should already be) out: emit now
            self._emit(start, slot, EMIT_UPDATE if slot[_FIRED] else EMIT_FIRST, ctx)
            if not slot[_FIRED]:
                slot[_FIRED] = True
                ctx.schedule_event(end - 1 + self.lateness)
        elif self.count_n and slot[_COUNT] - slot[_EMITTED] >= self.count_n:
            self._emit(start, slot, EMIT_EARLY, ctx)
        elif self._early:
            ctx.mark_dirty()
        return True

    def _add_session(self, ts: int, value: Any, gap: int, ctx: OpContext) -> None:
        sessions = self.sessions
        merged = [s for s in sessions if ts < s[1] + gap and s[0] < ts + gap]
        wm = ctx.watermark
        if not merged and wm >= ts + gap - 1 + self.lateness:
            self._late(ts, value, ctx, ts + gap)
            return
        start, last = ts, ts
        acc = self.agg.create()
        count = 0
        was_fired = False
        for s in merged:
            sessions.remove(s)
            start, last = min(start, s[0]), max(last, s[1])
            slot = s[2]
            acc = self.agg.merge(acc, slot[_ACC])
            count += slot[_COUNT]
            was_fired = was_fired or slot[_FIRED]
        end = last + gap
        slot = [end, self.agg.add(acc, value), False, count + 1, 0]
        bisect.insort(sessions, [start, last, slot], key=lambda s: s[0])
        if wm >= end - 1:
            self._emit(start, slot, EMIT_UPDATE if was_fired else EMIT_FIRST, ctx)
            slot[_FIRED] = True
            ctx.schedule_event(end - 1 + self.lateness)
        else:
            ctx.schedule_event(end - 1)
            if self.count_n and slot[_COUNT] - slot[_EMITTED] >= self.count_n:
                self._emit(start, slot, EMIT_EARLY, ctx)
            elif self._early:
                ctx.mark_dirty()

    def _late(self, ts: int, value: Any, ctx: OpContext, window_end: int) -> None:
        reason = (
            f"event time {ts} is later than allowed: window ending {window_end} closed at watermark "
            f"{ctx.watermark} with allowed lateness {self.lateness} ms"
        )
        ctx.late(ts, LateRecord(ctx.key, value, ts, ctx.watermark, reason))

    def _emit(self, start: int, slot: list[Any], emit: str, ctx: OpContext) -> None:
        slot[_EMITTED] = slot[_COUNT]
        end = slot[_END]
        ctx.emit(end - 1, WindowResult(ctx.key, start, end, self.agg.result(slot[_ACC]), emit, slot[_COUNT]))

    # -- time -----------------------------------------------------------------------------------

    def _slots(self) -> list[tuple[int, list[Any]]]:
        if self.sessions:
            return [(s[0], s[2]) for s in self.sessions]
        return list(self.windows.items())

    def on_watermark(self, watermark: int, ctx: OpContext) -> None:
        lateness = self.lateness
        for start, slot in sorted(self._slots(), key=lambda s: s[0]):
            end = slot[_END]
            if end - 1 > watermark:
                continue
            if not slot[_FIRED]:
                slot[_FIRED] = True
                self._emit(start, slot, EMIT_FIRST, ctx)
                if lateness:
                    ctx.schedule_event(end - 1 + lateness)
            if end - 1 + lateness <= watermark:
                self._purge(start, slot)
        # wake again for the next window of this key (windows restored from a checkpoint were
        # scheduled only through their earliest one)
        following = self.notify_at()
        if following is not None:
            ctx.schedule_event(following)

    def _purge(self, start: int, slot: list[Any]) -> None:
        if self.sessions:
            self.sessions = [s for s in self.sessions if s[2] is not slot]
        else:
            self.windows.pop(start, None)

    def on_notify(self, now: int, ctx: OpContext) -> None:
        """Early firing: emit windows that changed since their last emission."""
        if not isinstance(self.cfg.trigger, EarlyEvery):
            return
        for start, slot in sorted(self._slots(), key=lambda s: s[0]):
            if not slot[_FIRED] and slot[_COUNT] != slot[_EMITTED]:
                self._emit(start, slot, EMIT_EARLY, ctx)

    def on_eof(self, ctx: OpContext) -> None:
        """End of a bounded input: every window still open is complete."""
        for start, slot in sorted(self._slots(), key=lambda s: s[0]):
            if not slot[_FIRED]:
                slot[_FIRED] = True
                self._emit(start, slot, EMIT_FIRST, ctx)
        self.windows.clear()
        self.sessions.clear()

    def notify_at(self) -> int | None:
        times = [slot[_END] - 1 + (self.lateness if slot[_FIRED] else 0) for _, slot in self._slots()]
        return min(times) if times else None

    def snapshot(self) -> Any:
        return {"w": [[s, slot] for s, slot in self.windows.items()], "s": self.sessions}

    def is_empty(self) -> bool:
        return not self.windows and not self.sessions
