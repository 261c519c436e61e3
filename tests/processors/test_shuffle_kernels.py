"""The repartition topic's record loops (``processors.shuffle_kernels``), compiled and pure: what the
upstream writes is a RecordBatch that Kafka clients and Sluice's broker read as the records the stage
meant (keys, values, timestamps in any order, the sequence and mark headers; transactional batches
with their producer state), and the downstream reads them back as ``ShuffleReader`` defines."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch

from broker import native
from broker.log.partitioner import partition_for_key
from broker.protocol.records import RecordSpec, decode_all, encode_batch
from processors import jsonvalues, repartition, shuffle_kernels
from processors.executor import OutBatch
from processors.fastdecode import SourceRecord
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
    def __init__(self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]],
                 ts: int = 1) -> None:
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
    dedupe = kernels.SeqFilter(seqs, {})
    items, duplicates = kernels.read_records(records, dedupe, {}, decode_key, jsonvalues.loads, marks, bad)
    dedupe.close()
    assert items == [(1, "a", {"v": 2}), (1, ("b", 1), {"v": 3}), (1, "a", {"v": 5}), (1, None, None)]
    assert duplicates == 2
    assert seqs == {"in:0": 7, "in:1": 1}
    assert marks == [mark]
    assert [records.index(r) for r, _ in bad] == [5, 7, 8]


def _section(records: list[Rec], base_offset: int = 100) -> tuple[bytes, int]:
    """``records`` as one RecordBatch v2 (the broker's encoder) and its first timestamp."""
    specs = [RecordSpec(r.value, r.key, tuple(r.headers), r.timestamp) for r in records]
    return encode_batch(specs, base_offset=base_offset), min(r.timestamp for r in records)


def _seen(records: list[Any]) -> list[tuple[int, int, bytes | None, bytes | None, list[Any]]]:
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]


@BUILDS
def test_reading_raw_bytes_is_reading_the_records(kernels: ModuleType) -> None:
    """``read_raw`` over a batch's bytes gives what ``read_records`` gives over the same records:
    items, duplicates, the numbers seen, marks and bad records (with their offsets and errors)."""
    mark_headers = [("other", b"x"), (repartition.HEADER_SHUFFLE_MARK, b"{}")]
    records = [
        Rec(b'"a"', b'{"v":1}', _seq("in:0", 4), 10),  # at or below 5, seen before: a replay
        Rec(b'"a"', b'{"v":2}', _seq("in:0", 6), 11),
        Rec(None, b"", mark_headers, 9),
        Rec(b'["b",1]', b'{"v":3}', _seq("in:1", 0), 12),
        Rec(b'"a"', b'{"v":4}', _seq("in:0", 6), 13),  # the same number again
        Rec(b'"a"', b"{bad", _seq("in:0", 7), 14),  # undecodable: not counted as seen
        Rec(b'"a"', b'{"v":5}', _seq("in:0", 7), 15),
        Rec(b'"a"', b'{"v":6}', [("other", b"x")], 16),  # no sequence header
        Rec(b'"a"', b'{"v":7}', [(repartition.HEADER_SHUFFLE_SEQ, b"12")], 17),  # no origin
        Rec(b'"a"', b'{"v":8}', [(repartition.HEADER_SHUFFLE_SEQ, b"in:0: 9")], 18),  # int() reads " 9"
        Rec(b'"a"', b'{"v":9}', [(repartition.HEADER_SHUFFLE_SEQ, b"in:0:x")], 19),  # not a number
        Rec(b'"a"', b'{"v":10}', [(repartition.HEADER_SHUFFLE_SEQ, b"in:0:")], 20),
        Rec(b'"a"', b'{"v":11}', [(repartition.HEADER_SHUFFLE_SEQ, None)], 21),  # a null header value
        Rec(b"", b'{"v":12}', _seq("in:1", 1), 22),  # an empty key reads as null
        Rec(None, None, _seq("in:1", 2), 23),
        Rec(b'"c"', b'{"v":13}', _seq("in:2", 123456789012345678901234), 24),  # beyond 18 digits
    ]
    for i, r in enumerate(records):
        r.offset = 100 + i
    data, base_ts = _section(records)

    def read(raw: bool) -> tuple[Any, ...]:
        seqs = {"in:0": 5}
        dedupe = kernels.SeqFilter(seqs, {})
        marks: list[Any] = []
        bad: list[Any] = []
        keys: dict[bytes, Any] = {}
        if raw:
            items, duplicates, end = kernels.read_raw(data, 61, len(records), 100, base_ts, dedupe, keys, decode_key,
                                                      jsonvalues.loads, SourceRecord, marks, bad)
            assert end == len(data)
        else:
            items, duplicates = kernels.read_records(records, dedupe, keys, decode_key, jsonvalues.loads, marks, bad)
        dedupe.close()
        return (items, duplicates, seqs, _seen(marks), [(r.offset, type(e), str(e)) for r, e in bad])

    got = read(True)
    assert got == read(False)
    assert got[1] == 2 and len(got[4]) == 6 and len(got[3]) == 1
    assert got[2] == {"in:0": 9, "in:1": 2, "in:2": 123456789012345678901234}


@BUILDS
def test_raw_records_decode_and_skip_as_aiokafka_reads_them(kernels: ModuleType) -> None:
    rng = random.Random(3)
    records = [Rec(None if i % 5 == 0 else f"k{i}".encode(),
                   None if i % 7 == 0 else b"v" * rng.choice([0, 3, 200, 9000]),
                   [(f"h{j}", None if j == 1 else b"x" * j) for j in range(i % 3)], 1_000 + rng.randrange(-500, 5_000))
               for i in range(60)]
    data, base_ts = _section(records, base_offset=40)
    theirs = list(DefaultRecordBatch(data))
    assert _seen(kernels.decode_raw(data, 61, len(records), 40, base_ts, SourceRecord)) == _seen(theirs)
    for skip in (0, 1, 17, 59):
        pos = kernels.skip_records(data, 61, skip)
        assert _seen(kernels.decode_raw(data, pos, 1, 40 + skip, base_ts, SourceRecord)) == _seen(theirs[skip:skip + 1])
    assert kernels.skip_records(data, 61, 60) == len(data)


@BUILDS
def test_a_record_whose_fields_overrun_it_is_a_bad_record_and_the_next_ones_are_read(kernels: ModuleType) -> None:
    """Fetched batches are walked before they get here, so this is a second line: a record whose key
    length reaches past its end is handed back whole (its bytes) with the error, and reading goes on."""
    records = [Rec(b'"a"', f'{{"v":{i}}}'.encode(), _seq("in:0", i), 5) for i in range(3)]
    data = bytearray(_section(records)[0])
    second = kernels.skip_records(bytes(data), 61, 1)
    length_size = 1
    key_len_at = second + length_size + 3  # length, attributes, timestamp delta, offset delta
    assert data[key_len_at] == 6  # zigzag(3)
    data[key_len_at] = 120  # zigzag(60): past the record's end
    bad: list[Any] = []
    dedupe = kernels.SeqFilter({}, {})
    items, duplicates, end = kernels.read_raw(bytes(data), 61, 3, 100, 5, dedupe, {}, decode_key, jsonvalues.loads,
                                              SourceRecord, [], bad)
    assert [v for _, _, v in items] == [{"v": 0}, {"v": 2}] and end == len(data)
    third = kernels.skip_records(bytes(data), second, 1)
    assert [(r.offset, r.value, type(e)) for r, e in bad] == [(101, bytes(data[second:third]), ValueError)]
