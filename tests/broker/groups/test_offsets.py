"""Offset stores: one contract for both, then durability of the file-backed store (restart, torn
tail, compaction, kill -9 of a committing process, disk errors)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import pytest

from broker.groups import (
    CommittedOffset,
    DurableOffsetStore,
    GroupCoordinator,
    MemoryOffsetStore,
    OffsetStore,
    OffsetStoreCorruptError,
    OffsetStoreError,
)
from broker.groups.offsets import SNAPSHOT_NAME, TopicPartition
from broker.protocol.kafka_codes import ErrorCode

StoreFactory = Callable[[Path], OffsetStore]


def plain(offsets: Mapping[TopicPartition, CommittedOffset]) -> dict[TopicPartition, tuple[int, str | None]]:
    """(offset, metadata) of each committed offset, without its commit and expire times."""
    return {tp: (c.offset, c.metadata) for tp, c in offsets.items()}


@pytest.fixture(params=["memory", "durable"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OffsetStore]:
    s: OffsetStore = MemoryOffsetStore() if request.param == "memory" else DurableOffsetStore(tmp_path / "groups")
    await s.open()
    yield s
    await s.close()


# ---------------------------------------------------------------------- contract (both stores)


async def test_commit_then_fetch(store: OffsetStore) -> None:
    await store.commit("g", {("t", 0): CommittedOffset(5, "meta"), ("t", 1): CommittedOffset(7, None)})
    await store.commit("g", {("t", 0): CommittedOffset(6, "")})
    assert plain(store.fetch("g")) == {("t", 0): (6, ""), ("t", 1): (7, None)}
    assert plain(store.fetch("g", [("t", 1), ("t", 2)])) == {("t", 1): (7, None)}
    assert plain(store.fetch("other")) == {}
    assert store.groups() == ["g"]


async def test_metadata_returned_unchanged(store: OffsetStore) -> None:
    odd = "ünïcødé ☃ \x00 tabs\tand\nnewlines" + "x" * 3000
    await store.commit("g", {("tôpic", 2**31 - 1): CommittedOffset(2**62, odd)})
    assert plain(store.fetch("g")) == {("tôpic", 2**31 - 1): (2**62, odd)}


async def test_delete_group(store: OffsetStore) -> None:
    await store.commit("a", {("t", 0): CommittedOffset(1, None)})
    await store.commit("b", {("t", 0): CommittedOffset(2, None)})
    await store.delete_group("a")
    assert store.groups() == ["b"] and plain(store.fetch("a")) == {}


async def test_concurrent_commits_all_land(store: OffsetStore) -> None:
    await asyncio.gather(*(store.commit(f"g{i % 5}", {("t", i): CommittedOffset(i, str(i))}) for i in range(200)))
    for i in range(200):
        assert plain(store.fetch(f"g{i % 5}", [("t", i)])) == {("t", i): (i, str(i))}


# ---------------------------------------------------------------------- durable store


async def reopen(directory: Path, **kw: int) -> DurableOffsetStore:
    s = DurableOffsetStore(directory, **kw)
    await s.open()
    return s


async def test_offsets_survive_restart(tmp_path: Path) -> None:
    s = await reopen(tmp_path)
    await s.commit("g", {("t", 0): CommittedOffset(10, "a"), ("t", 1): CommittedOffset(11, None)})
    await s.commit("h", {("u", 3): CommittedOffset(1, "")})
    await s.delete_group("h")
    await s.commit("g", {("t", 0): CommittedOffset(12, "b")})
    await s.close()
    s2 = await reopen(tmp_path)
    assert plain(s2.fetch("g")) == {("t", 0): (12, "b"), ("t", 1): (11, None)}
    assert s2.groups() == ["g"]
    await s2.commit("g", {("t", 1): CommittedOffset(13, None)})
    await s2.close()
    s3 = await reopen(tmp_path)
    assert plain(s3.fetch("g")) == {("t", 0): (12, "b"), ("t", 1): (13, None)}
    await s3.close()


async def test_coordinator_offsets_survive_restart(tmp_path: Path) -> None:
    c = GroupCoordinator(DurableOffsetStore(tmp_path / "groups"))
    await c.start()
    assert await c.commit_offsets("g", -1, "", {("t", 0): (42, "m")}) == {("t", 0): ErrorCode.NONE}
    await c.stop()
    c2 = GroupCoordinator(DurableOffsetStore(tmp_path / "groups"))
    await c2.start()
    try:
        assert c2.fetch_offsets("g", [("t", 0)]) == {("t", 0): (42, "m")}
        assert c2.list_groups() == [("g", "", "Empty")]
    finally:
        await c2.stop()


async def test_torn_tail_is_ignored_with_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = await reopen(tmp_path)
    await s.commit("g", {("t", 0): CommittedOffset(1, None)})
    await s.commit("g", {("t", 0): CommittedOffset(2, None)})
    await s.close()
    (log_file,) = tmp_path.glob("offsets-*.log")
    data = log_file.read_bytes()
    log_file.write_bytes(data[:-3])  # the last record lost its end in a crash
    with caplog.at_level(logging.WARNING, logger="broker.groups.offsets"):
        s2 = await reopen(tmp_path)
    assert plain(s2.fetch("g")) == {("t", 0): (1, None)}
    assert any("torn record" in r.getMessage() for r in caplog.records)
    # The store keeps working after recovery, and the next restart is clean.
    await s2.commit("g", {("t", 0): CommittedOffset(3, None)})
    await s2.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="broker.groups.offsets"):
        s3 = await reopen(tmp_path)
    assert plain(s3.fetch("g")) == {("t", 0): (3, None)}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    await s3.close()


async def test_damaged_snapshot_is_an_error_not_silent_loss(tmp_path: Path) -> None:
    s = await reopen(tmp_path)
    await s.commit("g", {("t", 0): CommittedOffset(1, None)})
    await s.close()
    await (await reopen(tmp_path)).close()  # compacts into the snapshot
    snap = tmp_path / SNAPSHOT_NAME
    data = bytearray(snap.read_bytes())
    data[-10] ^= 0xFF
    snap.write_bytes(bytes(data))
    with pytest.raises(OffsetStoreCorruptError):
        await reopen(tmp_path)


async def test_compaction_at_size_threshold(tmp_path: Path) -> None:
    s = await reopen(tmp_path, compact_bytes=2_000)
    for i in range(300):
        await s.commit("g", {("t", i % 7): CommittedOffset(i, f"m{i}")})
    logs = sorted(p.name for p in tmp_path.glob("offsets-*.log"))
    assert len(logs) == 1 and logs[0] != "offsets-000000000001.log", logs
    assert (tmp_path / SNAPSHOT_NAME).exists()
    assert (tmp_path / logs[0]).stat().st_size < 2_000 + 200
    expected = {("t", p): max(i for i in range(300) if i % 7 == p) for p in range(7)}
    await s.close()
    s2 = await reopen(tmp_path)
    assert {tp: c.offset for tp, c in s2.fetch("g").items()} == expected
    assert s2.fetch("g", [("t", 0)])[("t", 0)].metadata == f"m{expected[('t', 0)]}"
    await s2.close()


async def test_fsync_failure_fails_the_commit_and_poisons_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = GroupCoordinator(DurableOffsetStore(tmp_path))
    await c.start()
    await c.commit_offsets("g", -1, "", {("t", 0): (1, None)})

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("broker.groups.offsets.os.fsync", broken_fsync)
    assert await c.commit_offsets("g", -1, "", {("t", 0): (2, None)}) == {("t", 0): ErrorCode.COORDINATOR_NOT_AVAILABLE}
    monkeypatch.undo()
    # Even with a working disk again, the store refuses: its log may hold a record of unknown fate.
    with pytest.raises(OffsetStoreError):
        await c.offsets.commit("g", {("t", 0): CommittedOffset(3, None)})
    assert c.fetch_offsets("g", [("t", 0)]) == {("t", 0): (1, None)}
    await c.stop()


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from broker.groups import CommittedOffset, DurableOffsetStore

    async def main(directory):
        store = DurableOffsetStore(directory, compact_bytes=4096)
        await store.open()
        n = 0
        while True:
            n += 1
            async def one(g, p):
                await store.commit(f"g{g}", {("t", p): CommittedOffset(n, f"meta-{n}")})
                sys.stdout.write(f"{g} {p} {n}\\n")
            await asyncio.gather(*(one(g, p) for g in range(3) for p in range(4)))
            sys.stdout.flush()

    asyncio.run(main(sys.argv[1]))
    """
)


