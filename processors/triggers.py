"""When a window emits. The watermark trigger always fires the on-time (``first``) result;
the others add ``early`` results before it. Records inside allowed lateness re-emit ``update``.

* ``OnWatermark()`` — the default: one result when the watermark passes the window end.
* ``EarlyEvery(interval_ms)`` — also an ``early`` result every ``interval_ms`` of processing time
  for windows that changed since their last emission (the lectures' "30 s windows, 1 s early firing").
* ``CountTrigger(n)`` — also an ``early`` result each time a window has collected ``n`` more records.
"""

from __future__ import annotations

from dataclasses import dataclass

from processors.errors import PipelineDefinitionError

__all__ = ["EMIT_EARLY", "EMIT_FIRST", "EMIT_UPDATE", "CountTrigger", "EarlyEvery", "OnWatermark", "Trigger"]

EMIT_EARLY = "early"
EMIT_FIRST = "first"
EMIT_UPDATE = "update"


@dataclass(frozen=True, slots=True)
class OnWatermark:
    pass


@dataclass(frozen=True, slots=True)
class EarlyEvery:
    interval_ms: int

    def __post_init__(self) -> None:
        if self.interval_ms <= 0:
            raise PipelineDefinitionError("EarlyEvery interval must be positive")


@dataclass(frozen=True, slots=True)
class CountTrigger:
    n: int

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise PipelineDefinitionError("CountTrigger n must be positive")


Trigger = OnWatermark | EarlyEvery | CountTrigger
