"""The processor's record decoder against the broker's, and checkpoint encoding."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import CorruptRecordError
from broker.protocol.records import Compression, RecordSpec, decode_all, encode_batch
from processors.checkpoint import (
    CHUNK_BYTES,
    Checkpoint,
    CheckpointCodec,
    CheckpointRecord,
    PartitionState,
    load_from_tail,
)
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


def state(*windows: int) -> dict[str, Any]:
    return {"w": [[w, [w + 10, [1.0, 1], False, 1, 0]] for w in windows], "s": []}


def test_checkpoints_round_trip_per_partition_and_the_newest_wins() -> None:
    codec = CheckpointCodec()
    parts = {("t", 0): PartitionState(10, 90, -1, 100, 5), ("t", 1): PartitionState(5, 80, 70, 100, 0)}
    entries: list[list[Any]] = [["k0", ["t", 0], state(0)], ["k1", ["t", 1], state()], ["orphan", None, state()]]
    a = Checkpoint("p", 1, 100, parts, {"3": entries})
    b = Checkpoint("p", 2, 120, {("t", 0): PartitionState(20, 110, 100, 120, 0)}, {"3": [["k0", ["t", 0], state()]]})
    records = codec.encode(a) + codec.encode(b)
    assert [k for k, _ in records] == [b"t:0", b"t:1", b"t:0"]  # keyed by source partition: compaction keeps the newest
    restore = CheckpointCodec().decode(records)
    assert restore[("t", 0)].offset == 20 and restore[("t", 0)].ops == {"3": [["k0", ["t", 0], state()]]}
    assert restore[("t", 0)].state == PartitionState(20, 110, 100, 120, 0) and restore[("t", 0)].created == 2
    assert restore[("t", 1)].state == PartitionState(5, 80, 70, 100, 0)
    assert [e[0] for e in restore[("t", 1)].ops["3"]] == ["k1"]  # each partition carries only its own keys
    with pytest.raises(CheckpointError):
        codec.decode([(b"t:0", b"\x93garbage")])
    with pytest.raises(CheckpointError):
        codec.encode(Checkpoint("p", 1, 1, {("t", 0): PartitionState(1)}, {"1": [[object(), ["t", 0], None]]}))


def test_version_1_checkpoints_are_still_restored() -> None:
    doc = {"v": 1, "pipeline": "p", "created": 7, "watermark": 500,
           "parts": [["t", 0, 10, 600, -1], ["t", 1, 4, 550, 520]],
           "ops": {"1": [["k0", ["t", 0], state(0)], ["k1", ["t", 1], state(10)]]}}
    restore = CheckpointCodec().decode([(b"", msgpack.packb(doc, use_bin_type=True))])
    assert restore[("t", 0)].state == PartitionState(10, 600, -1, 500, 0)  # floor: that checkpoint's watermark
    assert restore[("t", 1)].ops == {"1": [["k1", ["t", 1], state(10)]]}


def big_checkpoint(keys: int, created: int = 1, offset: int = 5) -> Checkpoint:
    return Checkpoint("p", created, 1, {("t", 0): PartitionState(offset, 1, -1, 1, 0)},
                      {"1": [[f"sensor-{i:06d}", ["t", 0], state(0)] for i in range(keys)]})


def compact(records: list[CheckpointRecord]) -> list[CheckpointRecord]:
    """Kafka's cleanup.policy=compact as a model (until Sluice's own cleaner lands): the newest
    record of every key, in log order; tombstones gone (past delete.retention.ms)."""
    newest = {key: i for i, (key, _) in enumerate(records)}
    return [r for i, r in enumerate(records) if newest[r[0]] == i and r[1] is not None]


def test_large_checkpoints_are_chunked_and_count_only_when_complete() -> None:
    codec = CheckpointCodec()
    small = codec.encode(Checkpoint("p", 0, 0, {("t", 0): PartitionState(1, 1, -1, 0, 0)}, {}))
    values = codec.encode(big_checkpoint(30_000))
    assert len(values) >= 4 and all(len(v or b"") <= CHUNK_BYTES + 100 for _, v in values)
    # a crash before the head was written: the earlier checkpoint stays in force
    assert CheckpointCodec().decode(small + values[:-1])[("t", 0)].created == 0
    done = CheckpointCodec().decode(small + values)[("t", 0)]
    assert done.created == 1 and len(done.ops["1"]) == 30_000


def test_compaction_keeps_exactly_the_newest_complete_checkpoint_even_after_a_crash_mid_write() -> None:
    codec = CheckpointCodec(chunk_bytes=4_096)  # small chunks: many of them from small states
    log: list[CheckpointRecord] = []
    for created, keys in enumerate([300, 120, 300, 5, 120]):
        log += codec.encode(big_checkpoint(keys, created, offset=created))
        restored = CheckpointCodec().decode(compact(log))[("t", 0)]
        assert (restored.created, len(restored.ops["1"])) == (created, keys)
    # the next (large) checkpoint dies after two chunks: compaction overwrites nothing it needs
    log += codec.encode(big_checkpoint(300, 99, offset=99))[:2]
    kept = compact(log)
    restored = CheckpointCodec().decode(kept)[("t", 0)]
    assert (restored.created, len(restored.ops["1"])) == (4, 120)
    # bounded: one head plus the chunks of two slots, whatever the history
    assert len(kept) <= 1 + 2 * len(CheckpointCodec(chunk_bytes=4_096).encode(big_checkpoint(300)))
    # a new writer learns the slots from what it reads, and keeps the newest checkpoint safe too
    writer = CheckpointCodec(chunk_bytes=4_096)
    writer.decode(kept)
    kept += writer.encode(big_checkpoint(300, 100, offset=100))[:3]
    assert CheckpointCodec().decode(compact(kept))[("t", 0)].created == 4


async def test_restores_read_checkpoints_from_the_tail_until_every_partition_is_covered() -> None:
    codec = CheckpointCodec()
    log = codec.encode(Checkpoint("tail", 0, 0, {("t", 1): PartitionState(7)}, {}))  # the only one for p1
    for i in range(1, 1_000):
        log += codec.encode(Checkpoint("tail", i, i, {("t", 0): PartitionState(i)}, {}))
    reads: list[int] = []

    async def read(lo: int, hi: int) -> list[CheckpointRecord]:
        reads.append(lo)
        return log[lo:hi]

    recent = await load_from_tail(read, 0, len(log), [("t", 0)], CheckpointCodec())
    assert recent[("t", 0)].offset == 999 and reads == [1_000 - 64]
    both = await load_from_tail(read, 0, len(log), [("t", 0), ("t", 1)], CheckpointCodec())
    assert both[("t", 0)].offset == 999 and both[("t", 1)].offset == 7


def test_a_compressed_bomb_is_refused_within_the_decompression_bound() -> None:
    """aiokafka's parser would decompress all of it; the broker's bounded decoder stops at its limit."""
    import struct

    import cramjam
    import crc32c

    payload = bytes(cramjam.zstd.compress(bytes(1 << 20))) * 128  # 128 MiB of zeros in ~7 KiB
    after_crc = struct.pack(">hiqqqhii", int(Compression.ZSTD), 0, 0, 0, -1, -1, -1, 1) + payload
    batch = struct.pack(">qiibI", 0, 49 + len(payload), 0, 2, crc32c.crc32c(after_crc)) + after_crc
    with pytest.raises(CorruptRecordError, match="decompress to more than"):
        decode_from(batch, 0)