def test_acknowledged_commits_survive_kill_9(tmp_path: Path) -> None:
    directory = tmp_path / "groups"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    for round_no in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory)], stdout=subprocess.PIPE, text=True, env=env
        )
        assert child.stdout is not None
        acked: dict[tuple[str, int], int] = {}
        lines = 0
        while lines < 600 + round_no * 137:
            line = child.stdout.readline()
            assert line, f"child exited early with {child.poll()}"
            g, p, n = line.split()
            acked[(f"g{g}", int(p))] = int(n)
            lines += 1
        child.send_signal(signal.SIGKILL)
        # Acks already written to the pipe before the kill count too.
        for line in child.stdout:
            g, p, n = line.split()
            acked[(f"g{g}", int(p))] = int(n)
        child.wait(timeout=10)
        assert child.returncode == -signal.SIGKILL

        async def check(acked: dict[tuple[str, int], int]) -> None:
            store = DurableOffsetStore(directory, compact_bytes=4096)
            await store.open()
            try:
                for (group, p), n in acked.items():
                    got = store.fetch(group, [("t", p)])[("t", p)]
                    assert got.offset >= n, (group, p, got, n)
                    assert got.metadata == f"meta-{got.offset}"
            finally:
                await store.close()

        asyncio.run(check(acked))
