"""Keyed state that outgrows memory: at most ``max_keys`` keys per keyed operator live in memory, the
least recently used ones spilled to an embedded RocksDB (``rocksdict``) and rebuilt on their next
access.

``KeyedRuntime.logics`` (``processors.logic``) is a ``MutableMapping``; ``SpillingLogics`` is one, so
windows, ``process`` functions (with ``processors.state``'s value/list/map state, which lives in the
logic) and rolling reductions spill without knowing it. A key lives either in memory or on disk,
never both, and *all* of its state goes with it:

* its logic's snapshot and its **owner** (the source partition it is checkpointed with): one disk
  record, ``k`` + key → ``[owner, snapshot, event time, processing time]``; ``owners`` is the
  runtime's key → owner map, served from memory for hot keys and from that record for cold ones;
* its **timers**: a spilled key's next event-time wake-up (``Logic.notify_at``) and its earliest
  processing-time timer are index entries on disk (``e``/``p`` + time + key, in time order). The
  runtime asks ``due_event`` / ``due_proc`` for the keys whose time has come, loads them, and
  ``on_load`` puts their timers back on its in-memory heaps; heap entries of keys that have since
  been spilled are dropped when the heaps outgrow the hot keys (``prune_timers``).

What stays in memory per key beyond the bound: nothing for a cold key, except while it is in a set
of keys changed since the last checkpoint or early firing (``processors.logic`` ``dirty``). The store
is scratch: it is emptied at start, since the checkpoint (which reads spilled keys back) is the
durable copy and a restart restores from it.

Why RocksDB: ``python -m bench.bench_state`` (get + put per access, a delete per closed window,
200,000 keys) measured rocksdict 4.3-4.6x sqlite3's rate (bench/RESULTS.md); LMDB's binding is
not installed and would need a fixed map size.
"""

from __future__ import annotations

import contextlib
import shutil
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import msgpack
import rocksdict

from processors.errors import StateError
from processors.logic import Logic, SpillStore, _hashable

__all__ = ["SpillingLogics", "spilling_factory"]

_STATE, _EVENT, _PROC = b"k", b"e", b"p"  # key prefixes: state records, event / processing timer index
_TIME_BIAS = 1 << 63  # signed times as unsigned big-endian: byte order is time order


def _pack(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise StateError(f"keyed state cannot be spilled to disk (not plain data): {exc}") from exc


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def _timer_key(prefix: bytes, t: int, packed_key: bytes) -> bytes:
    return prefix + (t + _TIME_BIAS).to_bytes(8, "big") + packed_key


class _Owners(MutableMapping[Hashable, Hashable]):
    """key -> owner partition for every key of a ``SpillingLogics``, hot or spilled."""

    def __init__(self, store: SpillingLogics) -> None:
        self.store = store

    def __getitem__(self, key: Hashable) -> Hashable:
        hot = self.store._owner
        if key in hot:
            return hot[key]
        record = self.store._record(key)
        if record is None:
            raise KeyError(key)
        return _hashable(record[0])

    def __setitem__(self, key: Hashable, owner: Hashable) -> None:
        if key in self.store._hot:
            self.store._owner[key] = owner
            return
        record = self.store._record(key)
        if record is None:
            raise KeyError(key)  # an owner belongs to a key that has state
        record[0] = owner
        self.store._db.put(_STATE + _pack(key), _pack(record))

    def __delitem__(self, key: Hashable) -> None:
        if self.store._owner.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)  # a spilled key's owner goes with its state (``del logics[key]``)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.store)

    def __len__(self) -> int:
        return len(self.store)

    def items(self) -> list[tuple[Hashable, Hashable]]:  # type: ignore[override]
        out = list(self.store._owner.items())
        out += [(key, _hashable(record[0])) for key, record in self.store._records()]
        return out


_MISSING = object()


