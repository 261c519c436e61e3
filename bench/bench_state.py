"""Spill-to-disk store for keyed window state: RocksDB (``rocksdict``) vs sqlite3, on the access
pattern a spilling keyed operator has (``processors.state_store``).

Pattern: N keys, each key's window state a ~120 B msgpack blob. A stream of records visits keys
(uniform random, and skewed: 80 % of records on 20 % of keys); a visit that misses the in-memory
LRU reads the key's blob (get) and writes back the evicted key's blob (put); a window closing
deletes the key (delete). Both stores are scratch (the checkpoint is the durable copy): RocksDB
without WAL, sqlite3 with ``journal_mode=OFF, synchronous=OFF``.

Run: ``python -m bench.bench_state [--keys 200000 --ops 400000]``.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import rocksdict

__all__ = ["main"]


def blob(i: int) -> bytes:
    return msgpack.packb({"w": [[1_700_000_000_000 + i * 10, [i, 65.5 + i % 7, 3]]], "s": []})


class Sqlite:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path / "state.sqlite", isolation_level=None)
        self.db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;"
                              "CREATE TABLE s (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID;")

    def put(self, k: bytes, v: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO s VALUES (?, ?)", (k, v))

    def get(self, k: bytes) -> bytes | None:
        row = self.db.execute("SELECT v FROM s WHERE k = ?", (k,)).fetchone()
        return None if row is None else bytes(row[0])

    def delete(self, k: bytes) -> None:
        self.db.execute("DELETE FROM s WHERE k = ?", (k,))

    def close(self) -> None:
        self.db.close()


class Rocks:
    def __init__(self, path: Path) -> None:
        options = rocksdict.Options(raw_mode=True)
        self.db = rocksdict.Rdict(str(path / "state.rocks"), options)
        write = rocksdict.WriteOptions()
        write.disable_wal = True  # type: ignore[method-assign,assignment]  # a property (the stub says method)
        self.db.set_write_options(write)

    def put(self, k: bytes, v: bytes) -> None:
        self.db.put(k, v)

    def get(self, k: bytes) -> bytes | None:
        raw = self.db.get(k)
        return None if raw is None else bytes(raw)

    def delete(self, k: bytes) -> None:
        self.db.delete(k)

    def close(self) -> None:
        self.db.close()


def run(make: Callable[[Path], Sqlite | Rocks], keys: int, ops: int, skewed: bool) -> float:
    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as d:
        store = make(Path(d))
        names = [f"sensor_{i}".encode() for i in range(keys)]
        for i, k in enumerate(names):
            store.put(k, blob(i))
        hot = max(1, keys // 5)
        start = time.perf_counter()
        for n in range(ops):
            i = rng.randrange(hot) if skewed and rng.random() < 0.8 else rng.randrange(keys)
            k = names[i]
            if n % 50 == 49:  # a window closed: the key's state goes
                store.delete(k)
                continue
            store.get(k)
            store.put(names[(i + 1) % keys], blob(n))  # the evicted key written back
        elapsed = time.perf_counter() - start
        store.close()
    return ops / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--ops", type=int, default=400_000)
    args = parser.parse_args()
    print(f"keys {args.keys}, ops {args.ops} (get + put per op, a delete every 50)")
    for skewed in (False, True):
        stores: tuple[tuple[str, Callable[[Path], Sqlite | Rocks]], ...] = (("sqlite3", Sqlite), ("rocksdict", Rocks))
        rates = {name: run(make, args.keys, args.ops, skewed) for name, make in stores}
        label = "skewed 80/20" if skewed else "uniform"
        print(f"{label}: " + ", ".join(f"{n} {r:,.0f} ops/s" for n, r in rates.items())
              + f"; rocksdict/sqlite3 {rates['rocksdict'] / rates['sqlite3']:.2f}x")


if __name__ == "__main__":
    main()
