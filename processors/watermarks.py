"""Per-partition watermarks and the operator watermark built from them.

Rules (the state machine of a ``WatermarkTracker``):

* Each source partition has a local watermark: ``max event time seen − max_delay − 1`` under
  bounded out-of-orderness (Flink's convention: records up to ``max_delay`` older than the newest
  one are still on time). A heartbeat / punctuation can move it forward explicitly.
* A partition is ACTIVE while it has delivered a record within its idle timeout (processing time);
  after that it is IDLE and stops holding time back. Data returning makes it ACTIVE again.
* The operator watermark is the minimum over ACTIVE partitions. It never moves backwards: a
  partition that rejoins behind it holds it where it is until it catches up (its older records
  are late, and the windows route them by allowed lateness). The one exception is a partition
  restored from a checkpoint behind it (a rebalance handing over a partition from an instance that was
  behind): ``Executor.rewind`` lowers it to that partition's floor and raises the floors of the
  partitions already here to the old watermark, so their lateness is unchanged.
* Restored from a checkpoint, a partition gets back its event time, its idleness (processing time
  since it was last heard of; the downtime does not count) and a ``floor``: the operator watermark
  its keys had seen. Records of that partition are judged against at least their floor, so a
  record that was late before a restart is late after it, and the operator watermark starts from
  the lowest floor when every partition has one (a fresh process restoring all of them).
* When every partition is IDLE the ``AllIdlePolicy`` decides: ``HOLD`` moves the watermark to the
  maximum partition watermark and stops there; ``ADVANCE_WITH_WALL_CLOCK(after=…)`` also lets it
  advance one ms per ms of processing time once everything has been idle for ``after`` ms, so the
  last windows of a quiet stream close.
* With ``WatermarkAlignment(max_drift)`` a partition whose local watermark is more than
  ``max_drift`` ahead of the operator watermark is reported as paused; sources stop fetching it
  until the others catch up.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

from processors.errors import PipelineDefinitionError
from processors.time import NO_TIME

__all__ = [
    "AllIdlePolicy",
    "BoundedOutOfOrderness",
    "PartitionWatermark",
    "WatermarkAlignment",
    "WatermarkTracker",
]


@dataclass(frozen=True, slots=True)
class BoundedOutOfOrderness:
    """Records may arrive up to ``max_delay_ms`` behind the newest one; a partition that sends
    nothing for ``idle_timeout`` ms (None = never) stops holding the watermark back."""

    max_delay_ms: int
    idle_timeout: int | None = None

    def __post_init__(self) -> None:
        if self.max_delay_ms < 0:
            raise PipelineDefinitionError("max_delay_ms must be >= 0")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise PipelineDefinitionError("idle_timeout must be positive (or None)")


@dataclass(frozen=True)
class AllIdlePolicy:
    """What the watermark does when every input partition is idle."""

    mode: str = "advance"
    after_ms: int = 0

    HOLD: ClassVar[AllIdlePolicy]  # set below

    @staticmethod
    def ADVANCE_WITH_WALL_CLOCK(after: int = 0) -> AllIdlePolicy:
        """Advance with processing time once all inputs have been idle for ``after`` ms."""
        return AllIdlePolicy("advance", after)

    def __post_init__(self) -> None:
        if self.mode not in ("hold", "advance"):
            raise PipelineDefinitionError(f"unknown all-idle mode {self.mode!r}")


AllIdlePolicy.HOLD = AllIdlePolicy("hold")


@dataclass(frozen=True, slots=True)
class WatermarkAlignment:
    """Pause partitions whose watermark runs more than ``max_drift_ms`` ahead of the operator's."""

    max_drift_ms: int


