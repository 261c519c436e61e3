"""Keyed state that outgrows memory: at most ``max_keys`` live per-key logics per keyed operator,
the least recently used ones spilled to an embedded RocksDB (``rocksdict``) as their checkpoint
snapshot, and rebuilt from it on the next access.

``KeyedRuntime.logics`` (``processors.logic``) is a ``MutableMapping``; ``SpillingLogics`` is one,
so windows, ``process`` functions (with ``processors.state``'s value/list/map state, which lives in
the logic) and rolling reductions spill without knowing it. A key lives either in memory or on
disk, never both. The store is scratch: it is emptied at start, since the checkpoint (which reads
spilled keys back) is the durable copy and a restart restores from it.

What stays in memory per key regardless: its owner partition and its timers (a few dozen bytes).
A checkpoint still encodes every key's state (msgpack bytes, transiently).

Why RocksDB: ``python -m bench.bench_state`` (get + put per access, a delete per closed window,
200,000 keys) measured rocksdict 4.3-4.6x sqlite3's rate (bench/RESULTS.md); LMDB's binding is
not installed and would need a fixed map size.
"""

from __future__ import annotations

import shutil
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import msgpack
import rocksdict

from processors.errors import StateError
from processors.logic import Logic, _hashable

__all__ = ["SpillingLogics", "spilling_factory"]


def _pack(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise StateError(f"keyed state cannot be spilled to disk (not plain data): {exc}") from exc


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


class SpillingLogics(MutableMapping[Hashable, Logic]):
    """An LRU of at most ``max_keys`` logics in memory over a RocksDB of the others' snapshots."""

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
        self._on_disk = 0
        self.spilled = 0  # logics written to disk (counted, for status and tests)
        self.loaded = 0  # logics rebuilt from disk

    def _take_from_disk(self, key: Hashable) -> Any:
        """The key's spilled snapshot, removed from disk; None when it is not there."""
        k = _pack(key)
        if not self._db.key_may_exist(k):
            return None
        raw = self._db.get(k)
        if raw is None:
            return None
        self._db.delete(k)
        self._on_disk -= 1
        return _unpack(raw)

    def _evict(self) -> None:
        while len(self._hot) > self.max_keys:
            key, logic = self._hot.popitem(last=False)
            self._db.put(_pack(key), _pack(logic.snapshot()))
            self._on_disk += 1
            self.spilled += 1

    def __getitem__(self, key: Hashable) -> Logic:
        logic = self._hot.get(key)
        if logic is not None:
            self._hot.move_to_end(key)
            return logic
        state = self._take_from_disk(key)
        if state is None:
            raise KeyError(key)
        logic = self._hot[key] = self.build(state)
        self.loaded += 1
        self._evict()
        return logic

    def __setitem__(self, key: Hashable, logic: Logic) -> None:
        if key in self._hot:
            self._hot.move_to_end(key)
        else:
            self._take_from_disk(key)  # replaced: the spilled copy goes
        self._hot[key] = logic
        self._evict()

    def __delitem__(self, key: Hashable) -> None:
        if self._hot.pop(key, None) is None and self._take_from_disk(key) is None:
            raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if key in self._hot:
            return True
        k = _pack(key)
        return bool(self._db.key_may_exist(k)) and self._db.get(k) is not None

    def __iter__(self) -> Iterator[Hashable]:
        yield from list(self._hot)
        for raw in self._db.keys():  # noqa: SIM118 - an Rdict, not a dict
            yield _hashable(_unpack(bytes(raw)))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._hot) + self._on_disk

    def items(self) -> list[tuple[Hashable, Logic]]:  # type: ignore[override]
        """Every key with its logic; spilled ones are rebuilt for the caller and stay on disk (a
        checkpoint reads them without turning the LRU over)."""
        out: list[tuple[Hashable, Logic]] = list(self._hot.items())
        out += [(_hashable(_unpack(bytes(k))), self.build(_unpack(bytes(v))))  # type: ignore[arg-type]
                for k, v in self._db.items()]
        return out

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
