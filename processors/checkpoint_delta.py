"""Incremental checkpoints of keyed state that lives in a spill store (``state_max_keys``).

A full checkpoint encodes every key each interval: with a million keys that is seconds of CPU per
interval (``python -m bench.bench_state --checkpoint-keys``, bench/RESULTS.md). With a spill store
(``processors.state_store``), which knows the keys accessed and deleted, a partition's checkpoint is

* a **base**: the full keyed state of the partition's keys, written now and then as chunk records
  ``<topic>:<partition>:b<slot>:<i>`` (two slots used in turn, as for large checkpoints: the base the
  newest complete checkpoint refers to is never overwritten by the next one), and
* a **head** (the partition's usual record, format version 3): offsets, time, extensions, and the
  *cumulative* delta since the base: the state of every key touched since, and the keys gone since.

Restore = base, then the head's delta on top (``CheckpointCodec.decode``). The head is written after its
base, as one record, so a crash mid-write leaves the previous complete checkpoint in force, and a
compacted topic (which keeps the newest record per key) keeps what the newest head needs.

When to write a new base (``DeltaTracker.needs_base``): when none is known for the partition (first
checkpoint, or a partition that arrived without one), or when the delta has grown past a fraction
``T`` of the base. A full write costs the base size ``N``, each head its delta; with a fraction ``r`` of
the keys touched per interval the cost per interval is ``N (T/2 + r/T)``, least at ``T = sqrt(2r)``:
``T`` follows the measured ``r`` (between 5 % and 50 %). Keys touched in every interval make every
checkpoint about a full one, as before; keys that go quiet cost nothing.

Per key in memory: the set of keys touched since the base, per partition (bounded by the rebase rule
to ``T`` times the partition's keys).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from processors.executor import Executor, TopicPartition
from processors.logic import SpillStore

__all__ = ["BaseRef", "DeltaTracker", "Increment", "incremental_stores"]

MIN_FRACTION = 0.05
MAX_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class BaseRef:
    ident: str
    slot: int
    chunks: int
    keys: int  # keys in the base (the rebase rule compares the delta with it)


@dataclass
class Increment:
    """What one partition's head carries: the delta since its base, and the base when written now."""

    ops: dict[str, list[list[Any]]] = field(default_factory=dict)  # op -> [[key, owner, state], …] touched
    gone: dict[str, list[Any]] = field(default_factory=dict)  # op -> keys deleted since the base
    base: dict[str, list[list[Any]]] | None = None  # op -> every key's entry: a new base


def incremental_stores(ex: Executor) -> dict[str, SpillStore] | None:
    """The keyed operators' spill stores by operator id, or None when any keeps its state in a dict
    (then checkpoints are full)."""
    stores: dict[str, SpillStore] = {}
    for nid, node in ex.keyed.items():
        spill = node.rt.spill
        if spill is None:
            return None
        stores[str(nid)] = spill
    return stores or None


class DeltaTracker:
    """Per partition: the base written or restored last, and the keys touched since."""

    def __init__(self) -> None:
        self.bases: dict[TopicPartition, BaseRef] = {}
        self.touched: dict[TopicPartition, dict[str, set[Hashable]]] = {}
        self._rate: dict[TopicPartition, float] = {}  # fraction of the base touched in the last interval
        # restored or taken over: the next checkpoint writes a base (stores that trim the log learn
        # where a partition's records start from the writes they make)
        self._rebase: set[TopicPartition] = set()

    def collect(self, stores: dict[str, SpillStore]) -> None:
        """Take the stores' changes into the partitions' touched sets (keys by their owner)."""
        added: dict[TopicPartition, int] = {}
        for op, store in stores.items():
            changed, deleted = store.take_changes()
            owners = store.owners
            pairs = [(key, owners.get(key)) for key in changed] + list(deleted.items())
            for key, owner in pairs:
                if owner is not None:
                    tp = _tp(owner)
                    added[tp] = added.get(tp, 0) + self._touch(tp, op, key)
        for tp, n in added.items():
            ref = self.bases.get(tp)
            self._rate[tp] = n / max(ref.keys if ref else 1, 1)

    def _touch(self, tp: TopicPartition, op: str, key: Hashable) -> int:
        keys = self.touched.setdefault(tp, {}).setdefault(op, set())
        if key in keys:
            return 0
        keys.add(key)
        return 1

    def needs_base(self, tp: TopicPartition) -> bool:
        ref = self.bases.get(tp)
        if ref is None or tp in self._rebase:
            return True
        fraction = min(MAX_FRACTION, max(MIN_FRACTION, math.sqrt(2 * self._rate.get(tp, 0.0))))
        return sum(len(keys) for keys in self.touched.get(tp, {}).values()) > fraction * max(ref.keys, 1)

    def increments(self, stores: dict[str, SpillStore], tps: set[TopicPartition]) -> dict[TopicPartition, Increment]:
        """The increment of each of ``tps`` now: a new base for those that need one (one pass over
        every key), the touched keys' state and the gone keys for the others."""
        self.collect(stores)
        out = {tp: Increment() for tp in tps}
        rebase = {tp for tp in tps if self.needs_base(tp)}
        if rebase:
            for op, store in stores.items():
                for tp in rebase:
                    out[tp].base = out[tp].base or {}
                    out[tp].base.setdefault(op, [])  # type: ignore[union-attr]
                for key, owner, state in store.entries():
                    where = None if owner is None else _tp(owner)
                    if where in rebase:
                        out[where].base[op].append([key, owner, state])  # type: ignore[index]
            for tp in rebase:
                self.touched.pop(tp, None)
                self._rebase.discard(tp)
        for tp in tps - rebase:
            inc = out[tp]
            for op, keys in self.touched.get(tp, {}).items():
                store = stores[op]
                entries, gone = inc.ops.setdefault(op, []), inc.gone.setdefault(op, [])
                for key in keys:
                    found = store.snapshot_of(key)
                    if found is not None and found[0] is not None and _tp(found[0]) == tp:
                        entries.append([key, found[0], found[1]])
                    else:
                        gone.append(key)
        return out

    def based(self, tp: TopicPartition, ref: BaseRef) -> None:
        """A new base of ``tp`` was written (or restored)."""
        self.bases[tp] = ref

    def adopt(self, tp: TopicPartition, ref: BaseRef | None, touched: dict[str, list[Any]]) -> None:
        """``tp`` was assigned with this checkpoint: its next checkpoint writes a new base, in the
        slot its restored base is not in (so that one stays until the new head is written)."""
        self.touched.pop(tp, None)
        self._rate.pop(tp, None)
        self._rebase.add(tp)
        if ref is None:
            self.bases.pop(tp, None)
            return
        self.bases[tp] = ref
        self.touched[tp] = {op: {_hashable(k) for k in keys} for op, keys in touched.items()}

    def forget(self, tp: TopicPartition) -> None:
        self._rebase.discard(tp)
        self.bases.pop(tp, None)
        self.touched.pop(tp, None)
        self._rate.pop(tp, None)


def _tp(owner: Any) -> TopicPartition:
    return (owner[0], owner[1])


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value
