"""Spill-to-disk store for keyed window state: RocksDB (``rocksdict``) vs sqlite3, on the access
pattern a spilling keyed operator has (``processors.state_store``).

Pattern: N keys, each key's window state a ~120 B msgpack blob. A stream of records visits keys
(uniform random, and skewed: 80 % of records on 20 % of keys); a visit that misses the in-memory
LRU reads the key's blob (get) and writes back the evicted key's blob (put); a window closing
deletes the key (delete). Both stores are scratch (the checkpoint is the durable copy): RocksDB
without WAL, sqlite3 with ``journal_mode=OFF, synchronous=OFF``.

Run: ``python -m bench.bench_state [--keys 200000 --ops 400000]``.

``--checkpoint-keys N [--bound B --touched F]``: checkpoint cost of a keyed window operator with N keys
(full against incremental, ``processors.checkpoint_delta``) and the Python heap per key.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import tempfile
import time
import tracemalloc
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


class _Rec:
    __slots__ = ("headers", "key", "offset", "timestamp", "value")

    def __init__(self, offset: int, value: bytes) -> None:
        self.offset, self.timestamp, self.key, self.value, self.headers = offset, 0, None, value, ()


def checkpoint_cost(keys: int, bound: int | None, touched: float, intervals: int) -> None:
    """A keyed tumbling mean over ``keys`` keys (one open window each), then ``intervals`` checkpoint
    intervals in which a fraction ``touched`` of the keys gets a record: the time and bytes of a full
    checkpoint each interval against an incremental one (base + delta), and the Python heap per key."""
    from processors.aggregations import Mean
    from processors.checkpoint import CheckpointCodec, take_checkpoint
    from processors.executor import Executor
    from processors.pipeline import Pipeline
    from processors.runner import RunnerConfig, keyed_state_factory
    from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness
    from processors.windows import Tumbling

    stream = Pipeline.source("in", group="bench-cp", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(0), all_idle=AllIdlePolicy.HOLD)
    stream.key_by(lambda v: v["k"], repartition=False).window(Tumbling(3_600_000)).aggregate(Mean("x")).sink("out")
    with tempfile.TemporaryDirectory() as d:
        config = RunnerConfig(state_max_keys=bound, state_dir=d)
        ex = Executor(stream.pipeline, 0, keyed_state=keyed_state_factory(config, "bench-cp"))
        tp = ("in", 0)
        ex.add_partition(tp, 0)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        offset = 0
        for i in range(0, keys, 10_000):
            batch = [_Rec(offset + j, b'{"k": "sensor-%d", "x": 1.5, "ts": 1000}' % (i + j))
                     for j in range(min(10_000, keys - i))]
            ex.process(tp, batch, 0)
            offset += len(batch)
        heap = tracemalloc.get_traced_memory()[0] - before
        codec = CheckpointCodec()
        codec.encode(take_checkpoint("bench-cp", ex, {tp: offset}, 0, codec.delta))  # the changed-key sets emptied
        settled = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        label = "all in memory" if bound is None else f"state_max_keys {bound:,}"
        print(f"{keys:,} keys, {label}: Python heap {heap / keys:.0f} B/key after the records, "
              f"{settled / keys:.0f} B/key after a checkpoint")
        rng = random.Random(3)
        for mode in ("full", "incremental"):
            times, sizes = [], []
            for n in range(intervals + 1):
                start = time.perf_counter()
                cp = take_checkpoint("bench-cp", ex, {tp: offset}, 0, codec.delta if mode == "incremental" else None)
                records = codec.encode(cp)
                elapsed = time.perf_counter() - start
                if n:  # the first incremental one is its base
                    times.append(elapsed)
                    sizes.append(sum(len(k) + len(v or b"") for k, v in records))
                chosen = rng.sample(range(keys), int(keys * touched))
                ex.process(tp, [_Rec(offset + j, b'{"k": "sensor-%d", "x": 2.5, "ts": 1000}' % k)
                                for j, k in enumerate(chosen)], 0)
                offset += len(chosen)
            print(f"  {mode} checkpoint, {touched:.1%} of keys touched per interval: "
                  f"median {statistics.median(times):.2f} s, {statistics.median(sizes) / 1e6:.1f} MB")
        ex.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--ops", type=int, default=400_000)
    parser.add_argument("--checkpoint-keys", type=int, default=0,
                        help="measure checkpoint cost and heap per key with this many keys instead")
    parser.add_argument("--bound", type=int, default=100_000, help="state_max_keys for --checkpoint-keys (0: none)")
    parser.add_argument("--touched", type=float, default=0.01)
    parser.add_argument("--intervals", type=int, default=3)
    args = parser.parse_args()
    if args.checkpoint_keys:
        checkpoint_cost(args.checkpoint_keys, args.bound or None, args.touched, args.intervals)
        return
    print(f"keys {args.keys}, ops {args.ops} (get + put per op, a delete every 50)")
    for skewed in (False, True):
        stores: tuple[tuple[str, Callable[[Path], Sqlite | Rocks]], ...] = (("sqlite3", Sqlite), ("rocksdict", Rocks))
        rates = {name: run(make, args.keys, args.ops, skewed) for name, make in stores}
        label = "skewed 80/20" if skewed else "uniform"
        print(f"{label}: " + ", ".join(f"{n} {r:,.0f} ops/s" for n, r in rates.items())
              + f"; rocksdict/sqlite3 {rates['rocksdict'] / rates['sqlite3']:.2f}x")


if __name__ == "__main__":
    main()
