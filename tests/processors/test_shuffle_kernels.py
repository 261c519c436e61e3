"""The repartition topic's record loops (``processors.shuffle_kernels``), compiled and pure: what the
upstream writes is a RecordBatch that Kafka clients and Sluice's broker read as the records the stage
meant (keys, values, timestamps in any order, the sequence and mark headers; transactional batches
with their producer state), and the downstream reads them back as ``ShuffleReader`` defines."""

from __future__ import annotations

import json
import random
from types import ModuleType
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch

from broker import native
from broker.log.partitioner import partition_for_key
from broker.protocol.records import decode_all
from processors import jsonvalues, repartition, shuffle_kernels
from processors.executor import OutBatch
from processors.kafka import _PreparedBuilder
from processors.repartition import decode_key, encode_key

SELECTED = native.select(shuffle_kernels)
PURE = native.pure("processors.shuffle_kernels")
BUILDS = pytest.mark.parametrize("kernels", [SELECTED, PURE], ids=["selected", "pure"])


def test_the_compiled_kernels_are_built_where_the_install_could_build_them() -> None:
    if not native.is_compiled(SELECTED):
        pytest.skip("shuffle_kernels not compiled here (make native builds it)")
    assert not native.is_compiled(PURE)


def test_the_header_names_are_the_repartition_modules() -> None:
    assert (PURE.HEADER_SHUFFLE_SEQ, PURE.HEADER_SHUFFLE_MARK) == (
        repartition.HEADER_SHUFFLE_SEQ, repartition.HEADER_SHUFFLE_MARK)


def _locate(partitions: int) -> Any:
    def locate(key: Any) -> tuple[bytes, int]:
        raw = encode_key(key)
        return raw, partition_for_key(raw, partitions)
    return locate


def _batches(kernels: ModuleType, items: list[tuple[int, Any]], raws: list[bytes | None] | None, partitions: int,
             key_fn: Any = lambda v: v["k"]) -> tuple[dict[int, list[OutBatch]], list[int], list[Any]]:
    builders = [kernels.RecordsBuilder(p) for p in range(partitions)]
    counters = [0] * partitions
    finished: list[Any] = []
    failures: list[Any] = []
    kernels.write_items(items, raws, key_fn, {}, _locate(partitions), lambda v: json.dumps(v).encode(), builders,
                        counters, b"in:3:", finished, failures)
    for b in builders:
        b.add_mark(b'{"wm":5}', 7)
        last = b.finish()
        if last is not None:
            finished.append(last)
        assert b.finish() is None  # started afresh
    out: dict[int, list[OutBatch]] = {}
    for p, records, count, base_ts, max_ts in finished:
        out.setdefault(p, []).append(OutBatch("t", None, records, (), base_ts, p, count, max_ts))
    return out, counters, failures


@BUILDS
def test_written_batches_read_back_by_aiokafka_and_the_broker_as_the_items_in_order(kernels: ModuleType) -> None:
    rng = random.Random(5)
    # timestamps out of order (negative deltas), far apart (long varints), values of every length class
    items = [(1_700_000_000_000 + rng.randrange(-100_000, 10_000_000), {"k": f"s{rng.randrange(7)}", "i": i,
              "pad": "x" * rng.choice([0, 5, 70, 200, 20_000])}) for i in range(400)]
    raws: list[bytes | None] = [json.dumps(v).encode() for _, v in items]
    batches, counters, failures = _batches(kernels, items, raws, 3)
    assert failures == []
    assert sum(counters) == len(items)
    expected: dict[int, list[tuple[int, bytes, bytes]]] = {}
    for (ts, v), raw in zip(items, raws, strict=True):
        key = encode_key(v["k"])
        expected.setdefault(partition_for_key(key, 3), []).append((ts, key, raw or b""))
    for p, outs in batches.items():
        assert len(outs) > 1 or sum(len(o.value or b"") for o in outs) < shuffle_kernels.BATCH_BYTES + 30_000
        seen: list[tuple[int, bytes, bytes]] = []
        seqs: list[bytes] = []
        marks = 0
        for o in outs:
            data = _PreparedBuilder(o, False)._build()
            batch = DefaultRecordBatch(data)
            assert batch.validate_crc()
            ours = decode_all(data)  # the broker's reading of the same bytes
            theirs = list(batch)
            assert [(r.offset, r.timestamp, r.key, r.value) for r in ours] == [
                (r.offset, r.timestamp, r.key, r.value) for r in theirs]
            assert batch.max_timestamp == max(r.timestamp for r in theirs)
            for r in theirs:
                (name, value), = r.headers
                if name == repartition.HEADER_SHUFFLE_MARK:
                    assert (r.key, r.value, value, r.timestamp) == (None, b"", b'{"wm":5}', 7)
                    marks += 1
                    continue
                assert name == repartition.HEADER_SHUFFLE_SEQ
                seen.append((r.timestamp, r.key, r.value))
                seqs.append(value)
        assert seen == expected[p]
        assert seqs == [f"in:3:{n}".encode() for n in range(len(seen))]
        assert marks == 1  # after every record of the partition
    assert len(batches[max(batches, key=lambda p: len(batches[p]))]) > 1  # 20 kB values filled some batches


