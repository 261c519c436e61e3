"""The contract between a keyed operator and its per-key logic (bytewax ``windowing.py`` style).

An operator *config* is frozen and knows nothing about keys; ``config.build(resume_state)`` makes
the logic for one key (``resume_state`` is what that logic's ``snapshot()`` returned, or None).
The keyed runtime owns the logics, routes items to them, fires their timers and checkpoints them.

A logic gets an ``OpContext`` on every call: it emits downstream with ``ctx.emit``, routes late
records with ``ctx.late``, and asks to be woken with ``ctx.schedule_event(t)`` (``on_watermark``
once the watermark reaches ``t``) or ``ctx.schedule_proc(t)`` (``on_notify`` once processing time
reaches ``t``). Spurious wake-ups are allowed; logics check their own deadlines.

Every key has an owner: the source partition whose records created it, so its state is
checkpointed with, restored with and handed over with that partition. What a key emits from a
timer (or at end of input) carries the key's owner downstream (``out_owners``), so a key that a
downstream operator creates from it belongs to the same partition, whichever batch (if any) is
being processed at the time.
"""

from __future__ import annotations

import heapq
from abc import abstractmethod
from collections.abc import Callable, Hashable, Iterator, MutableMapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from processors.time import NO_TIME

__all__ = ["BatchOnItems", "KeyedRuntime", "Logic", "LogicConfig", "OpContext", "SpillStore"]


class OpContext:
    """What a logic may see and do while it handles one call for ``key``."""

    __slots__ = ("_rt", "key", "now", "watermark")

    def __init__(self, runtime: KeyedRuntime) -> None:
        self._rt = runtime
        self.key: Any = None
        self.watermark = NO_TIME
        self.now = 0

    def emit(self, ts: int, value: Any) -> None:
        self._rt.out.append((ts, value))

    def late(self, ts: int, value: Any) -> None:
        self._rt.late_out.append((ts, value))

    def schedule_event(self, t: int) -> None:
        heapq.heappush(self._rt.event_timers, (t, self._rt.seq(), self.key))

    def schedule_proc(self, t: int) -> None:
        heapq.heappush(self._rt.proc_timers, (t, self._rt.seq(), self.key))

    def mark_dirty(self) -> None:
        self._rt.dirty.add(self.key)


class SpillStore(MutableMapping[Hashable, "Logic"]):
    """What ``KeyedRuntime`` needs of a store that bounds the keys in memory
    (``processors.state_store.SpillingLogics`` is the one)."""

    max_keys: int
    owners: MutableMapping[Hashable, Hashable]
    on_load: Callable[[Hashable, Logic], None] | None

    @abstractmethod
    def due_event(self, watermark: int, limit: int) -> list[Hashable]: ...
    @abstractmethod
    def due_proc(self, now: int, limit: int) -> list[Hashable]: ...
    @abstractmethod
    def is_hot(self, key: Hashable) -> bool: ...
    @abstractmethod
    def entries(self) -> Iterator[tuple[Hashable, Hashable, Any]]: ...
    @abstractmethod
    def take_changes(self) -> tuple[set[Hashable], dict[Hashable, Hashable]]: ...
    @abstractmethod
    def untracked(self) -> AbstractContextManager[None]: ...
    @abstractmethod
    def snapshot_of(self, key: Hashable) -> tuple[Hashable, Any] | None: ...


class Logic(Protocol):
    def on_item(self, ts: int, value: Any, ctx: OpContext) -> None: ...
    def on_watermark(self, watermark: int, ctx: OpContext) -> None: ...
    def on_notify(self, now: int, ctx: OpContext) -> None: ...
    def on_eof(self, ctx: OpContext) -> None: ...
    def notify_at(self) -> int | None: ...
    def snapshot(self) -> Any: ...
    def is_empty(self) -> bool: ...


class LogicConfig(Protocol):
    def build(self, resume_state: Any) -> Logic: ...


# a whole batch of (ts, key, value) items, the watermark, processing time and the owner of new keys
BatchOnItems = Callable[["KeyedRuntime", list[tuple[int, Hashable, Any]], int, int, Hashable], None]


