"""The sparse index rules, fed batch by batch without any file."""

from __future__ import annotations

import random

from broker.log.index import OFFSET_ENTRY, TIME_ENTRY, SegmentIndex


def build(sizes_and_ts: list[tuple[int, int]], interval: int) -> tuple[SegmentIndex, list[tuple[int, int, int]]]:
    """Index batches of one record each; returns the index and (position, offset, max_ts) per batch."""
    index = SegmentIndex(interval)
    batches = []
    pos = 0
    for rel, (size, ts) in enumerate(sizes_and_ts):
        index.on_batch(pos, rel, rel, ts, size)
        batches.append((pos, rel, ts))
        pos += size
    return index, batches


def test_entries_are_spaced_by_the_interval_and_lookups_land_before_the_target() -> None:
    rng = random.Random(7)
    data = [(rng.randint(70, 400), rng.randint(0, 10_000)) for _ in range(500)]
    index, batches = build(data, interval=1000)
    assert 0 < len(index.positions) < len(batches)
    gaps = [b - a for a, b in zip(index.positions, index.positions[1:], strict=False)]
    assert all(1000 <= g < 1000 + 400 for g in gaps)
    for pos, rel, _ in batches:
        entry_rel, entry_pos = index.position_for(rel)
        assert entry_rel <= rel and entry_pos <= pos
        assert pos - entry_pos < 1000 + 400  # a lookup scans at most about one interval


def test_time_scan_start_never_skips_a_matching_batch() -> None:
    rng = random.Random(3)
    data = [(rng.randint(70, 200), rng.randint(0, 5_000)) for _ in range(400)]
    index, batches = build(data, interval=500)
    index.finalize()
    assert index.time_stamps[-1] == max(ts for _, _, ts in batches)
    for target in range(-1, 5_002, 37):
        start = index.time_scan_start(target)
        expected = next((rel for _, rel, ts in batches if ts >= target), None)
        if expected is not None:
            assert start <= expected
        assert all(ts < target for _, rel, ts in batches if rel < start)


def test_round_trip_through_bytes_and_rejection_of_inconsistent_files() -> None:
    index, batches = build([(300, i * 10) for i in range(100)], interval=1000)
    index.finalize()
    raw_index, raw_times = index.to_bytes()
    size = sum(300 for _ in batches)
    loaded = SegmentIndex.from_bytes(1000, raw_index, raw_times, size=size, rel_limit=100)
    assert loaded is not None
    assert (loaded.rel_offsets, loaded.positions) == (index.rel_offsets, index.positions)
    assert loaded.max_timestamp == 990
    # torn entry, entries out of order, an entry past the end of the segment
    assert SegmentIndex.from_bytes(1000, raw_index[:-3], raw_times, size=size, rel_limit=100) is None
    swapped = raw_index[8:16] + raw_index[:8] + raw_index[16:]
    assert SegmentIndex.from_bytes(1000, swapped, raw_times, size=size, rel_limit=100) is None
    past_end = raw_index + OFFSET_ENTRY.pack(99, size + 5)
    assert SegmentIndex.from_bytes(1000, past_end, raw_times, size=size, rel_limit=100) is None
    backwards = raw_times + TIME_ENTRY.pack(5, 99)
    assert SegmentIndex.from_bytes(1000, raw_index, backwards, size=size, rel_limit=100) is None


def test_truncated_keeps_only_entries_before_the_position() -> None:
    index, batches = build([(250, i) for i in range(80)], interval=1000)
    pos, rel, _ = batches[50]
    cut = index.truncated(pos, rel, max_timestamp=49)
    assert cut.positions and all(p < pos for p in cut.positions)
    assert all(r <= rel for r in cut.time_rels)
    assert cut.max_timestamp == 49 and cut.next_rel == rel
    # continuing from the cut gives the same entries as the uninterrupted index
    for p, r, ts in batches[50:]:
        cut.on_batch(p, r, r, ts, 250)
    assert (cut.rel_offsets, cut.positions) == (index.rel_offsets, index.positions)
    assert (cut.time_stamps, cut.time_rels) == (index.time_stamps, index.time_rels)
