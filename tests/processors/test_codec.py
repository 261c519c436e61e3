"""The processor's record decoder against the broker's, and checkpoint encoding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import CorruptRecordError
from broker.protocol.records import Compression, RecordSpec, decode_all, encode_batch
from processors.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint, latest_per_partition
from processors.errors import CheckpointError
from processors.fastdecode import decode_from

blobs = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=10), blobs), max_size=3).map(tuple)
specs = st.builds(RecordSpec, value=blobs, key=blobs, headers=headers,
                  timestamp=st.integers(min_value=0, max_value=2**41))


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(specs, min_size=1, max_size=20), min_size=1, max_size=4),
       compression=st.sampled_from([Compression.NONE, Compression.NONE, Compression.GZIP, Compression.ZSTD]),
       skip=st.integers(min_value=0, max_value=30))
def test_fast_decoder_matches_the_broker_decoder(
    batches: list[list[RecordSpec]], compression: Compression, skip: int
) -> None:
    data = b""
    base = 0
    for specs_ in batches:
        data += encode_batch(specs_, base_offset=base, compression=compression)
        base += len(specs_)
    want = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_all(data) if r.offset >= skip]
    got = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in decode_from(data, skip)]
    assert got == want


def test_fast_decoder_rejects_a_truncated_record_body() -> None:
    batch = bytearray(encode_batch([RecordSpec(b"x" * 50, b"k")]))
    # claim a longer value than the record holds (the log checked the CRC on append; this is a bug guard)
    pos = batch.index(b"x" * 50) - 1
    batch[pos] = 0x7E  # value length 63
    with pytest.raises(CorruptRecordError):
        decode_from(bytes(batch), 0)


def test_control_batches_are_skipped() -> None:
    import struct

    import crc32c

    control = bytearray(encode_batch([RecordSpec(b"\x00\x00\x00\x00\x00\x00", b"\x00\x00\x00\x00")], base_offset=0))
    attrs = struct.unpack_from(">h", control, 21)[0] | 0x20 | 0x10
    struct.pack_into(">h", control, 21, attrs)
    struct.pack_into(">I", control, 17, crc32c.crc32c(bytes(control[21:])))
    data = bytes(control) + encode_batch([RecordSpec(b"v")], base_offset=1)
    assert [(r.offset, r.value) for r in decode_from(data, 0)] == [(1, b"v")]


def test_checkpoints_round_trip_and_the_newest_wins_per_partition() -> None:
    a = Checkpoint("p", 1, 100, {("t", 0): (10, 90, -1), ("t", 1): (5, 80, 70)},
                   {"3": [["k0", ["t", 0], {"w": [[0, [10, [1.0, 1], False, 1, 0]]], "s": []}],
                          ["k1", ["t", 1], {"w": [], "s": []}]]})
    b = Checkpoint("p", 2, 120, {("t", 0): (20, 110, 100)}, {"3": [["k0", ["t", 0], {"w": [], "s": []}]]})
    decoded = [decode_checkpoint(encode_checkpoint(cp)) for cp in (a, b)]
    restore = latest_per_partition(decoded)
    assert restore[("t", 0)].offset == 20 and restore[("t", 0)].ops == {"3": [["k0", ["t", 0], {"w": [], "s": []}]]}
    assert restore[("t", 0)].heartbeat == 100 and restore[("t", 1)].heartbeat == 70
    assert restore[("t", 1)].offset == 5 and [e[0] for e in restore[("t", 1)].ops["3"]] == ["k1"]
    with pytest.raises(CheckpointError):
        decode_checkpoint(b"\x93garbage")
    with pytest.raises(CheckpointError):
        encode_checkpoint(Checkpoint("p", 1, 1, {}, {"1": [[object(), None, None]]}))


def big_checkpoint(keys: int, created: int = 1) -> Checkpoint:
    state = {"w": [[0, [10_000, [1.0, 1], False, 1, 0]]], "s": []}
    return Checkpoint("p", created, 1, {("t", 0): (5, 1, -1)},
                      {"1": [[f"sensor-{i:06d}", ["t", 0], state] for i in range(keys)]})


def test_large_checkpoints_are_chunked_and_count_only_when_complete() -> None:
    from processors.checkpoint import CHUNK_BYTES, checkpoint_records, checkpoints_from_records

    data = encode_checkpoint(big_checkpoint(30_000))
    assert len(data) > 2 * CHUNK_BYTES
    values = checkpoint_records(data)
    assert len(values) >= 3 and all(len(v) <= CHUNK_BYTES + 100 for v in values)
    small = encode_checkpoint(Checkpoint("p", 0, 0, {("t", 0): (1, 1, -1)}, {}))
    # a crash before the last chunk was written: the earlier checkpoint stays in force
    assert [c.created for c in checkpoints_from_records([small, *values[:-1]])] == [0]
    done = checkpoints_from_records([small, *values])
    assert [c.created for c in done] == [0, 1] and len(done[1].ops["1"]) == 30_000


async def test_restores_read_checkpoints_from_the_tail_until_every_partition_is_covered() -> None:
    from broker.log.memory import MemoryLogStore
    from processors.checkpoint import LogCheckpointStore

    store = LogCheckpointStore(MemoryLogStore(), "tail")
    await store.save(encode_checkpoint(Checkpoint("tail", 0, 0, {("t", 1): (7, 1, -1)}, {})))  # the only one for p1
    for i in range(1, 1_000):
        await store.save(encode_checkpoint(Checkpoint("tail", i, i, {("t", 0): (i, i, -1)}, {})))
    recent = await store.load([("t", 0)])
    assert 0 < len(recent) <= 64 and recent[-1].created == 999
    both = latest_per_partition(await store.load([("t", 0), ("t", 1)]))
    assert both[("t", 0)].offset == 999 and both[("t", 1)].offset == 7
    assert len(await store.load()) == 1_000