class KeyedRuntime:
    """Per-key logics of one keyed operator, their timers, and which source partition owns each key."""

    def __init__(self, config: LogicConfig, logics: MutableMapping[Hashable, Logic] | None = None) -> None:
        self.config = config
        # a dict, or a store bounding how many keys live in memory (processors.state_store): it then
        # keeps the owners and the spilled keys' timers too, and hands timers back as keys load
        self.logics: MutableMapping[Hashable, Logic] = {} if logics is None else logics
        self.spill: SpillStore | None = logics if isinstance(logics, SpillStore) else None
        # key -> source partition whose records created it
        self.owner: MutableMapping[Hashable, Hashable] = {} if self.spill is None else self.spill.owners
        if self.spill is not None:
            self.spill.on_load = self._rearm
        self.event_timers: list[tuple[int, int, Hashable]] = []
        self.proc_timers: list[tuple[int, int, Hashable]] = []
        self.dirty: set[Hashable] = set()
        self.out: list[tuple[int, Any]] = []
        # (index into ``out``, owner): from that index on, outputs were emitted by a key of that
        # owner (timers, end of input); empty when ``out`` came from records of the current batch
        self.out_owners: list[tuple[int, Hashable]] = []
        self.late_out: list[tuple[int, Any]] = []
        self.errors: list[tuple[int, Any, str]] = []
        self.ctx = OpContext(self)
        self._seq = 0
        # a config may do a whole batch of items at once for its common case (windows.tumbling_on_items);
        # with a spill store every key access goes through the store, so never then
        batch = getattr(config, "batch_on_items", None)
        self._batch_on_items: BatchOnItems | None = batch() if batch is not None and self.spill is None else None

    def seq(self) -> int:
        self._seq += 1
        return self._seq

    def _owned_by(self, key: Hashable) -> None:
        """What follows in ``out`` is emitted by ``key``: mark its owner (once per run of one owner)."""
        owner = self.owner.get(key)
        marks = self.out_owners
        if not marks or marks[-1][1] != owner:
            marks.append((len(self.out), owner))

    def take_out(self) -> list[tuple[Hashable, list[tuple[int, Any]]]]:
        """The outputs so far, split by the owner they carry (None: the current batch's partition)."""
        out, self.out = self.out, []
        marks, self.out_owners = self.out_owners, []
        if not marks:
            return [(None, out)] if out else []
        runs: list[tuple[Hashable, list[tuple[int, Any]]]] = []
        if marks[0][0] > 0:
            runs.append((None, out[: marks[0][0]]))
        for i, (start, owner) in enumerate(marks):
            end = marks[i + 1][0] if i + 1 < len(marks) else len(out)
            if end > start:
                runs.append((owner, out[start:end]))
        return runs

    def on_items(self, items: list[tuple[int, Hashable, Any]], watermark: int, now: int, owner: Hashable) -> None:
        if self._batch_on_items is not None:
            self._batch_on_items(self, items, watermark, now, owner)
            return
        ctx = self.ctx
        ctx.watermark = watermark
        ctx.now = now
        logics = self.logics
        build = self.config.build
        owners = self.owner
        for ts, key, value in items:
            logic = logics.get(key)
            ctx.key = key
            if logic is None:
                logic = logics[key] = build(None)
                owners[key] = owner
            try:
                logic.on_item(ts, value, ctx)
            except Exception as exc:  # one bad item must not stop the rest: it is dead-lettered
                self.errors.append((ts, value, repr(exc)))
        if self.spill is not None:
            self.prune_timers()

    def _rearm(self, key: Hashable, logic: Logic) -> None:
        """A key came back from the spill store: its timers go back on the heaps."""
        t = logic.notify_at()
        if t is not None:
            heapq.heappush(self.event_timers, (t, self.seq(), key))
        for p in getattr(logic, "proc_timers", ()):
            heapq.heappush(self.proc_timers, (p, self.seq(), key))

    def prune_timers(self) -> None:
        """With a spill store: drop heap entries of keys spilled since (their timers are on disk),
        once the heaps outgrow the keys in memory."""
        spill = self.spill
        if spill is None:
            return
        bound = 2 * spill.max_keys + 1024
        for name in ("event_timers", "proc_timers"):
            heap: list[tuple[int, int, Hashable]] = getattr(self, name)
            if len(heap) > bound:
                kept = [entry for entry in heap if spill.is_hot(entry[2])]
                heapq.heapify(kept)
                setattr(self, name, kept)

    def on_watermark(self, watermark: int, now: int) -> None:
        spill = self.spill
        if spill is not None:
            while True:  # spilled keys due now come back (their timers re-armed), a bounded batch at a time
                due = spill.due_event(watermark, max(spill.max_keys // 2, 1))
                for key in due:
                    spill[key]
                self._fire_event_timers(watermark, now)
                if not due:
                    break
            self.prune_timers()
            return
        self._fire_event_timers(watermark, now)

    def _fire_event_timers(self, watermark: int, now: int) -> None:
        timers = self.event_timers
        if not timers or timers[0][0] > watermark:
            return
        ctx = self.ctx
        ctx.watermark = watermark
        ctx.now = now
        due: list[Hashable] = []
        seen: set[Hashable] = set()
        while timers and timers[0][0] <= watermark:
            _, _, key = heapq.heappop(timers)
            if key not in seen:
                seen.add(key)
                due.append(key)
        for key in due:
            logic = self.logics.get(key)
            if logic is None:
                continue
            ctx.key = key
            self._owned_by(key)
            logic.on_watermark(watermark, ctx)
            if logic.is_empty():
                del self.logics[key]
                self.owner.pop(key, None)
                self.dirty.discard(key)

    def on_notify(self, now: int, watermark: int) -> None:
        spill = self.spill
        if spill is None:
            self._notify(now, watermark)
            return
        while True:  # spilled keys with a timer due come back (re-armed), a bounded batch at a time
            due = spill.due_proc(now, max(spill.max_keys // 2, 1))
            for key in due:
                spill[key]
            self._notify(now, watermark)
            if not due:
                break
        self.prune_timers()

    def _notify(self, now: int, watermark: int) -> None:
        ctx = self.ctx
        ctx.watermark = watermark
        ctx.now = now
        keys: list[Hashable] = list(self.dirty)
        self.dirty.clear()
        timers = self.proc_timers
        while timers and timers[0][0] <= now:
            keys.append(heapq.heappop(timers)[2])
        for key in dict.fromkeys(keys):
            logic = self.logics.get(key)
            if logic is not None:
                ctx.key = key
                self._owned_by(key)
                logic.on_notify(now, ctx)

    def on_eof(self, watermark: int, now: int) -> None:
        ctx = self.ctx
        ctx.watermark = watermark
        ctx.now = now
        for key, logic in list(self.logics.items()):
            ctx.key = key
            self._owned_by(key)
            logic.on_eof(ctx)

    # -- checkpoints ------------------------------------------------------------------------

    def snapshot(self, owners: Callable[[Hashable], bool] | None = None) -> list[list[Any]]:
        """``[[key, owner, state], …]`` for keys owned by partitions ``owners`` accepts."""
        if self.spill is not None:
            return [[key, owner, state] for key, owner, state in self.spill.entries()
                    if owners is None or owners(owner)]
        return [
            [key, self.owner.get(key), logic.snapshot()]
            for key, logic in self.logics.items()
            if owners is None or owners(self.owner.get(key))
        ]

    def restore(self, entries: list[list[Any]], watermark: int) -> None:
        if self.spill is not None:
            with self.spill.untracked():
                self._restore(entries, watermark)
            return
        self._restore(entries, watermark)

    def _restore(self, entries: list[list[Any]], watermark: int) -> None:
        ctx = self.ctx
        ctx.watermark = watermark
        for key, owner, state in entries:
            key = _hashable(key)
            logic = self.config.build(state)
            self.logics[key] = logic
            self.owner[key] = _hashable(owner)
            ctx.key = key
            t = logic.notify_at()
            if t is not None:
                ctx.schedule_event(t)
            for p in getattr(logic, "proc_timers", ()):
                ctx.schedule_proc(p)

    def drop(self, owners: Callable[[Hashable], bool]) -> None:
        """Forget keys owned by partitions this instance no longer reads (after a rebalance)."""
        if self.spill is not None:
            with self.spill.untracked():
                self._drop(owners)
            return
        self._drop(owners)

    def _drop(self, owners: Callable[[Hashable], bool]) -> None:
        for key in [k for k, o in self.owner.items() if owners(o)]:
            self.logics.pop(key, None)
            self.owner.pop(key, None)
            self.dirty.discard(key)


def _hashable(value: Any) -> Any:
    """msgpack turns tuples into lists; keys must be hashable again after a restore."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value