class PartitionWatermark:
    """The local watermark of one source partition."""

    __slots__ = ("delay", "explicit", "floor", "idle_timeout", "last_active", "max_ts")

    def __init__(self, strategy: BoundedOutOfOrderness, now: int, max_ts: int = NO_TIME) -> None:
        self.delay = strategy.max_delay_ms
        self.idle_timeout = strategy.idle_timeout
        self.max_ts = max_ts
        self.explicit = NO_TIME  # from heartbeats / punctuations
        self.floor = NO_TIME  # the operator watermark this partition's keys had seen (restored)
        self.last_active = now

    def observe(self, max_ts: int, now: int) -> None:
        if max_ts > self.max_ts:
            self.max_ts = max_ts
        self.last_active = now

    def heartbeat(self, watermark: int, now: int) -> None:
        if watermark > self.explicit:
            self.explicit = watermark
        self.last_active = now

    @property
    def watermark(self) -> int:
        bounded = self.max_ts - self.delay - 1 if self.max_ts != NO_TIME else NO_TIME
        return max(bounded, self.explicit)

    def idle(self, now: int) -> bool:
        return self.idle_timeout is not None and now - self.last_active > self.idle_timeout

    def quiet_ms(self, now: int) -> int:
        """Processing time since this partition was last heard of (what a checkpoint keeps)."""
        return max(now - self.last_active, 0)


class WatermarkTracker:
    """Combines partition watermarks into the operator watermark (see the module rules)."""

    def __init__(
        self,
        strategy: BoundedOutOfOrderness,
        all_idle: AllIdlePolicy | None = None,
        alignment: WatermarkAlignment | None = None,
    ) -> None:
        self.strategy = strategy
        self.all_idle = all_idle or AllIdlePolicy.ADVANCE_WITH_WALL_CLOCK()
        self.alignment = alignment
        self.partitions: dict[Hashable, PartitionWatermark] = {}
        self.current = NO_TIME

    def add_partition(self, pid: Hashable, now: int, max_ts: int = NO_TIME) -> None:
        self.partitions[pid] = PartitionWatermark(self.strategy, now, max_ts)

    def restore_partition(self, pid: Hashable, now: int, *, max_ts: int, explicit: int, floor: int,
                          quiet_ms: int) -> None:
        """A partition as a checkpoint left it: event time, floor, and idleness (``quiet_ms`` of
        processing time without news when the checkpoint was taken)."""
        part = self.partitions[pid] = PartitionWatermark(self.strategy, now - quiet_ms, max_ts)
        part.explicit = explicit
        part.floor = floor

    def floor(self, pid: Hashable) -> int:
        """The lowest watermark records of ``pid`` are judged against (NO_TIME if none)."""
        part = self.partitions.get(pid)
        return NO_TIME if part is None else part.floor

    def remove_partition(self, pid: Hashable) -> None:
        self.partitions.pop(pid, None)

    def observe(self, pid: Hashable, max_ts: int, now: int) -> None:
        part = self.partitions.get(pid)
        if part is None:
            part = self.partitions[pid] = PartitionWatermark(self.strategy, now)
        part.observe(max_ts, now)

    def heartbeat(self, pid: Hashable, watermark: int, now: int) -> None:
        part = self.partitions.get(pid)
        if part is None:
            part = self.partitions[pid] = PartitionWatermark(self.strategy, now)
        part.heartbeat(watermark, now)

    def advance(self, now: int) -> int:
        """Recompute and return the operator watermark (monotonic)."""
        if not self.partitions:
            return self.current
        floor = min(p.floor for p in self.partitions.values())  # NO_TIME unless every partition was restored
        if floor > self.current:
            self.current = floor
        active = [p.watermark for p in self.partitions.values() if not p.idle(now)]
        if active:
            candidate = min(active)
        else:
            candidate = max(p.watermark for p in self.partitions.values())
            if self.all_idle.mode == "advance" and candidate != NO_TIME:
                timeout = self.strategy.idle_timeout or 0
                idle_since = max(p.last_active for p in self.partitions.values()) + timeout
                extra = now - idle_since - self.all_idle.after_ms
                if extra > 0:
                    candidate += extra
        if candidate > self.current:
            self.current = candidate
        return self.current

    def paused(self, now: int) -> set[Hashable]:
        """Partitions too far ahead under watermark alignment (empty without alignment)."""
        if self.alignment is None or self.current == NO_TIME:
            return set()
        limit = self.current + self.alignment.max_drift_ms
        return {pid for pid, p in self.partitions.items() if p.watermark > limit and not p.idle(now)}