@BUILDS
def test_a_transactional_batch_carries_the_producer_state_aiokafka_sets(kernels: ModuleType) -> None:
    batches, _, _ = _batches(kernels, [(10, {"k": "a"}), (5, {"k": "a"})], None, 1)
    builder = _PreparedBuilder(batches[0][0], True)
    builder._set_producer_state(77, 3, 1_000)
    batch = DefaultRecordBatch(builder._build())
    assert batch.validate_crc() and batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 3, 1_000)
    assert (batch.first_timestamp, batch.max_timestamp, batch.last_offset_delta) == (10, 10, 2)
    assert [json.loads(r.value) if r.value else None for r in batch] == [{"k": "a"}, {"k": "a"}, None]


@BUILDS
def test_keys_that_fail_or_cannot_be_hashed(kernels: ModuleType) -> None:
    """A key that cannot be hashed (a list, a tuple holding one) crosses, located each time rather than
    cached; a key function that raises, or a value JSON cannot carry, is a failure for the caller to
    dead-letter."""
    items = [(1, {"k": ["x", [1]]}), (2, {"nok": 1}), (3, {"k": "a", "v": {1, 2}}), (4, {"k": "a"}),
             (5, {"k": ["y"]})]
    batches, counters, failures = _batches(kernels, items, None, 2,
                                           key_fn=lambda v: tuple(v["k"]) if v["k"][0] == "x" else v["k"])
    assert [(ts, type(exc)) for ts, _, exc in failures] == [(2, KeyError), (3, TypeError)]
    records = [r for outs in batches.values() for o in outs
               for r in DefaultRecordBatch(_PreparedBuilder(o, False)._build())]
    assert sorted((decode_key(r.key) for r in records if r.key), key=repr) == ["a", ("x", (1,)), ("y",)]
    assert sum(counters) == 3


class Rec:
    def __init__(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], ts: int = 1) -> None:
        self.key, self.value, self.headers, self.timestamp, self.offset = key, value, headers, ts, 0


def _seq(origin: str, n: int) -> list[tuple[str, bytes]]:
    return [("other", b"x"), (repartition.HEADER_SHUFFLE_SEQ, f"{origin}:{n}".encode())]


@BUILDS
def test_reading_drops_numbers_seen_and_sorts_out_marks_and_bad_records(kernels: ModuleType) -> None:
    mark = Rec(None, b"", [(repartition.HEADER_SHUFFLE_MARK, b"{}")])
    records = [
        Rec(b'"a"', b'{"v":1}', _seq("in:0", 4)),  # at or below 5, seen before: a replay
        Rec(b'"a"', b'{"v":2}', _seq("in:0", 6)),
        mark,
        Rec(b'["b",1]', b'{"v":3}', _seq("in:1", 0)),
        Rec(b'"a"', b'{"v":4}', _seq("in:0", 6)),  # the same number again
        Rec(b'"a"', b"{bad", _seq("in:0", 7)),  # undecodable: not counted as seen
        Rec(b'"a"', b'{"v":5}', _seq("in:0", 7)),
        Rec(b'"a"', b'{"v":6}', [("other", b"x")]),  # no sequence header
        Rec(b'"a"', b'{"v":7}', [(repartition.HEADER_SHUFFLE_SEQ, b"12")]),  # no origin
        Rec(None, None, _seq("in:1", 1)),
    ]
    seqs = {"in:0": 5}
    marks: list[Any] = []
    bad: list[Any] = []
    items, duplicates = kernels.read_records(records, seqs, {}, {}, decode_key, jsonvalues.loads, marks, bad)
    assert items == [(1, "a", {"v": 2}), (1, ("b", 1), {"v": 3}), (1, "a", {"v": 5}), (1, None, None)]
    assert duplicates == 2
    assert seqs == {"in:0": 7, "in:1": 1}
    assert marks == [mark]
    assert [records.index(r) for r, _ in bad] == [5, 7, 8]