class SpillingLogics(SpillStore):
    """An LRU of at most ``max_keys`` logics in memory over a RocksDB of the others (see the module rules)."""

    def __init__(self, build: Callable[[Any], Logic], max_keys: int, directory: Path) -> None:
        if max_keys < 1:
            raise StateError(f"the in-memory key bound must be at least 1, not {max_keys}")
        self.build = build
        self.max_keys = max_keys
        self.directory = directory
        shutil.rmtree(directory, ignore_errors=True)  # scratch: the checkpoint is the durable copy
        directory.parent.mkdir(parents=True, exist_ok=True)
        self._db = rocksdict.Rdict(str(directory), rocksdict.Options(raw_mode=True))
        write = rocksdict.WriteOptions()
        write.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; nothing here must survive a crash
        self._db.set_write_options(write)
        self._hot: OrderedDict[Hashable, Logic] = OrderedDict()
        self._owner: dict[Hashable, Hashable] = {}  # hot keys' owners (spilled ones: in their record)
        self.owners = _Owners(self)
        self._on_disk = 0
        self._timers_on_disk = {_EVENT: 0, _PROC: 0}
        self.on_load: Callable[[Hashable, Logic], None] | None = None  # the runtime re-arms the timers
        # what changed since ``take_changes``, for incremental checkpoints (``processors.checkpoint``):
        # keys accessed (a logic may change on any access) and keys deleted, with their owner
        self.tracking = True
        self.changed: set[Hashable] = set()
        self.deleted: dict[Hashable, Hashable] = {}
        self.spilled = 0  # logics written to disk (counted, for status and tests)
        self.loaded = 0  # logics rebuilt from disk

    # -- disk records ---------------------------------------------------------------------------

    def _record(self, key: Hashable) -> list[Any] | None:
        k = _STATE + _pack(key)
        if not self._db.key_may_exist(k):
            return None
        raw = self._db.get(k)
        return None if raw is None else list(_unpack(raw))

    def _records(self) -> Iterator[tuple[Hashable, list[Any]]]:
        for k, v in self._db.items(from_key=_STATE):
            raw_key = bytes(k)  # type: ignore[arg-type]  # raw mode: bytes
            if not raw_key.startswith(_STATE):
                break
            yield _hashable(_unpack(raw_key[1:])), list(_unpack(bytes(v)))

    def _take_from_disk(self, key: Hashable) -> list[Any] | None:
        """The key's spilled record (owner, snapshot, timers), removed from disk with its timer
        entries; None when it is not there."""
        packed = _pack(key)
        k = _STATE + packed
        if not self._db.key_may_exist(k):
            return None
        raw = self._db.get(k)
        if raw is None:
            return None
        record = list(_unpack(raw))
        self._db.delete(k)
        self._on_disk -= 1
        for prefix, t in ((_EVENT, record[2]), (_PROC, record[3])):
            if t is not None:
                self._db.delete(_timer_key(prefix, t, packed))
                self._timers_on_disk[prefix] -= 1
        return record

    def _evict(self) -> None:
        while len(self._hot) > self.max_keys:
            key, logic = self._hot.popitem(last=False)
            packed = _pack(key)
            event_t = logic.notify_at()
            proc = getattr(logic, "proc_timers", None)
            proc_t = min(proc) if proc else None
            self._db.put(_STATE + packed, _pack([self._owner.pop(key, None), logic.snapshot(), event_t, proc_t]))
            for prefix, t in ((_EVENT, event_t), (_PROC, proc_t)):
                if t is not None:
                    self._db.put(_timer_key(prefix, t, packed), b"")
                    self._timers_on_disk[prefix] += 1
            self._on_disk += 1
            self.spilled += 1

    def _load(self, key: Hashable, record: list[Any]) -> Logic:
        logic = self._hot[key] = self.build(record[1])
        self._owner[key] = _hashable(record[0])
        self.loaded += 1
        if self.on_load is not None:
            self.on_load(key, logic)
        self._evict()
        return logic

    # -- the mapping ----------------------------------------------------------------------------

    def __getitem__(self, key: Hashable) -> Logic:
        logic = self._hot.get(key)
        if logic is not None:
            self._hot.move_to_end(key)
            if self.tracking:
                self.changed.add(key)
            return logic
        if self.tracking:
            self.changed.add(key)  # (a miss adds a key that is not there: take_changes sees it has no owner)
        record = self._take_from_disk(key)
        if record is None:
            raise KeyError(key)
        return self._load(key, record)

    def __setitem__(self, key: Hashable, logic: Logic) -> None:
        if self.tracking:
            self.changed.add(key)
        if key in self._hot:
            self._hot.move_to_end(key)
        else:
            replaced = self._take_from_disk(key)  # the spilled copy goes; its owner stays the key's
            if replaced is not None:
                self._owner[key] = _hashable(replaced[0])
        self._hot[key] = logic
        self._evict()

    def __delitem__(self, key: Hashable) -> None:
        owner = self._owner.get(key)
        if self._hot.pop(key, None) is None:
            record = self._take_from_disk(key)
            if record is None:
                raise KeyError(key)
            owner = _hashable(record[0])
        self._owner.pop(key, None)
        if self.tracking:
            self.deleted[key] = owner
            self.changed.discard(key)

    def take_changes(self) -> tuple[set[Hashable], dict[Hashable, Hashable]]:
        """Keys accessed and keys deleted (with their owner) since the last call."""
        changed, self.changed = self.changed, set()
        deleted, self.deleted = self.deleted, {}
        return changed, deleted

    @contextlib.contextmanager
    def untracked(self) -> Iterator[None]:
        """Restores and drops: what they change is not a change to checkpoint."""
        self.tracking = False
        try:
            yield
        finally:
            self.tracking = True

    def snapshot_of(self, key: Hashable) -> tuple[Hashable, Any] | None:
        """``(owner, snapshot)`` of one key, hot or spilled (not loaded); None when it has no state."""
        logic = self._hot.get(key)
        if logic is not None:
            return self._owner.get(key), logic.snapshot()
        record = self._record(key)
        return None if record is None else (_hashable(record[0]), record[1])

    def __contains__(self, key: object) -> bool:
        if key in self._hot:
            return True
        k = _STATE + _pack(key)
        return bool(self._db.key_may_exist(k)) and self._db.get(k) is not None

    def __iter__(self) -> Iterator[Hashable]:
        yield from list(self._hot)
        for key, _ in self._records():
            yield key

    def __len__(self) -> int:
        return len(self._hot) + self._on_disk

    def items(self) -> list[tuple[Hashable, Logic]]:  # type: ignore[override]
        """Every key with its logic; spilled ones are rebuilt for the caller and stay on disk (a
        checkpoint reads them without turning the LRU over)."""
        out: list[tuple[Hashable, Logic]] = list(self._hot.items())
        out += [(key, self.build(record[1])) for key, record in self._records()]
        return out

    def entries(self) -> Iterator[tuple[Hashable, Hashable, Any]]:
        """``(key, owner, snapshot)`` of every key; spilled ones straight from their record (no rebuild)."""
        for key, logic in list(self._hot.items()):
            yield key, self._owner.get(key), logic.snapshot()
        for key, record in self._records():
            yield key, _hashable(record[0]), record[1]

    # -- timers of spilled keys -----------------------------------------------------------------

    def _due(self, prefix: bytes, until: int, limit: int) -> list[Hashable]:
        if not self._timers_on_disk[prefix]:
            return []
        keys: list[Hashable] = []
        for k in self._db.keys(from_key=prefix):
            raw = bytes(k)  # type: ignore[arg-type]  # raw mode: bytes
            if not raw.startswith(prefix) or int.from_bytes(raw[1:9], "big") - _TIME_BIAS > until:
                break
            keys.append(_hashable(_unpack(raw[9:])))
            if len(keys) >= limit:
                break
        return keys

    def due_event(self, watermark: int, limit: int) -> list[Hashable]:
        """Spilled keys whose next event-time wake-up is at or before ``watermark`` (at most ``limit``)."""
        return self._due(_EVENT, watermark, limit)

    def due_proc(self, now: int, limit: int) -> list[Hashable]:
        """Spilled keys with a processing-time timer at or before ``now`` (at most ``limit``)."""
        return self._due(_PROC, now, limit)

    def is_hot(self, key: Hashable) -> bool:
        return key in self._hot

    @property
    def in_memory(self) -> int:
        return len(self._hot)

    def close(self) -> None:
        self._db.close()


def spilling_factory(max_keys: int, directory: Path) -> Callable[[str, Callable[[Any], Logic]],
                                                                     MutableMapping[Hashable, Logic]]:
    """For ``Executor(keyed_state=...)``: one store per keyed operator, under ``directory/op-<id>``."""
    def make(op_id: str, build: Callable[[Any], Logic]) -> MutableMapping[Hashable, Logic]:
        return SpillingLogics(build, max_keys, directory / f"op-{op_id}")
    return make
