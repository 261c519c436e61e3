"""broker.log.files: a batch written from its parts lands whole, even when the kernel takes part of it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.log import files
from broker.log.files import write_all_parts


def test_parts_are_written_in_order(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        write_all_parts(fd, (b"\x00" * 8, memoryview(b"abcdef")[2:], bytearray(b"xyz")))
        write_all_parts(fd, (b"!",))
    finally:
        os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"\x00" * 8 + b"cdef" + b"xyz" + b"!"


@pytest.mark.parametrize("taken", [0, 3, 8, 9, 11])
def test_a_short_writev_is_finished_part_by_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    """A regular file may take fewer bytes than offered (ENOSPC on the way, a signal): the rest follows."""

    def short_writev(fd: int, buffers: Sequence[bytes | bytearray | memoryview]) -> int:
        return os.write(fd, b"".join(bytes(b) for b in buffers)[:taken])  # the kernel took only ``taken`` bytes

    monkeypatch.setattr(files.os, "writev", short_writev)
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        write_all_parts(fd, (b"01234567", b"89", b"abcdef"))
    finally:
        os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"0123456789abcdef"
